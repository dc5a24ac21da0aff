"""The container parts of the agent's wire format: how a job with an ``image`` runs
(``JobSubmission.container``) and what the agent reports about it (``JobState.container``,
``JobState.image_pull_progress``). Plain dataclasses with ``to_dict()``/``from_dict()``, as in
:mod:`corral.agent.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import ProtocolError, _bool, _choice, _int, _num, _obj, _str, _str_list

NETWORK_MODES = ("host", "bridge")


@dataclass
class InstanceMount:
    """A directory of the host mounted into the job's container (``/host/path:/container/path``)."""

    instance_path: str
    path: str
    optional: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"instance_path": self.instance_path, "path": self.path, "optional": self.optional}

    @classmethod
    def from_dict(cls, data: Any) -> InstanceMount:
        w = "ContainerSpec.volumes[]"
        d = _obj(data, w)
        for key in ("instance_path", "path"):
            if not _str(d, key, w, nonempty=True).startswith("/"):
                raise ProtocolError(f"{w}.{key}: must be an absolute path, got {d[key]!r}")
        return cls(d["instance_path"], d["path"], _bool(d, "optional", w))


@dataclass
class ContainerSpec:
    """How a job with an ``image`` runs (``JobSubmission.container``). ``gpus``: 0 none, -1 all of the
    host's GPUs, N > 0 that many (the agent picks free ones). ``cpus``/``memory_mib`` are limits (set
    when the job holds only some blocks of the instance). ``registry_*`` authenticate the pull.
    ``docker_in_docker``: the run set ``docker: true`` (the image is the docker-in-docker one)."""

    privileged: bool = False
    docker_in_docker: bool = False
    shm_size_mib: int | None = None
    network_mode: str = "host"
    ports: list[int] = field(default_factory=list)
    volumes: list[InstanceMount] = field(default_factory=list)
    gpus: int = 0
    cpus: float | None = None
    memory_mib: int | None = None
    registry_username: str | None = None
    registry_password: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "privileged": self.privileged,
            "docker_in_docker": self.docker_in_docker,
            "shm_size_mib": self.shm_size_mib,
            "network_mode": self.network_mode,
            "ports": list(self.ports),
            "volumes": [v.to_dict() for v in self.volumes],
            "gpus": self.gpus,
            "cpus": self.cpus,
            "memory_mib": self.memory_mib,
            "registry_username": self.registry_username,
            "registry_password": self.registry_password,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ContainerSpec:
        w = "ContainerSpec"
        d = _obj(data, w)
        ports = d.get("ports") or []
        if not isinstance(ports, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports
        ):
            raise ProtocolError(f"{w}.ports: expected a list of port numbers (1-65535)")
        volumes = d.get("volumes") or []
        if not isinstance(volumes, list):
            raise ProtocolError(f"{w}.volumes: expected a list")
        out = cls(
            privileged=_bool(d, "privileged", w),
            docker_in_docker=_bool(d, "docker_in_docker", w),
            shm_size_mib=_int(d, "shm_size_mib", w, optional=True, minimum=1),
            network_mode=_choice(d, "network_mode", w, NETWORK_MODES) if d.get("network_mode") else "host",
            ports=list(ports),
            volumes=[InstanceMount.from_dict(v) for v in volumes],
            gpus=_int(d, "gpus", w, optional=True, minimum=-1) or 0,
            cpus=_num(d, "cpus", w, optional=True),
            memory_mib=_int(d, "memory_mib", w, optional=True, minimum=4),
            registry_username=_str(d, "registry_username", w, optional=True),
            registry_password=_str(d, "registry_password", w, optional=True),
        )
        if out.cpus is not None and out.cpus <= 0:
            raise ProtocolError(f"{w}.cpus: must be positive, got {out.cpus}")
        return out


@dataclass
class ImagePullProgress:
    """dstack's ``ImagePullProgress``: bytes of the pull so far (cached layers not counted)."""

    downloaded_bytes: int = 0
    extracted_bytes: int = 0
    total_bytes: int = 0
    is_total_bytes_final: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "downloaded_bytes": self.downloaded_bytes,
            "extracted_bytes": self.extracted_bytes,
            "total_bytes": self.total_bytes,
            "is_total_bytes_final": self.is_total_bytes_final,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ImagePullProgress:
        w = "JobState.image_pull_progress"
        d = _obj(data, w)
        return cls(
            downloaded_bytes=_int(d, "downloaded_bytes", w, minimum=0),
            extracted_bytes=_int(d, "extracted_bytes", w, minimum=0),
            total_bytes=_int(d, "total_bytes", w, minimum=0),
            is_total_bytes_final=_bool(d, "is_total_bytes_final", w),
        )


@dataclass
class ContainerInfo:
    """The container of a job with an ``image`` (``JobState.container``). ``ports`` maps container
    ports to host ports (the same numbers with host networking)."""

    id: str
    name: str
    network_mode: str = "host"
    ports: dict[int, int] = field(default_factory=dict)
    gpu_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "network_mode": self.network_mode,
            "ports": [{"container": c, "host": h} for c, h in sorted(self.ports.items())],
            "gpu_ids": list(self.gpu_ids),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ContainerInfo:
        w = "JobState.container"
        d = _obj(data, w)
        ports = {}
        for p in d.get("ports") or []:
            p = _obj(p, w + ".ports[]")
            ports[_int(p, "container", w + ".ports[]", minimum=1)] = _int(p, "host", w + ".ports[]", minimum=1)
        return cls(
            id=_str(d, "id", w, nonempty=True),
            name=_str(d, "name", w),
            network_mode=_choice(d, "network_mode", w, NETWORK_MODES),
            ports=ports,
            gpu_ids=_str_list(d, "gpu_ids", w) if d.get("gpu_ids") is not None else [],
        )
