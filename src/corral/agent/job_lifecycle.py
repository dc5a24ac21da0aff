"""One job's life on the host, from start to end: its sandbox opened and released, its host process
launched (argv, user, environment, files, log pumps), its timers, its stop and its final state.

:class:`JobLifecycle` is the base of :class:`corral.agent.jobs.JobRunner`, which owns the registry of
jobs and the attributes this class uses (``sandboxes``, ``blobs``, ``containers``). A job is
``[shell, "-c", <commands joined with &&>]`` in a session of its own; when its main process exits, whatever
it left in its process group is killed. Stop = SIGTERM to the group, SIGKILL after ``stop_duration`` (at
once on abort); a stop with a ``deadline`` (a preemption) first writes it to the file
``CORRAL_PREEMPTION_FILE`` names (``CORRAL_PREEMPTION_DEADLINE=<unix time>`` and
``CORRAL_PREEMPTION_MESSAGE=...``, shell syntax), then kills at the deadline. When the agent can (root),
the job runs in its sandbox (:mod:`corral.agent.sandbox`): its tree is its ``/`` over the read-only host,
its uid is its own; without one it runs as the agent's user and its state says why. A job with an
``image`` runs in a container instead (:mod:`corral.agent.containers`).
"""

from __future__ import annotations

import getpass
import logging
import os
import posixpath
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from . import procs, sandbox, sandbox_layout, volumes, workdir
from .containers import ContainerRunner
from .job import NOTICE_FILE, Job, Notice, join_commands
from .launcher_server import Child
from .logstore import pump_all
from .protocol import JobSubmission
from .protocol_containers import InstanceMount
from .protocol_sandbox import SandboxInfo

log = logging.getLogger("corral.agent")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READER_DRAIN_S = 2.0


def _exit_status(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc


def resolve_shell(shell: str | None) -> str:
    if shell is None:
        return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    if shell in ("sh", "bash"):
        path = "/bin/" + shell
        return path if os.path.exists(path) else (shutil.which(shell) or path)
    if os.path.isabs(shell):
        return shell
    raise ValueError(f"invalid shell {shell!r}: use sh, bash or an absolute path")


def _no_docker_message(sub: JobSubmission) -> str:
    """Why a job that needs a container cannot run on this host, and what to change."""
    if sub.container is not None and sub.container.docker_in_docker:
        return (
            "The job sets `docker: true`, but this host has no Docker engine to run its docker-in-docker "
            f"container (`{sub.image}`, privileged) on; run it in a fleet whose hosts have Docker, or remove `docker`"
        )
    return (
        f"The job sets `image: {sub.image}`, but this host has no container runtime (Docker); "
        "remove `image` to run on the host, or add Docker to the host"
    )


class JobLifecycle:
    sandboxes: sandbox.Sandboxes
    blobs: workdir.BlobStore
    containers: ContainerRunner
    _container_runtime: Callable[[], str | None]

    def _open_sandbox(self, job: Job) -> bool:
        """The job's network and port relays (so that ``POST /jobs`` answers with its ports), or what
        ``JobState.sandbox`` says about running without one. False if the job failed."""
        sbs = self.sandboxes
        if not sbs.available:
            bound = [v.path for v in job.sub.volumes if not v.optional and v.instance_path != v.path]
            if bound:  # only a sandbox binds a host directory at another path (an `optional` one is left out)
                self._fail(job, f"Cannot mount the instance volume(s) at {', '.join(bound)}: {sbs.reason}")
                return False
            with job.cond:
                job.state.sandbox = SandboxInfo(message=f"Runs without a sandbox: {sbs.reason}")
                job.persist()
            job.diag(f"Runs without a sandbox: {sbs.reason}")
            return True
        try:
            sb = job.sandbox = sbs.open(job.sub.job_id, job.sub.ports, job.sub.host_network)
        except sandbox.SandboxError as e:
            self._fail(job, f"Cannot set up the job's sandbox: {e}")
            return False
        with job.cond:
            job.state.sandbox = SandboxInfo(address=sb.address, uid=sb.uid, ports=sb.ports())
            job.persist()
        job.diag(f"Sandbox opened: address {sb.address}, uid {sb.uid}")
        return True

    def _drop_sandbox(self, job: Job, keep_bridge: bool = False) -> None:
        sb, job.sandbox = job.sandbox, None
        if sb is not None:
            try:
                self.sandboxes.close(sb, keep_bridge)
            except OSError:
                log.exception("job %s: cannot release its sandbox", job.sub.job_id)

    def _fail(self, job: Job, message: str, reason: str | None = None) -> None:
        job.diag(f"Job failed: {message}")
        self._drop_sandbox(job)
        self._unmount_volumes(job)
        with job.cond:
            job.state.state, job.state.message = "failed", message
            job.state.termination_reason = reason
            job.state.finished_at = time.time()
            job.persist()
            job.cond.notify_all()

    def _env(self, sub: JobSubmission, user: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH") or DEFAULT_PATH,
            "HOME": os.environ.get("HOME") or os.path.expanduser("~"),
            "LANG": os.environ.get("LANG") or "C.UTF-8",
            "USER": user,
            "TERM": os.environ.get("TERM") or "xterm-256color",
        }
        if user != _current_user():
            import pwd

            env["HOME"] = pwd.getpwnam(user).pw_dir
        env.update(sub.env)
        return env

    def _mount_volumes(self, job: Job) -> bool:
        """Mount the job's network volumes: into its container or sandbox (as instance volumes), or bound at
        their paths for a plain host process. False if the job failed."""
        sub = job.sub
        try:
            for m in sub.network_volumes:
                point = volumes.mount(m)
                job.volume_mounts.append(point)
                job.diag(f"Network volume {m.name} ({m.device_name}) mounted at {point}, for {m.path}")
                if sub.image and sub.container is not None:
                    sub.container.volumes.append(InstanceMount(point, m.path))
                elif job.sandbox is not None:
                    sub.volumes.append(InstanceMount(point, m.path))
                else:
                    volumes.bind(point, m.path)
                    job.volume_mounts.append(m.path)
        except (volumes.VolumeError, OSError, subprocess.SubprocessError) as e:
            self._unmount_volumes(job)
            self._fail(job, f"Cannot mount the job's volumes: {e}", reason="volume_error")
            return False
        return True

    def _unmount_volumes(self, job: Job) -> None:
        points, job.volume_mounts = job.volume_mounts, []
        if points:
            left = volumes.unmount(points)
            if left:
                log.warning("job %s: could not unmount %s", job.sub.job_id, ", ".join(left))

    def _start(self, job: Job) -> None:  # noqa: C901, PLR0915
        sub = job.sub
        if sub.network_volumes and not self._mount_volumes(job):
            return
        if sub.image:
            if self._container_runtime() is None:
                self._fail(job, _no_docker_message(sub))
                return
            self.containers.start(job)
            return
        try:
            shell = resolve_shell(sub.shell)
            sb = job.sandbox
            inside = sandbox.inside_ids(sub.user) if sb is not None and sb.userns else None
            # `user` names a user inside the sandbox; a plain host process runs as the agent unless it is root
            user = sub.user if sub.user and sb is None and os.geteuid() == 0 else _current_user()
            kwargs: dict[str, Any] = {}
            if user != _current_user():
                if os.geteuid() != 0 or sys.version_info < (3, 9):
                    raise ValueError(f"cannot run as user {user!r}: the agent runs as {_current_user()!r}")
                import pwd

                pw = pwd.getpwnam(user)
                kwargs = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            lay = self._prepare_files(job, sandbox_layout.submission(sub) if sb else sub)
            cwd = lay.working_dir
            env = self._env(sub, user)
            env.update(DSTACK_REPO_DIR=lay.repo_dir, DSTACK_WORKING_DIR=lay.working_dir)
            # a host process reads it in its job's own directory (outside its working dir)
            job.notice_path = os.path.join(job.dir, NOTICE_FILE)
            env["CORRAL_PREEMPTION_FILE"] = job.notice_path
            if sb is not None:
                binds = sandbox_layout.binds(lay, sandbox_layout.submission(sub))
                cwd = sandbox_layout.inside(lay, lay.working_dir)
                env.update(DSTACK_REPO_DIR=sandbox_layout.inside(lay, lay.repo_dir), DSTACK_WORKING_DIR=cwd)
                job.notice_path = os.path.join(lay.root, "tmp", NOTICE_FILE)  # lay.root/tmp is its /tmp
                env["CORRAL_PREEMPTION_FILE"] = "/tmp/" + NOTICE_FILE
                if "HOME" not in sub.env:
                    env["HOME"] = sub.home_dir
                sandbox.chown_tree(lay.root, sb.uid)
                _diag_volumes(job, binds)
        except workdir.SetupStopped:
            self._stopped_before_start(job)
            return
        except workdir.SetupError as e:
            self._fail(job, f"Failed to set up the job's files: {e}", reason="setup_failed")
            return
        except sandbox.SandboxError as e:
            self._fail(job, f"Cannot start the job: {e}")
            return
        except (ValueError, KeyError, OSError) as e:
            self._fail(job, f"cannot start the job: {e}")
            return
        with job.cond:
            if job.stop_reason is not None:
                self._stopped_before_start(job)
                return
            argv = [*sub.entrypoint, *sub.commands] if sub.entrypoint else [shell, "-c", join_commands(sub.commands)]
            io: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            try:
                proc: subprocess.Popen[bytes] | Child
                init_pid: int | None = None
                if sb is not None:
                    root = self.sandboxes.mount_point()
                    launched = self.sandboxes.launcher.launch(sb, argv, cwd, binds, root, inside, env, job.dir)
                    proc, init_pid = launched.proc, launched.init_pid
                else:
                    proc = subprocess.Popen(
                        argv, cwd=cwd, env=env, start_new_session=True, close_fds=True, **io, **kwargs
                    )
            except sandbox.SandboxError as e:
                self._drop_sandbox(job)
                job.state.state, job.state.message = "failed", f"Cannot start the job in its sandbox: {e}"
                job.state.finished_at = time.time()
                job.persist()
                job.cond.notify_all()
                return
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                self._drop_sandbox(job)
                job.state.state, job.state.message = "failed", f"cannot start {shell}: {e}"
                job.state.finished_at = time.time()
                job.persist()
                job.cond.notify_all()
                return
            job.proc = proc
            job.diag(f"Process started (pid {proc.pid}): {shell if not sub.entrypoint else sub.entrypoint[0]}")
            job.session = {
                "pid": init_pid,  # a session joins the namespaces of the job's init (none: a host process)
                "pidns": init_pid is not None,
                "uid": sb.uid if sb is not None else kwargs.get("user"),
                "gid": sb.uid if sb is not None else kwargs.get("group"),
                "inside": list(inside) if inside is not None else None,
                "cwd": cwd,
                "env": env,
                "shell": shell,
            }
            job.state.state, job.state.pid, job.state.started_at = "running", proc.pid, time.time()
            job.state.working_dir = cwd
            job.persist()
            job.cond.notify_all()
        assert proc.stdout is not None and proc.stderr is not None
        stop = threading.Event()
        streams = []
        for stream, source in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            streams.append((os.dup(stream.fileno()), source))
            stream.close()
        # one thread reads both pipes (a thread each cost a job a thread's start, stack and wake-ups more)
        t = threading.Thread(target=pump_all, args=(streams, job.logs, job.notify, stop), name=f"log-{sub.job_id}")
        t.daemon = True
        t.start()
        readers = [t]
        waiter = threading.Thread(target=self._wait, args=(job, readers, stop), name=f"wait-{sub.job_id}")
        waiter.daemon = True
        waiter.start()
        self._arm_max_duration(job)

    def _arm_max_duration(self, job: Job) -> None:
        if job.sub.max_duration is not None:
            ran = time.time() - (job.state.started_at or time.time())
            self._timer(job, max(0.0, job.sub.max_duration - ran), self._expire, job)

    def _stopped_before_start(self, job: Job) -> None:
        self._drop_sandbox(job)
        with job.cond:
            job.state.state, job.state.termination_reason = "terminated", job.stop_reason
            job.state.finished_at = time.time()
            job.persist()
            job.cond.notify_all()

    def _prepare_files(self, job: Job, sub: JobSubmission) -> workdir.Layout:
        return workdir.prepare(os.path.join(job.dir, "workdir"), job.dir, sub, self.blobs, self._registrar(job))

    @staticmethod
    def _registrar(job: Job) -> workdir.Register:
        """Lets a stop kill the setup's git commands; refuses to go on once the job is stopped."""

        def register(proc: subprocess.Popen[bytes] | None) -> None:
            with job.cond:
                job.setup_proc = proc
                stopped = job.stop_reason is not None
            if stopped:
                if proc is not None:
                    procs.signal_group(proc.pid, signal.SIGKILL)
                raise workdir.SetupStopped

        return register

    def _timer(self, job: Job, delay: float, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Timer(delay, fn, args)
        t.daemon = True
        job.timers.append(t)
        t.start()

    def _wait(self, job: Job, readers: list[threading.Thread], stop: threading.Event) -> None:
        try:
            self._finish(job, readers, stop)
        except Exception as e:  # never leave a job "running" forever
            log.exception("job %s: error while finishing", job.sub.job_id)
            with job.cond:
                if not job.state.finished:
                    job.state.state, job.state.message = "failed", f"agent error: {type(e).__name__}: {e}"
                    job.state.finished_at = time.time()
                    job.cond.notify_all()
                job.persist()

    def _finish(self, job: Job, readers: list[threading.Thread], stop: threading.Event) -> None:
        assert job.proc is not None
        rc = job.proc.wait()
        procs.signal_group(job.proc.pid, signal.SIGKILL)  # leftovers of the job's group
        # Its relays closed and what its uid left running killed now; its namespace (kept for the next job, or
        # removed: tens of ms while the kernel waits for the veth's removal) and slot once the job is seen
        # finished, as the bridge.
        sb, job.sandbox = job.sandbox, None
        if sb is None:
            self._finish_job(job, readers, stop, rc)
            return
        job.sandbox_given_back.clear()  # before the job is seen finished (its forget waits for what follows)
        try:
            self.sandboxes.quiesce(sb)
            self._finish_job(job, readers, stop, rc)
            try:
                # the network of this agent's next job: this one's, if the job left nothing in it, else made now
                if not self.sandboxes.spare.keep(sb):
                    self.sandboxes.close(sb, keep_bridge=True, quiesced=True)
                job.slot_given_back = True
            except OSError:
                log.exception("job %s: cannot release its sandbox", job.sub.job_id)
        finally:
            job.sandbox_given_back.set()
        self.sandboxes.spare.prepare()
        # the spare goes, and the host's last sandbox takes the bridge with it, a moment later if idle
        self.sandboxes.bridge_down_later()

    def _finish_job(self, job: Job, readers: list[threading.Thread], stop: threading.Event, rc: int) -> None:
        """Its output read to the end, then the job settled (seen finished from here on)."""
        deadline = time.monotonic() + READER_DRAIN_S
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
        stop.set()
        for t in readers:
            t.join(1.0)
        self._settle(job, _exit_status(rc), f"killed by signal {_signame(-rc)}" if rc < 0 else None)

    def _settle(self, job: Job, exit_status: int | None, failure: str | None = None) -> None:
        """The job ended: terminated if it was stopped, done on status 0, else failed with ``failure``."""
        for timer in job.timers:
            timer.cancel()
        self._unmount_volumes(job)  # before the job is seen finished: the server detaches them then
        with job.cond:
            st = job.state
            if st.finished:
                return
            st.exit_status, st.finished_at = exit_status, time.time()
            if job.stop_reason is not None:
                st.state, st.termination_reason = "terminated", job.stop_reason
                st.message = _stop_message(job.stop_reason, job.sub.max_duration)
            elif exit_status == 0 and failure is None:
                st.state = "done"
            else:
                st.state = "failed"
                st.message = failure or (f"exited with status {exit_status}" if exit_status is not None else None)
            # under the job's lock: a poll woken by this line sees the job's end with it
            said = f"Exited with status {exit_status}" + (f" ({failure})" if failure else "") + f": {st.state}"
            job.diag(said, at=st.finished_at)
            job.persist()
            job.cond.notify_all()

    def _expire(self, job: Job) -> None:
        self._stop(job, abort=False, reason="max_duration_exceeded")

    def _stop(self, job: Job, abort: bool, reason: str, notice: Notice | None = None) -> None:
        with job.cond:
            if job.state.finished:
                return
            if job.stop_reason is None or abort:
                job.stop_reason = reason
            proc = job.proc
            setup = job.setup_proc
        grace = job.sub.stop_duration
        if notice is not None and not abort:
            grace = max(0.0, notice.deadline - time.time())
            if job.sub.image:
                self.containers.notify(job, notice.text())
            else:
                self._write_notice(job, notice)
        job.diag(f"Stop ({reason}): " + ("SIGKILL" if abort else f"SIGTERM, SIGKILL after {grace:g}s"))
        if setup is not None:
            procs.signal_group(setup.pid, signal.SIGKILL)
        if job.sub.image:
            self.containers.signal(job, signal.SIGKILL if abort else signal.SIGTERM)
            if not abort:
                self._timer(job, grace, self.containers.signal, job, signal.SIGKILL)
            return
        if proc is None or proc.returncode is not None:
            return
        if abort:
            procs.signal_group(proc.pid, signal.SIGKILL)
            return
        procs.signal_group(proc.pid, signal.SIGTERM)
        self._timer(job, grace, self._kill, job)

    @staticmethod
    def _write_notice(job: Job, notice: Notice) -> None:
        """The deadline, where the job reads it, before its SIGTERM (written whole: a rename)."""
        path = job.notice_path
        if path is None:
            return
        text = notice.text()
        try:
            # a new file of its own (O_EXCL: never through a link the job left there), renamed over the name
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".notice-")
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), 0o644)
                f.write(text)
            os.replace(tmp, path)
        except OSError:
            log.warning("cannot write the preemption notice of %s", job.sub.job_id)

    def _kill(self, job: Job) -> None:
        proc = job.proc
        if proc is not None and proc.returncode is None:
            procs.signal_group(proc.pid, signal.SIGKILL)


def _diag_volumes(job: Job, binds: dict[str, str]) -> None:
    """The job's instance volumes, as its sandbox binds them (an ``optional`` one missing on the host: left out)."""
    for vol in job.sub.volumes:
        if binds.get(posixpath.normpath(vol.path)) == vol.instance_path:
            job.diag(f"Instance volume {vol.instance_path} mounted at {vol.path}")
        else:
            job.diag(f"Instance volume {vol.instance_path} not mounted at {vol.path}: optional, and not on this host")


_USER: list[str] = []


def _current_user() -> str:
    """The agent's user name (looked up once: the agent's uid never changes, and a lookup reads
    ``/etc/passwd``)."""
    if not _USER:
        try:
            _USER.append(getpass.getuser())
        except (KeyError, OSError):
            _USER.append(str(os.getuid()))
    return _USER[0]


_STOP_MESSAGES = {
    "stopped": "stopped by request",
    "aborted": "aborted by request",
    "agent_shutdown": "stopped: its agent was shut down while it ran (SIGTERM, SIGINT or POST /shutdown)",
}


def _stop_message(reason: str, max_duration: float | None) -> str:
    if reason == "max_duration_exceeded":
        return f"max_duration ({max_duration or 0:g}s) exceeded"
    return _STOP_MESSAGES.get(reason, reason)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
