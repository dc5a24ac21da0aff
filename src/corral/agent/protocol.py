"""The agent's wire format: plain dataclasses with ``to_dict()``/``from_dict()``.

Standard library only (the server side imports this module too). ``from_dict`` validates every
field and raises :class:`ProtocolError` naming the offending field, so a malformed request to the
agent or a malformed reply from it fails loudly and clearly instead of deep inside a caller.
Log messages are bytes; on the wire they travel base64-encoded (``message_b64``).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from .fields import ProtocolError as ProtocolError
from .fields import _choice, _int, _num, _obj, _str, _str_list
from .protocol_containers import ContainerInfo, ContainerSpec, ImagePullProgress, InstanceMount
from .protocol_metrics import MetricsSample, parse_samples
from .protocol_sandbox import SandboxInfo
from .volumes import NetworkMount as NetworkMount

#: Bumped on incompatible changes of this module; reported by ``GET /health``.
AGENT_PROTOCOL_VERSION = 1
#: The agent's own version (reported in ``HostInfo.agent_version`` and ``GET /health``).
AGENT_VERSION = "0.1.0"

JOB_STATES = ("pending", "running", "done", "failed", "terminated")
FINISHED_STATES = ("done", "failed", "terminated")
LOG_SOURCES = ("stdout", "stderr", "agent")
CPU_ARCHS = ("x86", "arm")


REPO_TYPES = ("remote", "local", "virtual")
REPO_EXISTS_ACTIONS = ("error", "skip")
BLOB_HASH_LEN = 64


def _list(d: dict[str, Any], key: str, what: str) -> list[Any]:
    v = d.get(key) or []
    if not isinstance(v, list):
        raise ProtocolError(f"{what}.{key}: expected a list")
    return v


def _blob_hash(d: dict[str, Any], key: str, what: str, optional: bool = False) -> Any:
    v = _str(d, key, what, optional=optional)
    if v is not None and (len(v) != BLOB_HASH_LEN or any(c not in "0123456789abcdef" for c in v)):
        raise ProtocolError(f"{what}.{key}: expected a SHA-256 hex digest (64 lowercase hex digits)")
    return v


@dataclass
class RepoCheckout:
    """The job's repo, prepared before its commands run (``JobSubmission.repo``).

    ``remote``: clone ``clone_url`` (``branch``, then ``commit``) into ``repo_dir`` and apply the diff in
    blob ``code_hash`` if any; ``local``/``virtual``: unpack the tar archive in blob ``code_hash``.
    ``repo_dir`` is the path the job spec gives (relative to the working dir, absolute, or ``~``).
    ``oauth_token``/``private_key`` are used for the clone only and never written to the job's files.
    """

    repo_type: str
    repo_dir: str = "."
    code_hash: str | None = None
    clone_url: str | None = None
    branch: str | None = None
    commit: str | None = None
    oauth_token: str | None = None
    private_key: str | None = None
    git_user_name: str | None = None
    git_user_email: str | None = None
    single_branch: bool = True
    if_exists: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_type": self.repo_type,
            "repo_dir": self.repo_dir,
            "code_hash": self.code_hash,
            "clone_url": self.clone_url,
            "branch": self.branch,
            "commit": self.commit,
            "oauth_token": self.oauth_token,
            "private_key": self.private_key,
            "git_user_name": self.git_user_name,
            "git_user_email": self.git_user_email,
            "single_branch": self.single_branch,
            "if_exists": self.if_exists,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RepoCheckout:
        w = "JobSubmission.repo"
        d = _obj(data, w)
        repo_type = _choice(d, "repo_type", w, REPO_TYPES)
        single_branch = d.get("single_branch", True)
        if not isinstance(single_branch, bool):
            raise ProtocolError(f"{w}.single_branch: expected true or false")
        if_exists = d.get("if_exists")
        if if_exists is not None and if_exists not in REPO_EXISTS_ACTIONS:
            raise ProtocolError(f"{w}.if_exists: expected one of error, skip or null, got {if_exists!r}")
        out = cls(
            repo_type=repo_type,
            repo_dir=_str(d, "repo_dir", w, nonempty=True),
            code_hash=_blob_hash(d, "code_hash", w, optional=True),
            clone_url=_str(d, "clone_url", w, optional=True, nonempty=True),
            branch=_str(d, "branch", w, optional=True, nonempty=True),
            commit=_str(d, "commit", w, optional=True, nonempty=True),
            oauth_token=_str(d, "oauth_token", w, optional=True),
            private_key=_str(d, "private_key", w, optional=True),
            git_user_name=_str(d, "git_user_name", w, optional=True),
            git_user_email=_str(d, "git_user_email", w, optional=True),
            single_branch=single_branch,
            if_exists=if_exists,
        )
        if repo_type == "remote" and out.clone_url is None:
            raise ProtocolError(f"{w}.clone_url: a remote repo needs a clone URL")
        return out


@dataclass
class FileArchiveRef:
    """A ``files:`` entry: the tar archive in blob ``hash``, unpacked at ``path`` (its top-level name
    becomes the last component of ``path``)."""

    hash: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.hash, "path": self.path}

    @classmethod
    def from_dict(cls, data: Any) -> FileArchiveRef:
        w = "JobSubmission.file_archives[]"
        d = _obj(data, w)
        return cls(hash=_blob_hash(d, "hash", w), path=_str(d, "path", w, nonempty=True))


@dataclass
class JobSubmission:
    """What the server asks the agent to run (``POST /jobs``)."""

    job_id: str
    run_name: str
    commands: list[str]
    shell: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    image: str | None = None
    user: str | None = None
    stop_duration: float = 10.0
    max_duration: float | None = None
    #: The repo to prepare before the commands run (None: no repo), and the ``files:`` archives.
    repo: RepoCheckout | None = None
    file_archives: list[FileArchiveRef] = field(default_factory=list)
    #: The home dir of the job spec; ``~`` in ``repo_dir`` and archive paths means this.
    home_dir: str = "/root"
    #: dstack's ``entrypoint`` (split): the job runs ``entrypoint + commands`` as is, without a shell.
    entrypoint: list[str] | None = None
    #: Container options of a job with an ``image`` (None: defaults).
    container: ContainerSpec | None = None
    #: The ports a host-process job listens on; in a sandbox each is reached through a host port.
    ports: list[int] = field(default_factory=list)
    #: A sandboxed job keeps the host's network (a multi-node job across hosts: its nodes must reach
    #: each other at the hosts' addresses); it still gets its own filesystem view and uid.
    host_network: bool = False
    #: Instance volumes of a host-process job (``/host/path:/path``), bind-mounted in its sandbox.
    volumes: list[InstanceMount] = field(default_factory=list)
    #: Network volumes (EBS) the server attached to the instance for the job, mounted at their paths.
    network_volumes: list[NetworkMount] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "run_name": self.run_name,
            "commands": list(self.commands),
            "shell": self.shell,
            "env": dict(self.env),
            "working_dir": self.working_dir,
            "image": self.image,
            "user": self.user,
            "stop_duration": self.stop_duration,
            "max_duration": self.max_duration,
            "repo": self.repo.to_dict() if self.repo is not None else None,
            "file_archives": [a.to_dict() for a in self.file_archives],
            "home_dir": self.home_dir,
            "entrypoint": list(self.entrypoint) if self.entrypoint is not None else None,
            "container": self.container.to_dict() if self.container is not None else None,
            "ports": list(self.ports),
            "host_network": self.host_network,
            "volumes": [v.to_dict() for v in self.volumes],
            "network_volumes": [v.to_dict() for v in self.network_volumes],
        }

    def redacted(self) -> JobSubmission:
        """A copy without the repo and registry credentials (what the agent writes to disk)."""
        data = self.to_dict()
        if self.repo is not None and (self.repo.oauth_token is not None or self.repo.private_key is not None):
            data["repo"] = {**data["repo"], "oauth_token": None, "private_key": None}
        if self.container is not None and self.container.registry_password is not None:
            data["container"] = {**data["container"], "registry_password": None}
        return self if data == self.to_dict() else JobSubmission.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> JobSubmission:
        w = "JobSubmission"
        d = _obj(data, w)
        env = d.get("env", {})
        if env is None:
            env = {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ProtocolError("JobSubmission.env: expected an object of string values")
        for k in env:
            if not k or "=" in k or "\0" in k or "\0" in env[k]:
                raise ProtocolError(f"JobSubmission.env: invalid variable name or value {k!r}")
        commands = _str_list(d, "commands", w)
        image = _str(d, "image", w, optional=True, nonempty=True)
        entrypoint = _str_list(d, "entrypoint", w) if d.get("entrypoint") is not None else None
        if not commands and not entrypoint and image is None:
            raise ProtocolError("JobSubmission.commands: must contain at least one command (or set image)")
        container = d.get("container")
        archives = d.get("file_archives") or []
        if not isinstance(archives, list):
            raise ProtocolError("JobSubmission.file_archives: expected a list")
        repo = d.get("repo")
        ports = d.get("ports") or []
        if not isinstance(ports, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports
        ):
            raise ProtocolError("JobSubmission.ports: expected a list of port numbers (1-65535)")
        return cls(
            job_id=_str(d, "job_id", w, nonempty=True),
            run_name=_str(d, "run_name", w),
            commands=commands,
            shell=_str(d, "shell", w, optional=True, nonempty=True),
            env=dict(env),
            working_dir=_str(d, "working_dir", w, optional=True),
            image=image,
            user=_str(d, "user", w, optional=True),
            stop_duration=_num(d, "stop_duration", w, default=10.0),
            max_duration=_num(d, "max_duration", w, optional=True),
            repo=RepoCheckout.from_dict(repo) if repo is not None else None,
            file_archives=[FileArchiveRef.from_dict(a) for a in archives],
            home_dir=_str(d, "home_dir", w, optional=True, nonempty=True) or "/root",
            entrypoint=entrypoint,
            container=ContainerSpec.from_dict(container) if container is not None else None,
            ports=list(ports),
            host_network=d.get("host_network") is True,
            volumes=[InstanceMount.from_dict(v) for v in _list(d, "volumes", w)],
            network_volumes=[NetworkMount.from_dict(v) for v in _list(d, "network_volumes", w)],
        )


@dataclass
class JobState:
    """A job as the agent sees it. ``termination_reason`` (extra) is one of ``stopped``,
    ``aborted``, ``max_duration_exceeded``, ``agent_restarted``, ``agent_shutdown`` (stopped by the agent's own
    shutdown, not by a request) or null. A job with an ``image`` is
    ``pending`` while its image is pulled (``image_pull_progress``) and its container created."""

    job_id: str
    state: str
    exit_status: int | None = None
    message: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    pid: int | None = None
    termination_reason: str | None = None
    container: ContainerInfo | None = None
    image_pull_progress: ImagePullProgress | None = None
    #: How a host-process job runs: in its sandbox (address, uid, ports) or without one (why).
    sandbox: SandboxInfo | None = None
    #: The job's working dir as the job sees it (once it started): what SSH sessions start in.
    working_dir: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "exit_status": self.exit_status,
            "message": self.message,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "pid": self.pid,
            "termination_reason": self.termination_reason,
            "container": self.container.to_dict() if self.container is not None else None,
            "image_pull_progress": self.image_pull_progress.to_dict() if self.image_pull_progress else None,
            "sandbox": self.sandbox.to_dict() if self.sandbox is not None else None,
            "working_dir": self.working_dir,
        }

    @classmethod
    def from_dict(cls, data: Any) -> JobState:
        w = "JobState"
        d = _obj(data, w)
        exit_status = d.get("exit_status")
        if exit_status is not None and (isinstance(exit_status, bool) or not isinstance(exit_status, int)):
            raise ProtocolError("JobState.exit_status: expected an integer or null")
        return cls(
            job_id=_str(d, "job_id", w, nonempty=True),
            state=_choice(d, "state", w, JOB_STATES),
            exit_status=exit_status,
            message=_str(d, "message", w, optional=True),
            started_at=_num(d, "started_at", w, optional=True),
            finished_at=_num(d, "finished_at", w, optional=True),
            pid=_int(d, "pid", w, optional=True, minimum=1),
            termination_reason=_str(d, "termination_reason", w, optional=True),
            container=ContainerInfo.from_dict(d["container"]) if d.get("container") is not None else None,
            image_pull_progress=ImagePullProgress.from_dict(d["image_pull_progress"])
            if d.get("image_pull_progress") is not None
            else None,
            sandbox=SandboxInfo.from_dict(d["sandbox"]) if d.get("sandbox") is not None else None,
            working_dir=_str(d, "working_dir", w, optional=True),
        )


@dataclass
class LogEntry:
    """One line (or partial line) of a job's output."""

    timestamp: float
    source: str
    message: bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "source": self.source,
            "message_b64": base64.b64encode(self.message).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, data: Any) -> LogEntry:
        w = "LogEntry"
        d = _obj(data, w)
        raw = _str(d, "message_b64", w)
        try:
            message = base64.b64decode(raw.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ProtocolError("LogEntry.message_b64: not valid base64")
        return cls(timestamp=_num(d, "timestamp", w), source=_choice(d, "source", w, LOG_SOURCES), message=message)


@dataclass
class LogsReply:
    """``GET /jobs/{id}/logs``: entries from the requested offset, where to continue, job state."""

    entries: list[LogEntry]
    next_offset: int
    state: JobState
    #: The job's resource samples after the request's ``metrics_after`` (absent from the request: none).
    metrics: list[MetricsSample] = field(default_factory=list)
    #: Why samples of the reply were dropped (bad ones are skipped, never a reason to fail the reply).
    metrics_rejected: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "entries": [e.to_dict() for e in self.entries],
            "next_offset": self.next_offset,
            "state": self.state.to_dict(),
        }
        if self.metrics:
            out["metrics"] = [m.to_dict() for m in self.metrics]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> LogsReply:
        w = "LogsReply"
        d = _obj(data, w)
        entries = d.get("entries")
        if not isinstance(entries, list):
            raise ProtocolError("LogsReply.entries: expected a list")
        samples, rejected = parse_samples(d.get("metrics"))
        return cls(
            entries=[LogEntry.from_dict(e) for e in entries],
            next_offset=_int(d, "next_offset", w, minimum=0),
            state=JobState.from_dict(d.get("state")),
            metrics=samples,
            metrics_rejected=rejected,
        )


@dataclass
class GpuInfo:
    """One accelerator; ``name`` is dstack's short name (``H200``, ``A100``, ``RTX4090``)."""

    name: str
    memory_mib: int
    vendor: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "memory_mib": self.memory_mib, "vendor": self.vendor}

    @classmethod
    def from_dict(cls, data: Any) -> GpuInfo:
        w = "HostInfo.gpus[]"
        d = _obj(data, w)
        return cls(
            name=_str(d, "name", w, nonempty=True),
            memory_mib=_int(d, "memory_mib", w, minimum=0),
            vendor=_str(d, "vendor", w, nonempty=True),
        )


@dataclass
class GpuDriver:
    vendor: str
    version: str

    def to_dict(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "version": self.version}

    @classmethod
    def from_dict(cls, data: Any) -> GpuDriver:
        w = "HostInfo.gpu_driver"
        d = _obj(data, w)
        return cls(vendor=_str(d, "vendor", w), version=_str(d, "version", w))


@dataclass
class HostInfo:
    """What the host offers (``GET /info``)."""

    hostname: str
    cpus: int
    memory_mib: int
    disk_size_mib: int
    cpu_arch: str
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_driver: GpuDriver | None = None
    container_runtime: str | None = None
    agent_version: str = ""
    python_version: str = ""
    addresses: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "cpus": self.cpus,
            "memory_mib": self.memory_mib,
            "disk_size_mib": self.disk_size_mib,
            "cpu_arch": self.cpu_arch,
            "gpus": [g.to_dict() for g in self.gpus],
            "gpu_driver": self.gpu_driver.to_dict() if self.gpu_driver else None,
            "container_runtime": self.container_runtime,
            "agent_version": self.agent_version,
            "python_version": self.python_version,
            "addresses": list(self.addresses),
        }

    @classmethod
    def from_dict(cls, data: Any) -> HostInfo:
        w = "HostInfo"
        d = _obj(data, w)
        gpus = d.get("gpus")
        if not isinstance(gpus, list):
            raise ProtocolError("HostInfo.gpus: expected a list")
        driver = d.get("gpu_driver")
        return cls(
            hostname=_str(d, "hostname", w),
            cpus=_int(d, "cpus", w, minimum=1),
            memory_mib=_int(d, "memory_mib", w, minimum=0),
            disk_size_mib=_int(d, "disk_size_mib", w, minimum=0),
            cpu_arch=_choice(d, "cpu_arch", w, CPU_ARCHS),
            gpus=[GpuInfo.from_dict(g) for g in gpus],
            gpu_driver=GpuDriver.from_dict(driver) if driver is not None else None,
            container_runtime=_str(d, "container_runtime", w, optional=True),
            agent_version=_str(d, "agent_version", w),
            python_version=_str(d, "python_version", w),
            addresses=_str_list(d, "addresses", w),
        )
