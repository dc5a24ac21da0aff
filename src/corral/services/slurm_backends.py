"""A project's ``type: slurm`` backend: its document parsed (dstack's fields; corral's extensions only from the
server's ``config.yml``), checked against each cluster before anything is written (the login node reached with the
key, ``scontrol ping``, the partitions named, the site options; a 400 naming the field), stored with its
credentials sealed (``hostname``, ``user`` and the key; dstack counts ``port`` too, which is never answered either),
answered without them (dstack's ``SlurmClusterConfig``: ``name``, ``gpu_partitions``, ``cpu_partitions``), and
its clusters handed to the Slurm backend's registry.

May import: what ``corral.services`` may.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from corral.backends.slurm import batch
from corral.backends.slurm.cluster import SlurmCluster, SlurmConfigError, check_cluster
from corral.backends.slurm.model import cluster_config
from corral.backends.slurm.registry import SlurmRegistry
from corral.config.slurm_backend import EXTENSIONS, SlurmBackendConfig
from corral.services.cloud_backends import BackendInvalid
from corral.services.errors import ServiceError
from corral.store import accounts as account_store
from corral.store.db import Database
from corral.store.encryption import Cipher, open_sealed, seal

log = logging.getLogger("corral.slurm")

#: The string credentials sealed at rest, per cluster (the key is ``private_key.content``).
SEALED = ("hostname", "user")


def _where(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse(data: Mapping[str, Any], from_api: bool) -> dict[str, Any]:
    """``data`` checked field by field, as stored (no ``None``s; the key's ``content`` read from its ``path``).
    From the API, corral's extensions are refused (they belong to the server's ``config.yml``)."""
    if from_api:
        for i, c in enumerate(data.get("clusters") or []):
            if not isinstance(c, Mapping):
                continue
            given = [k for k in EXTENSIONS if k in c]
            if given:
                raise ServiceError(
                    f"Invalid slurm backend configuration: clusters[{i}].{given[0]}: corral's extensions "
                    f"({', '.join(EXTENSIONS)}) are set in the server's config.yml only"
                )
            key = c.get("private_key")
            if isinstance(key, Mapping) and key.get("path") and not key.get("content"):
                raise ServiceError(
                    f"Invalid slurm backend configuration: clusters[{i}].private_key.path: a path names a file on "
                    "the server (config.yml only); give the key itself as private_key.content"
                )
    try:
        doc = SlurmBackendConfig.model_validate(dict(data)).model_dump(exclude_none=True)
    except ValidationError as e:
        problems = "; ".join(f"{_where(err['loc'])}: {err['msg']}" for err in e.errors())
        raise ServiceError(f"Invalid slurm backend configuration: {problems}") from None
    for i, c in enumerate(doc["clusters"]):
        try:
            batch.check_sbatch_options(c.get("sbatch_options") or {})
            if c.get("time_limit") is not None:
                batch.check_time_limit(c["time_limit"])
        except ValueError as e:
            raise ServiceError(f"Invalid slurm backend configuration: clusters[{i}].{e}") from None
    return doc


def clusters_of(doc: Mapping[str, Any]) -> list[SlurmCluster]:
    """The clusters of a document with its credentials in clear (not connected yet)."""
    return [SlurmCluster(cluster_config(c), c["private_key"]["content"]) for c in doc["clusters"]]


async def check(registry: SlurmRegistry, project: str, doc: Mapping[str, Any]) -> list[SlurmCluster]:
    """Connect to every cluster of ``doc`` (in parallel) and check it; returns the connected clusters, or raises
    :class:`BackendInvalid` naming the field of the first one that does not work (closing them all)."""
    clusters = clusters_of(doc)
    for i, cluster in enumerate(clusters):
        why = registry.conflict(project, cluster)
        if why:
            raise BackendInvalid(f"slurm backend: clusters[{i}].name: {why}")
    results = await asyncio.gather(
        *(check_cluster(c, f"clusters[{i}]") for i, c in enumerate(clusters)), return_exceptions=True
    )
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        await asyncio.gather(*(c.aclose() for c in clusters), return_exceptions=True)
        if isinstance(failed, SlurmConfigError):
            raise BackendInvalid(f"slurm backend: {failed}")
        raise failed
    return clusters


async def register(registry: SlurmRegistry, project: str, clusters: Sequence[SlurmCluster]) -> None:
    """``project``'s clusters are now ``clusters``; the ones they replace are closed."""
    for gone in registry.set_project(project, clusters):
        await gone.aclose()


def sealed(cipher: Cipher, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` as stored: its credentials sealed."""
    out = copy.deepcopy(dict(doc))
    for c in out.get("clusters") or []:
        for k in SEALED:
            if isinstance(c.get(k), str):
                c[k] = seal(cipher, c[k])
        key = c.get("private_key") or {}
        if isinstance(key.get("content"), str):
            key["content"] = seal(cipher, key["content"])
    return out


def opened(cipher: Callable[[], Cipher], doc: Mapping[str, Any]) -> dict[str, Any]:
    """A stored ``doc`` with its credentials in clear (for the backend's own use only)."""
    out = copy.deepcopy(dict(doc))
    for c in out.get("clusters") or []:
        for k in SEALED:
            if isinstance(c.get(k), str):
                c[k] = open_sealed(cipher, c[k])
        key = c.get("private_key") or {}
        if isinstance(key.get("content"), str):
            key["content"] = open_sealed(cipher, key["content"])
    return out


def redacted(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A stored backend as answered: dstack's ``SlurmBackendConfig`` (no login node, user or key)."""
    return {
        "type": "slurm",
        "clusters": [
            {k: c[k] for k in ("name", "gpu_partitions", "cpu_partitions") if c.get(k) is not None}
            for c in doc.get("clusters") or []
        ],
    }


async def load_all(db: Database, cipher: Callable[[], Cipher], registry: SlurmRegistry) -> None:
    """Hand every project's stored slurm backend to ``registry`` (at start; not connected until used)."""
    async with db.read() as conn:
        projects = await account_store.list_projects(conn, None)
    for project in projects:
        doc = next((b for b in project.backends if b.get("type") == "slurm"), None)
        if doc is not None:
            await register(registry, project.name, clusters_of(opened(cipher, doc)))


async def first_pass(registry: SlurmRegistry, timeout: float = 15.0) -> None:
    """A first ``sinfo`` pass of every cluster (at start, so that offers are there at once) and a look for its
    container runtimes; a cluster that does not answer within ``timeout`` is logged and offers nothing until it
    does."""
    clusters = registry.clusters()
    if not clusters:
        return
    results = await asyncio.gather(*(asyncio.wait_for(_first(c), timeout) for c in clusters), return_exceptions=True)
    for cluster, result in zip(clusters, results, strict=True):
        if isinstance(result, BaseException):
            log.warning(
                "slurm cluster %s does not answer: %s",
                cluster.name,
                result or type(result).__name__,
                extra={"event": "slurm_unreachable", "cluster": cluster.name},
            )


async def _first(cluster: SlurmCluster) -> None:
    await cluster.snapshot()
    await cluster.detect_runtimes()
