"""Jobs in containers: a job with an ``image`` runs in a container of it, through the host's Docker engine.

Owns what happens between ``POST /jobs`` and the container's removal:

- **image**: used as is when the engine has it, else pulled (with the job's registry credentials);
  progress goes to ``JobState.image_pull_progress`` while the job is ``pending``;
- **files**: the repo and ``files:`` archives are prepared on the host by :mod:`corral.agent.workdir`
  (its layout mirrors the container's filesystem; the working dir defaults to the image's) and copied
  into the container before it starts; ``DSTACK_REPO_DIR``/``DSTACK_WORKING_DIR`` are the container paths;
- **container** (:func:`container_config`): the commands under the job's shell (or ``entrypoint +
  commands``; neither: the image's own command), env with dstack's variables, user, working dir,
  privileged (as far as the host allows: :mod:`corral.agent.privileged`), shm size, NVIDIA GPUs by device
  request (all of them, or free ones picked here for a share), CPU and memory limits, instance volumes, host
  networking or a bridge with published ports;
  ``docker-init`` is PID 1, so a stop's SIGTERM reaches the shell;
- **run**: logs streamed with Docker's timestamps, the exit status and OOM kill read from the engine,
  stops sent as signals through the engine (jobs.py arms the SIGKILL after ``stop_duration``);
- **cleanup**: the container is removed before the job is reported finished. After an agent restart
  :meth:`ContainerRunner.recover` finds a job's container again (running: followed as before; exited:
  settled and removed) and :meth:`ContainerRunner.sweep` removes every container labelled with this
  agent's work dir that no live job owns; :func:`remove_agent_containers` does the same for a gone agent
  (the local backend calls it; on an SSH host the server runs it as ``agent.pyz cleanup``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import posixpath
import signal
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from . import container_sessions, workdir
from .docker import Docker, DockerError, DockerUnavailable, registry_auth_header
from .images import PullTracker, pull_failure_message, registry_of, split_image
from .job import NOTICE_FILE, Job, join_commands
from .privileged import CGROUP_MOUNT, Privilege, PrivilegedProbe, fallback_allowed, fallback_host_config
from .protocol import JobSubmission
from .protocol_containers import ContainerInfo, ContainerSpec

log = logging.getLogger("corral.agent")

LABEL_AGENT = "corral.agent"  # the agent's work dir
LABEL_JOB = "corral.job_id"
LABEL_RUN = "corral.run_name"
PROGRESS_EVERY_S = 0.5
READER_DRAIN_S = 2.0
_NVIDIA_HINT = " (does the host have the NVIDIA Container Toolkit and `nvidia` runtime configured?)"
_CAPS_HINT = (
    " (a privileged container, as `privileged: true` and `docker: true` ask, gets every capability; "
    "this host's Docker engine runs without some of them, e.g. inside another container)"
)


class ContainerError(Exception):
    """The job's container could not be set up; the message is meant for the user."""


# ---- pure parts ---------------------------------------------------------------------------------
def container_shell(shell: str | None) -> str:
    """dstack's shell for a container: ``/bin/sh`` unless ``sh``, ``bash`` or an absolute path is given."""
    if shell is None:
        return "/bin/sh"
    return shell if shell.startswith("/") else "/bin/" + shell


def device_requests(gpus: int, gpu_ids: list[str]) -> list[dict[str, Any]]:
    """NVIDIA device requests: all of the host's GPUs (``gpus == -1``) or the given ones."""
    if gpus == -1:
        return [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]
    if gpu_ids:
        return [{"Driver": "nvidia", "Count": 0, "DeviceIDs": list(gpu_ids), "Capabilities": [["gpu"]]}]
    return []


def container_config(
    sub: JobSubmission,
    labels: dict[str, str],
    network_mode: str,
    gpu_ids: list[str],
    path_exists: Callable[[str], bool] = os.path.exists,
    privilege: Privilege | None = None,
) -> dict[str, Any]:
    """The ``POST /containers/create`` body of a job (a privileged one as ``privilege`` says this host runs it)."""
    spec: ContainerSpec = sub.container or ContainerSpec()
    if sub.entrypoint:
        argv: list[str] = [*sub.entrypoint, *sub.commands]
    elif sub.commands:
        argv = [container_shell(sub.shell), "-c", join_commands(sub.commands)]
    else:
        argv = []  # the image's own ENTRYPOINT and CMD
    host: dict[str, Any] = {
        "Init": True,
        "Privileged": spec.privileged,
        "NetworkMode": network_mode,
        "Mounts": [
            {"Type": "bind", "Source": m.instance_path, "Target": m.path}
            for m in spec.volumes
            if not m.optional or path_exists(m.instance_path)
        ],
    }
    if spec.privileged and privilege is not None and privilege.fallback:
        host.update(fallback_host_config(privilege.missing))
        host["Mounts"].append(dict(CGROUP_MOUNT))
    config: dict[str, Any] = {
        "Image": sub.image,
        "Env": [f"{k}={v}" for k, v in sub.env.items()],
        "Labels": labels,
        "Tty": False,
        "OpenStdin": False,
        "HostConfig": host,
    }
    if argv:
        config["Entrypoint"], config["Cmd"] = argv[:1], argv[1:]
    if sub.user:
        config["User"] = sub.user
    if sub.working_dir:
        config["WorkingDir"] = sub.working_dir
    if spec.shm_size_mib:
        host["ShmSize"] = spec.shm_size_mib * 2**20
    if spec.memory_mib:
        host["Memory"] = host["MemorySwap"] = spec.memory_mib * 2**20  # no swap beyond the limit
    if spec.cpus:
        host["NanoCpus"] = int(spec.cpus * 1e9)
    requests = device_requests(spec.gpus, gpu_ids)
    if requests:
        host["DeviceRequests"] = requests
    if network_mode == "bridge" and spec.ports:
        config["ExposedPorts"] = {f"{p}/tcp": {} for p in spec.ports}
        host["PortBindings"] = {f"{p}/tcp": [{"HostIp": "", "HostPort": ""}] for p in spec.ports}
    return config


def published_ports(inspected: dict[str, Any], spec: ContainerSpec, network_mode: str) -> dict[int, int]:
    """Container port -> host port of a started container."""
    if network_mode == "host":
        return {p: p for p in spec.ports}
    out: dict[int, int] = {}
    bound = (inspected.get("NetworkSettings") or {}).get("Ports") or {}
    for key, bindings in bound.items():
        port, _, proto = key.partition("/")
        for b in bindings or []:
            if proto == "tcp" and str(b.get("HostPort") or "").isdigit():
                out[int(port)] = int(b["HostPort"])
                break
    return out


def remove_agent_containers(docker_host: str | None, work_dir: str) -> int:
    """Remove every container an agent with this work dir made (for agents that are gone); best effort.
    Docker is not asked at all when none of the agent's jobs has an image."""
    if not _has_image_jobs(work_dir):
        return 0
    return _remove_containers(Docker(docker_host, timeout=5.0), os.path.abspath(work_dir), lambda job_id: False)


def _remove_containers(docker: Docker, work_dir: str, keep: Callable[[str], bool]) -> int:
    """Remove the containers labelled with the agent's ``work_dir`` whose job ``keep`` does not want."""
    removed = 0
    try:
        for c in docker.containers(f"{LABEL_AGENT}={work_dir}"):
            job_id = str((c.get("Labels") or {}).get(LABEL_JOB) or "")
            if not keep(job_id):
                log.info("removing container %s of job %s (no live job owns it)", str(c.get("Id"))[:12], job_id)
                docker.remove(str(c.get("Id")))
                removed += 1
    except DockerError as e:
        log.debug("removing the containers of %s: %s", work_dir, e.message)
    return removed


def _has_image_jobs(work_dir: str) -> bool:
    jobs_dir = os.path.join(work_dir, "jobs")
    for name in os.listdir(jobs_dir) if os.path.isdir(jobs_dir) else []:
        try:
            with open(os.path.join(jobs_dir, name, "submission.json")) as f:
                if json.load(f).get("image"):
                    return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


# ---- the runner ---------------------------------------------------------------------------------
class ContainerRunner:
    """Runs jobs with an ``image``. The job runner hands it jobs and gets them back through callbacks:
    ``settle(job, exit_status, failure)`` (finished: terminated if stopped, done on 0, else failed with
    ``failure`` or the exit status), ``fail(job, message, reason)`` (could not start), ``started(job)``,
    and ``prepare_files(job, sub)`` (build the repo and archives of ``sub`` under ``jobs/<id>/workdir``)."""

    def __init__(
        self,
        work_dir: str,
        docker: Docker,
        host_gpus: Callable[[], list[str]],
        settle: Callable[[Job, int | None, str | None], None],
        fail: Callable[[Job, str, str | None], None],
        started: Callable[[Job], None],
        prepare_files: Callable[[Job, JobSubmission], workdir.Layout],
    ) -> None:
        self.work_dir = work_dir
        self.docker = docker
        self._host_gpus = host_gpus
        self._settle, self._fail, self._started = settle, fail, started
        self._prepare_files = prepare_files
        self._gpu_lock = threading.Lock()
        self._gpus: dict[str, list[str]] = {}
        self._bridge: bool | None = None
        self.privileged = PrivilegedProbe(docker, {LABEL_AGENT: work_dir}, fallback_allowed(os.environ))

    def start(self, job: Job) -> None:
        _thread(self._launch, job, name=f"container-{job.sub.job_id}")

    def signal(self, job: Job, sig: int) -> None:
        with job.cond:
            info = job.state.container
        if info is None:
            return  # not created yet: the launch sees the stop
        try:
            self.docker.kill(info.id, signal.Signals(sig).name)
        except DockerError as e:
            log.debug("job %s: kill %s: %s", job.sub.job_id, sig, e.message)  # not running (any more)

    def notify(self, job: Job, text: str) -> None:
        """Write a preemption notice at the container's ``CORRAL_PREEMPTION_FILE`` (``/tmp``), before its
        SIGTERM; a container without a ``/tmp`` (or not running) gets the signal alone."""
        with job.cond:
            info = job.state.container
        if info is None:
            return
        data = text.encode()
        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w") as tar:
                entry = tarfile.TarInfo(NOTICE_FILE)
                entry.size, entry.mode, entry.mtime = len(data), 0o644, int(time.time())
                tar.addfile(entry, io.BytesIO(data))
            size = f.tell()
            f.seek(0)
            try:
                self.docker.put_archive(info.id, "/tmp", f, size)
            except DockerError as e:
                log.warning("job %s: cannot write its preemption notice: %s", job.sub.job_id, e.message)

    def recover(self, job: Job) -> bool:
        """After an agent restart: follow the job's container again; False if there is none to follow."""
        info = job.state.container
        if info is None:
            return False
        try:
            found = self.docker.inspect(info.id)
            if found is None:
                return False
            if (found.get("State") or {}).get("Status") == "created":  # the agent died before starting it
                self.docker.remove(info.id)
                return False
        except DockerError as e:
            log.warning("job %s: cannot check its container %s: %s", job.sub.job_id, info.id[:12], e.message)
            return False
        with job.cond:
            job.session = container_sessions.session_info(found)
        if info.gpu_ids:
            with self._gpu_lock:
                self._gpus[job.sub.job_id] = list(info.gpu_ids)
        # the container's output goes on after its last line stored (the agent's own lines are not its output)
        tail = job.logs.read(max(0, job.logs.count - 64), 64)
        last = [e.timestamp for e in tail if e.source != "agent"]
        self._started(job)  # max_duration counts from the container's start, not from this agent's
        self._follow(job, info.id, last[-1] if last else None)
        return True

    def sweep(self, is_live: Callable[[str], bool]) -> int:
        """Remove this agent's containers whose job is gone or finished."""
        return _remove_containers(self.docker, self.work_dir, is_live)

    # ---- launch -----------------------------------------------------------------------------
    def _launch(self, job: Job) -> None:  # noqa: PLR0915
        sub = job.sub
        spec = sub.container or ContainerSpec()
        cid: str | None = None
        try:
            image = self._ensure_image(job)
            if self._stop_requested(job):
                self._settle(job, None, None)
                return
            privilege = self.privileged.privilege(str(sub.image)) if spec.privileged else None
            if privilege is not None and privilege.refusal is not None:  # found once for this host: no container
                raise ContainerError(privilege.refusal)
            if privilege is not None and privilege.fallback:
                job.diag(privilege.notice())
            sub, files = self._lay_out(job, image)
            gpu_ids = self._take_gpus(job, spec.gpus)
            network = self._network_mode(spec.network_mode)
            labels = {LABEL_AGENT: self.work_dir, LABEL_JOB: sub.job_id, LABEL_RUN: sub.run_name}
            name = f"corral-{sub.job_id}"
            cid = self._create(name, container_config(sub, labels, network, gpu_ids, privilege=privilege))
            self._update(job, container=ContainerInfo(id=cid, name=name, network_mode=network, gpu_ids=gpu_ids))
            if files is not None:
                self._copy_files(cid, files, sub.user)
            if self._stop_requested(job):
                self._cleanup(job, cid)
                self._settle(job, None, None)
                return
            self.docker.start(cid)
            job.diag(f"Container {name} ({cid[:12]}) started, network {network}")
            inspected = self.docker.inspect(cid) or {}
            ports = published_ports(inspected, spec, network)
            session = container_sessions.session_info(inspected)
        except workdir.SetupStopped:
            self._cleanup(job, cid)
            self._settle(job, None, None)
            return
        except workdir.SetupError as e:
            self._cleanup(job, cid)
            self._fail(job, f"Failed to set up the job's files: {e}", "setup_failed")
            return
        except ContainerError as e:
            self._cleanup(job, cid)
            self._fail(job, str(e), None)
            return
        except DockerError as e:
            self._cleanup(job, cid)
            hint = _NVIDIA_HINT if "device driver" in e.message and "nvidia" in e.message else ""
            hint = _CAPS_HINT if spec.privileged and "unable to apply caps" in e.message else hint
            self._fail(job, f"Cannot start a container of image `{job.sub.image}`: {e.message}{hint}", None)
            return
        except Exception as e:  # never leave a job pending forever
            log.exception("job %s: error while starting its container", job.sub.job_id)
            self._cleanup(job, cid)
            self._fail(job, f"agent error while starting the container: {type(e).__name__}: {e}", None)
            return
        with job.cond:
            assert job.state.container is not None
            job.state.container.ports = ports
            job.session = session  # how an SSH session joins the container
            job.state.state, job.state.started_at = "running", time.time()
            stop = job.stop_reason
            job.persist()
            job.cond.notify_all()
        self._started(job)
        if stop is not None:  # the stop came while the container was being started
            self.signal(job, signal.SIGKILL if stop == "aborted" else signal.SIGTERM)
        self._follow(job, cid, None)

    def _ensure_image(self, job: Job) -> dict[str, Any]:
        """The image's inspect document, after pulling it if the engine lacks it ({} if stopped meanwhile)."""
        ref = str(job.sub.image)
        found = self.docker.image(ref)
        if found is not None:
            job.diag(f"Image {ref} found on the host")
            return found
        spec = job.sub.container or ContainerSpec()
        name, tag = split_image(ref)
        auth = None
        if spec.registry_username is not None:
            auth = registry_auth_header(spec.registry_username, spec.registry_password or "", registry_of(name))
        tracker = PullTracker()
        job.diag(f"Pulling image {ref}")
        self._update(job, image_pull_progress=tracker.snapshot())
        last = time.monotonic()
        events = self.docker.pull(name, tag, auth)
        try:
            for event in events:
                if self._stop_requested(job):
                    return {}  # closing the stream cancels the pull
                if tracker.add(event) and time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    self._update(job, image_pull_progress=tracker.snapshot())
        except DockerError as e:
            raise ContainerError(pull_failure_message(ref, e.message)) from None
        finally:
            events.close()
        done = tracker.snapshot()
        done.is_total_bytes_final = True
        self._update(job, image_pull_progress=done)
        job.diag(f"Image {ref} pulled")
        return self.docker.image(ref) or {}

    def _lay_out(self, job: Job, image: dict[str, Any]) -> tuple[JobSubmission, str | None]:
        """The submission with the container's working dir and ``DSTACK_REPO_DIR``/``DSTACK_WORKING_DIR``
        resolved, and the host dir to copy into the container (None: nothing to copy)."""
        sub = job.sub
        image_wd = (image.get("Config") or {}).get("WorkingDir") or "/"
        laid = dataclasses.replace(sub, working_dir=sub.working_dir or image_wd)
        has_files = bool(sub.file_archives) or (
            sub.repo is not None and (sub.repo.repo_type == "remote" or sub.repo.code_hash is not None)
        )
        root = os.path.join(job.dir, "workdir")
        lay = self._prepare_files(job, laid) if has_files else workdir.layout(root, laid)

        def inside(path: str) -> str:
            return posixpath.normpath("/" + os.path.relpath(path, lay.root).replace(os.sep, "/"))

        env = {**sub.env, "DSTACK_REPO_DIR": inside(lay.repo_dir), "DSTACK_WORKING_DIR": inside(lay.working_dir)}
        env["CORRAL_PREEMPTION_FILE"] = "/tmp/" + NOTICE_FILE
        return dataclasses.replace(sub, working_dir=inside(lay.working_dir), env=env), lay.root if has_files else None

    def _copy_files(self, cid: str, root: str, user: str | None) -> None:
        """Copy the prepared files into the (created, not started) container, owned by a numeric ``user``."""
        uid, _, gid = (user or "").partition(":")

        def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
            if uid.isdigit():
                info.uid, info.uname = int(uid), ""
                info.gid, info.gname = int(gid) if gid.isdigit() else int(uid), ""
            return info

        with tempfile.TemporaryFile() as f:
            with tarfile.open(fileobj=f, mode="w") as tar:
                for name in sorted(os.listdir(root)):
                    tar.add(os.path.join(root, name), arcname=name, filter=owned)
            size = f.tell()
            f.seek(0)
            self.docker.put_archive(cid, "/", f, size)

    def _create(self, name: str, config: dict[str, Any]) -> str:
        try:
            return self.docker.create(name, config)
        except DockerError as e:
            if e.status != 409:
                raise
        self.docker.remove(name)  # left by an earlier attempt of this job (an agent restart mid-launch)
        return self.docker.create(name, config)

    def _network_mode(self, wanted: str) -> str:
        if wanted == "bridge" and self._bridge is None:
            self._bridge = self.docker.has_network("bridge")
        return "bridge" if wanted == "bridge" and self._bridge else "host"

    def _take_gpus(self, job: Job, count: int) -> list[str]:
        if count <= 0:
            return []
        with self._gpu_lock:
            host = self._host_gpus()
            used = {g for ids in self._gpus.values() for g in ids}
            free = [g for g in host if g not in used]
            if len(free) < count:
                raise ContainerError(
                    f"The job needs {count} GPU(s), but only {len(free)} of this host's {len(host)} are free"
                )
            self._gpus[job.sub.job_id] = free[:count]
            return free[:count]

    # ---- run and finish ---------------------------------------------------------------------
    def _follow(self, job: Job, cid: str, since: float | None) -> None:
        reader = _thread(self._pump_logs, job, cid, since, name=f"logs-{job.sub.job_id}")
        _thread(self._wait, job, cid, reader, name=f"wait-{job.sub.job_id}")

    def _pump_logs(self, job: Job, cid: str, since: float | None) -> None:
        try:
            for source, ts, message in self.docker.logs(cid, since=since):
                if since is not None and ts <= since:
                    continue  # stored before the agent restarted
                job.logs.append(source, [message], ts)
                job.notify()
        except DockerError as e:
            log.warning("job %s: log stream: %s", job.sub.job_id, e.message)

    def _wait(self, job: Job, cid: str, reader: threading.Thread) -> None:
        exit_status: int | None = None
        failure: str | None = None
        try:
            exit_status = self.docker.wait(cid)
            reader.join(READER_DRAIN_S)
            state = (self.docker.inspect(cid) or {}).get("State") or {}
            if isinstance(state.get("ExitCode"), int):
                exit_status = state["ExitCode"]
            if state.get("OOMKilled"):
                spec = job.sub.container or ContainerSpec()
                limit = f"its memory limit ({spec.memory_mib} MiB)" if spec.memory_mib else "the host's memory"
                failure = f"Out of memory: the container was killed for exceeding {limit}; exit status {exit_status}"
        except DockerError as e:
            failure = f"Lost the job's container: {e.message}"
        except Exception as e:  # never leave a job running forever
            log.exception("job %s: error while finishing its container", job.sub.job_id)
            failure = f"agent error: {type(e).__name__}: {e}"
        self._cleanup(job, cid)
        self._settle(job, exit_status, failure)

    def _cleanup(self, job: Job, cid: str | None) -> None:
        with self._gpu_lock:
            self._gpus.pop(job.sub.job_id, None)
        if cid is None:
            return
        try:
            self.docker.remove(cid)
        except DockerUnavailable as e:
            log.warning("job %s: cannot remove container %s now (%s); the next sweep will", job.sub.job_id, cid, e)
        except DockerError as e:
            log.warning("job %s: removing container %s: %s", job.sub.job_id, cid[:12], e.message)

    # ---- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _stop_requested(job: Job) -> bool:
        with job.cond:
            return job.stop_reason is not None

    @staticmethod
    def _update(job: Job, **changes: Any) -> None:
        with job.cond:
            for k, v in changes.items():
                setattr(job.state, k, v)
            job.persist()
            job.cond.notify_all()


def _thread(target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    t = threading.Thread(target=target, args=args, name=name)
    t.daemon = True
    t.start()
    return t
