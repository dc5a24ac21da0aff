"""The ``type: slurm`` backend block with dstack 0.22.5's fields (``core/backends/slurm/models.py``): ``clusters``,
each with ``name`` (the region), ``hostname``, ``port``, ``user`` and ``private_key`` (``path`` or ``content``) of
the login node, ``gpu_partitions`` (``[{gpu, partitions}]``: the GPU model of each GPU partition's nodes) and
``cpu_partitions`` (default: every partition not in ``gpu_partitions``).

corral's extensions, per cluster, in the server's ``config.yml`` only (dstack's models forbid them; the backends
API refuses them): ``account``, ``qos``, ``reservation``, ``time_limit`` (Slurm's time format) and
``sbatch_options`` (further sbatch options, name to value; those corral sets itself are refused when the backend
is configured).

Pydantic only (a ``config`` module); the Slurm backend reads the stored, validated document.
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from corral.domain.gpu_models import parse_gpu_model

#: corral's per-cluster fields beyond dstack's (``config.yml`` only).
EXTENSIONS = ("account", "qos", "reservation", "time_limit", "sbatch_options")
#: The fields that are credentials: never answered, sealed at rest (dstack's ``SlurmClusterConfigWithCreds``).
CREDENTIALS = ("hostname", "port", "user", "private_key")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class SlurmPrivateKey(_Strict):
    """The cluster user's key: ``content``, or a ``path`` on the server (``config.yml``: read when it is loaded)."""

    path: Optional[str] = Field(default=None, min_length=1, max_length=4096)
    content: Optional[str] = Field(default=None, min_length=1, max_length=65536)

    @model_validator(mode="after")
    def _filled(self) -> Self:
        if self.content is None:
            if self.path is None:
                raise ValueError("give the key's `content`, or the `path` of a key file on the server")
            try:
                with open(os.path.expanduser(self.path)) as f:
                    self.content = f.read()
            except OSError as e:
                raise ValueError(f"path: cannot read {self.path}: {e.strerror}") from None
        return self


class SlurmGPUPartitions(_Strict):
    gpu: str = Field(min_length=1, max_length=128)
    partitions: list[str] = Field(min_length=1, max_length=256)

    @field_validator("gpu")
    @classmethod
    def _model(cls, v: str) -> str:
        parse_gpu_model(v)
        return v


class SlurmClusterConfig(_Strict):
    name: str = Field(pattern=_NAME)
    hostname: str = Field(min_length=1, max_length=253)
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9._-]*\$?$")
    private_key: SlurmPrivateKey
    gpu_partitions: Optional[list[SlurmGPUPartitions]] = None
    cpu_partitions: Optional[list[str]] = None
    # corral's extensions (config.yml only)
    account: Optional[str] = Field(default=None, min_length=1, max_length=256, pattern=r"^[^\s]+$")
    qos: Optional[str] = Field(default=None, min_length=1, max_length=256, pattern=r"^[^\s]+$")
    reservation: Optional[str] = Field(default=None, min_length=1, max_length=256, pattern=r"^[^\s]+$")
    time_limit: Optional[str] = Field(default=None, min_length=1, max_length=32)
    sbatch_options: Optional[dict[str, Optional[str]]] = None

    @model_validator(mode="after")
    def _one_model_per_partition(self) -> Self:
        seen: dict[str, str] = {}
        for group in self.gpu_partitions or []:
            model = str(parse_gpu_model(group.gpu))
            for p in group.partitions:
                if seen.get(p, model) != model:
                    raise ValueError(
                        f"gpu_partitions: partition {p!r} is mapped to two GPU models ({seen[p]} and {model}): "
                        "a partition's nodes carry one model"
                    )
                seen[p] = model
        return self


class SlurmBackendConfig(_Strict):
    type: Literal["slurm"] = "slurm"
    clusters: list[SlurmClusterConfig] = Field(min_length=1, max_length=64)

    @field_validator("clusters")
    @classmethod
    def _unique_names(cls, v: list[SlurmClusterConfig]) -> list[SlurmClusterConfig]:
        names = [c.name for c in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"cluster names are regions and must differ: {', '.join(twice)} is given twice")
        return v
