"""A Slurm cluster's configuration as the backend reads it: the stored, validated document of
``config/slurm_backend.py`` (``clusters[i]``, credentials opened) as a frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.backends.slurm.batch import SiteOptions
from corral.domain.gpu_models import GpuModel, parse_gpu_model


@dataclass(frozen=True)
class GpuPartitions:
    model: GpuModel
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class SlurmClusterConfig:
    """One cluster: dstack's fields, then corral's extensions (``config.yml`` only)."""

    name: str
    hostname: str
    user: str
    port: int = 22
    gpu_partitions: tuple[GpuPartitions, ...] = ()
    #: None: every partition not in ``gpu_partitions`` (dstack's default).
    cpu_partitions: tuple[str, ...] | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    reservation: str | None = None
    #: Further sbatch options, name (without dashes) to value (None: a flag).
    sbatch_options: tuple[tuple[str, str | None], ...] = ()

    def site_options(self) -> SiteOptions:
        """What this cluster's configuration adds to every job it runs."""
        return SiteOptions(self.account, self.qos, self.reservation, self.time_limit, self.sbatch_options)

    def gpu_model(self, partition: str) -> GpuModel | None:
        """The model of the GPUs of ``partition``'s nodes (None: not a GPU partition)."""
        return next((g.model for g in self.gpu_partitions if partition in g.partitions), None)

    def is_cpu_partition(self, partition: str, known: tuple[str, ...]) -> bool:
        """Whether CPU runs may go to ``partition`` (``known``: the cluster's partitions)."""
        if self.cpu_partitions is not None:
            return partition in self.cpu_partitions
        return partition in known and self.gpu_model(partition) is None

    def named_partitions(self) -> tuple[str, ...]:
        """Every partition the configuration names."""
        named = [p for g in self.gpu_partitions for p in g.partitions] + list(self.cpu_partitions or ())
        return tuple(dict.fromkeys(named))


def cluster_config(doc: Mapping[str, Any]) -> SlurmClusterConfig:
    """``clusters[i]`` of a stored ``type: slurm`` document (validated when it was stored)."""
    cpu = doc.get("cpu_partitions")
    return SlurmClusterConfig(
        name=str(doc["name"]),
        hostname=str(doc["hostname"]),
        user=str(doc["user"]),
        port=int(doc.get("port") or 22),
        gpu_partitions=tuple(
            GpuPartitions(parse_gpu_model(str(g["gpu"])), tuple(str(p) for p in g["partitions"]))
            for g in doc.get("gpu_partitions") or ()
        ),
        cpu_partitions=tuple(str(p) for p in cpu) if cpu is not None else None,
        account=doc.get("account"),
        qos=doc.get("qos"),
        time_limit=doc.get("time_limit"),
        reservation=doc.get("reservation"),
        sbatch_options=tuple(
            (str(k), None if v is None else str(v)) for k, v in (doc.get("sbatch_options") or {}).items()
        ),
    )
