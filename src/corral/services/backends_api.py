"""The backends API (dstack's ``routers/backends.py``): a project's cloud backends created, updated, read
and deleted, as JSON or as YAML. Only ``aws`` and ``slurm`` are managed here: ``local`` belongs to the
server's ``config.yml`` and is never accepted. Credentials are checked before anything is written (a 400
naming the field), stored sealed (:mod:`corral.services.cloud_backends`, :mod:`corral.services.slurm_backends`)
and never answered in clear: an access key shows its last four characters, a secret key none; a Slurm cluster's
login node, user and key are not answered at all (as dstack).

May import: domain, config, schemas, store, backends (through ``cloud_backends``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from corral.backends.slurm.cluster import SlurmCluster
from corral.config.aws_backend import AWSBackendConfig
from corral.context import Context
from corral.domain.records import ProjectRec
from corral.schemas.requests import BackendConfigBody
from corral.services import cloud_backends, slurm_backends
from corral.services.errors import ResourceExists, ResourceNotExists, ServiceError
from corral.store import accounts as account_store
from corral.store import project_state

CLOUD_TYPES = ("aws", "slurm")
MASK = "********"


def list_types() -> list[str]:
    """The backend types this server can run (``remote``: SSH fleets and this machine)."""
    import importlib.util

    return [*(["aws"] if importlib.util.find_spec("boto3") is not None else []), "remote", "slurm"]


def _refuse(kind: object) -> ServiceError:
    return ServiceError(
        f"Backend type {kind!r} cannot be managed through the API: corral's cloud backends are "
        f"{', '.join(CLOUD_TYPES)} (the local backend is set in the server's config.yml)"
    )


def _parse(body: BackendConfigBody) -> dict[str, Any]:
    """The body's backend configuration checked field by field for its ``type``, as stored (no ``None``s)."""
    if body.type not in CLOUD_TYPES:
        raise _refuse(body.type)
    if body.type == "slurm":
        return slurm_backends.parse({**(body.model_extra or {}), "type": body.type}, from_api=True)
    try:
        return AWSBackendConfig.model_validate({**(body.model_extra or {}), "type": body.type}).model_dump(
            exclude_none=True
        )
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ServiceError(f"Invalid aws backend configuration: {problems}") from None


def redacted(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored backend as answered: no credential in clear (nor sealed)."""
    if doc.get("type") == "slurm":
        return slurm_backends.redacted(doc)
    out = {k: v for k, v in doc.items() if k != "creds"}
    creds = doc.get("creds") or {}
    if creds.get("type") == "access_key":
        out["creds"] = {"type": "access_key", "access_key": MASK, "secret_key": MASK}
    else:
        out["creds"] = {"type": creds.get("type") or "default"}
    return out


def _find(project: ProjectRec, kind: str) -> dict[str, Any] | None:
    return next((dict(b) for b in project.backends if b.get("type") == kind), None)


async def _fresh(ctx: Context, project: ProjectRec) -> ProjectRec:
    """The project as stored now (a route's record may come from a cache of authorisations)."""
    async with ctx.db.read() as conn:
        return await account_store.get_project(conn, project.name) or project


async def _save(ctx: Context, project: ProjectRec, backends: list[dict[str, Any]]) -> None:
    async with ctx.db.write() as conn:
        await account_store.set_project_backends(conn, project.id, json.dumps(backends))
    ctx.wakeups.wake("scheduler")


async def create(ctx: Context, project: ProjectRec, body: BackendConfigBody) -> dict[str, Any]:
    doc = _parse(body)
    project = await _fresh(ctx, project)
    if _find(project, doc["type"]) is not None:
        raise ResourceExists(f"Backend {doc['type']} already exists")
    stored, clusters = await _checked(ctx, project, doc)
    await _save(ctx, project, [*project.backends, stored])
    if doc["type"] == "slurm":
        await slurm_backends.register(ctx.slurm, project.name, clusters)
    return redacted(stored)


async def update(ctx: Context, project: ProjectRec, body: BackendConfigBody) -> dict[str, Any]:
    doc = _parse(body)
    project = await _fresh(ctx, project)
    if _find(project, doc["type"]) is None:
        raise ResourceNotExists(f"Backend {doc['type']} does not exist")
    stored, clusters = await _checked(ctx, project, doc)
    await _save(ctx, project, [stored if b.get("type") == doc["type"] else dict(b) for b in project.backends])
    if doc["type"] == "slurm":
        await slurm_backends.register(ctx.slurm, project.name, clusters)
    return redacted(stored)


async def _checked(ctx: Context, project: ProjectRec, doc: dict[str, Any]) -> tuple[dict[str, Any], list[SlurmCluster]]:
    """``doc`` checked against its provider (a 400 naming the field when it does not work), as stored, and a
    slurm backend's clusters (connected by the check: the Slurm backend takes them over)."""
    if doc["type"] == "slurm":
        clusters = await slurm_backends.check(ctx.slurm, project.name, doc)
        return slurm_backends.sealed(ctx.cipher(), doc), list(clusters)
    await cloud_backends.check_aws(doc)
    return cloud_backends.sealed(ctx.cipher(), doc), []


async def delete(ctx: Context, project: ProjectRec, names: list[str]) -> None:
    """Delete cloud backends; one with live instances is refused (they would be left running)."""
    project = await _fresh(ctx, project)
    for name in names:
        if name not in CLOUD_TYPES:
            raise ServiceError(f"Backend {name!r} cannot be deleted through the API (corral's: aws, slurm)")
        if _find(project, name) is None:
            raise ResourceNotExists(f"Backend {name} does not exist")
    async with ctx.db.read() as conn:
        for name in names:
            live = await project_state.live_instances_on(conn, project.id, name)
            if live:
                raise ServiceError(
                    f"Backend {name} has {live} instance(s) that are not terminated: delete its fleets first"
                )
    await _save(ctx, project, [dict(b) for b in project.backends if b.get("type") not in names])
    if "slurm" in names:
        await slurm_backends.register(ctx.slurm, project.name, [])


async def config_info(ctx: Context, project: ProjectRec, kind: str) -> dict[str, Any]:
    project = await _fresh(ctx, project)
    doc = _find(project, kind) if kind in CLOUD_TYPES else None
    if doc is None:
        raise ResourceNotExists(f"Backend {kind} does not exist")
    return redacted(doc)


def _yaml(text: str) -> BackendConfigBody:
    """``config_yaml`` as the JSON body it stands for (a mapping with a ``type``)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ServiceError(f"config_yaml is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ServiceError("The backend configuration must be a mapping with a `type` (aws, slurm)")
    if not isinstance(data.get("type"), str):
        raise _refuse(data.get("type"))
    return BackendConfigBody.model_validate(data)


async def create_yaml(ctx: Context, project: ProjectRec, text: str) -> None:
    await create(ctx, project, _yaml(text))


async def update_yaml(ctx: Context, project: ProjectRec, text: str) -> None:
    await update(ctx, project, _yaml(text))


async def get_yaml(ctx: Context, project: ProjectRec, kind: str) -> dict[str, Any]:
    import yaml

    return {"name": kind, "config_yaml": yaml.safe_dump(await config_info(ctx, project, kind), sort_keys=False)}
