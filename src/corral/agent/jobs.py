"""The job runner: start, watch, stop and forget job processes; persist their state.

Layout under the agent's work dir: ``jobs/<job_id>/`` holds ``submission.json`` (without repo
credentials), ``state.json`` (rewritten atomically on every change) and the log files; the job's own
files go to ``jobs/<job_id>/workdir``, which stands in for a container's filesystem: the repo, the
``files:`` archives and the working dir are placed in it by :mod:`corral.agent.workdir` (in a thread of
the job's own when there is a repo or archives to prepare, so ``POST /jobs`` answers at once). When the
agent can (root), the job runs in its sandbox (:mod:`corral.agent.sandbox`): its network and port relays
are opened by ``POST /jobs`` (which answers with its ports), its tree is its ``/`` over the read-only
host, its uid is its own; without one it runs as the agent's user and its state says why.
A job is ``[shell, "-c", " && ".join(commands)]`` in a session of its own; when its main process
exits, whatever it left in its process group is killed. Stop = SIGTERM to the group, SIGKILL
after ``stop_duration`` (at once on abort). On start, jobs left running by a previous agent
process are killed and marked failed ("agent restarted"). A job with an ``image`` runs in a container
instead (:mod:`corral.agent.containers`); its container outlives an agent restart and is followed again.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import procs, sandbox, sandbox_layout, workdir
from .containers import ContainerRunner
from .docker import Docker
from .job import Job, JobConflict, JobNotFound, write_json
from .logstore import pump
from .protocol import JobState, JobSubmission, LogEntry, LogsReply
from .protocol_sandbox import SandboxInfo

log = logging.getLogger("corral.agent")

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_WAIT_S = 30.0
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


class JobRunner:
    def __init__(
        self,
        work_dir: str,
        container_runtime: Callable[[], str | None] = lambda: None,
        docker_host: str | None = None,
        host_gpus: Callable[[], list[str]] = list,
        sandboxes: sandbox.Sandboxes | None = None,
    ) -> None:
        self.work_dir = os.path.abspath(work_dir)
        self.sandboxes = sandboxes or sandbox.Sandboxes(work_dir, sandbox.SandboxConfig(mode="off"))
        self.jobs_dir = os.path.join(self.work_dir, "jobs")
        os.makedirs(self.jobs_dir, exist_ok=True)
        self.blobs = workdir.BlobStore(self.work_dir)
        self._container_runtime = container_runtime
        self.containers = ContainerRunner(
            self.work_dir,
            Docker(docker_host),
            host_gpus,
            self._settle,
            self._fail,
            self._arm_max_duration,
            self._prepare_files,
        )
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._closing = False
        self._load()
        self.sandboxes.reap({j.sub.job_id for j in self._jobs.values() if not j.state.finished})
        if any(j.sub.image for j in self._jobs.values()):
            t = threading.Thread(target=self.containers.sweep, args=(self._is_live,), name="container-sweep")
            t.daemon = True
            t.start()

    # ---- restart recovery -------------------------------------------------------------------
    def _load(self) -> None:
        for name in sorted(os.listdir(self.jobs_dir)):
            job_dir = os.path.join(self.jobs_dir, name)
            try:
                with open(os.path.join(job_dir, "submission.json")) as f:
                    sub = JobSubmission.from_dict(json.load(f))
                with open(os.path.join(job_dir, "state.json")) as f:
                    state = JobState.from_dict(json.load(f))
            except (OSError, ValueError):
                continue  # half-created or foreign directory: leave it alone
            job = Job(job_dir, sub, state)
            if not state.finished and not (sub.image and self.containers.recover(job)):
                if state.pid:
                    procs.reap_group(state.pid, state.started_at)
                state.state, state.message = "failed", "agent restarted"
                state.termination_reason = "agent_restarted"
                state.finished_at = time.time()
                job.persist()
            self._jobs[sub.job_id] = job

    def _is_live(self, job_id: str) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
        return job is not None and not job.snapshot().finished

    # ---- queries ----------------------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def list_jobs(self) -> list[JobState]:
        with self._lock:
            jobs = list(self._jobs.values())
        return [j.snapshot() for j in jobs]

    def logs(self, job_id: str, offset: int, limit: int, wait: float, known_state: str | None = None) -> LogsReply:
        """Entries from ``offset``, waiting up to ``wait`` for one, for the job to finish or for its state
        to change (at once if it is no longer ``known_state``, the state the caller last saw)."""
        job = self.get(job_id)
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_S)
        with job.cond:
            seen = job.state.to_dict()
            while job.logs.count <= offset and not job.state.finished and job.state.to_dict() == seen:
                if known_state is not None and job.state.state != known_state:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                job.cond.wait(remaining)
        state = job.snapshot()  # taken before reading: a finished state implies all entries are there
        entries: list[LogEntry] = job.logs.read(offset, limit)
        return LogsReply(entries=entries, next_offset=offset + len(entries), state=state)

    # ---- submit -----------------------------------------------------------------------------
    def submit(self, sub: JobSubmission) -> JobState:
        if not JOB_ID_RE.match(sub.job_id):
            raise ValueError(f"JobSubmission.job_id: {sub.job_id!r} is not a valid id ([A-Za-z0-9._-], max 128)")
        with self._lock:
            existing = self._jobs.get(sub.job_id)
            if existing is None and self._closing:
                raise JobConflict("the agent is shutting down")
            if existing is None:
                job_dir = os.path.join(self.jobs_dir, sub.job_id)
                if os.path.exists(job_dir):
                    shutil.rmtree(job_dir, ignore_errors=True)
                os.makedirs(job_dir)
                write_json(os.path.join(job_dir, "submission.json"), sub.redacted().to_dict())
                job = Job(job_dir, sub, JobState(job_id=sub.job_id, state="pending"))
                job.persist()
                self._jobs[sub.job_id] = job
        if existing is not None:
            return existing.snapshot()  # idempotent
        if not sub.image and not self._open_sandbox(job):
            return job.snapshot()
        if sub.repo is not None or sub.file_archives:
            self.blobs.prune()
            t = threading.Thread(target=self._start, args=(job,), name=f"setup-{sub.job_id}")
            t.daemon = True
            t.start()
        else:
            self._start(job)
        return job.snapshot()

    def _open_sandbox(self, job: Job) -> bool:
        """The job's network and port relays (so that ``POST /jobs`` answers with its ports), or what
        ``JobState.sandbox`` says about running without one. False if the job failed."""
        sbs = self.sandboxes
        if not sbs.available:
            with job.cond:
                job.state.sandbox = SandboxInfo(message=f"Runs without a sandbox: {sbs.reason}")
                job.persist()
            return True
        try:
            sb = job.sandbox = sbs.open(job.sub.job_id, job.sub.ports, job.sub.host_network)
        except sandbox.SandboxError as e:
            self._fail(job, f"Cannot set up the job's sandbox: {e}")
            return False
        with job.cond:
            job.state.sandbox = SandboxInfo(address=sb.address, uid=sb.uid, ports=sb.ports())
            job.persist()
        return True

    def _drop_sandbox(self, job: Job) -> None:
        sb, job.sandbox = job.sandbox, None
        if sb is not None:
            try:
                self.sandboxes.close(sb)
            except OSError:
                log.exception("job %s: cannot release its sandbox", job.sub.job_id)

    def reserve_address(self, job_id: str) -> str | None:
        """The address the job will have in its sandbox (None without one), reserved from now on."""
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"job id {job_id!r} is not a valid id ([A-Za-z0-9._-], max 128)")
        if not self.sandboxes.available:
            return None
        with self._lock:
            known = set(self._jobs)
        self.sandboxes.release_stale(known)
        return self.sandboxes.address(self.sandboxes.reserve(job_id))

    def _fail(self, job: Job, message: str, reason: str | None = None) -> None:
        self._drop_sandbox(job)
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

    def _start(self, job: Job) -> None:
        sub = job.sub
        if sub.image:
            if self._container_runtime() is None:
                self._fail(
                    job,
                    f"The job sets `image: {sub.image}`, but this host has no container runtime (Docker); "
                    "remove `image` to run on the host, or add Docker to the host",
                )
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
            if sb is not None:
                binds = sandbox_layout.binds(lay, sandbox_layout.submission(sub))
                cwd = sandbox_layout.inside(lay, lay.working_dir)
                env.update(DSTACK_REPO_DIR=sandbox_layout.inside(lay, lay.repo_dir), DSTACK_WORKING_DIR=cwd)
                if "HOME" not in sub.env:
                    env["HOME"] = sub.home_dir
                sandbox.chown_tree(lay.root, sb.uid)
                os.makedirs(os.path.join(job.dir, "root"), exist_ok=True)
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
            argv = [*sub.entrypoint, *sub.commands] if sub.entrypoint else [shell, "-c", " && ".join(sub.commands)]
            io: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            try:
                if sb is not None:
                    pipes = sandbox.Pipes.open()
                    root = os.path.join(job.dir, "root")
                    cmd = self.sandboxes.command(sb, argv, cwd, binds, root, pipes, inside)
                    proc = sandbox.start(cmd, pipes, inside, sb.uid, cwd=job.dir, env=env, start_new_session=True, **io)
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
            job.state.state, job.state.pid, job.state.started_at = "running", proc.pid, time.time()
            job.persist()
            job.cond.notify_all()
        assert proc.stdout is not None and proc.stderr is not None
        stop = threading.Event()
        readers = []
        for stream, source in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            fd = os.dup(stream.fileno())
            stream.close()
            t = threading.Thread(
                target=pump, args=(fd, source, job.logs, job.notify, stop), name=f"log-{sub.job_id}-{source}"
            )
            t.daemon = True
            t.start()
            readers.append(t)
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
        self._drop_sandbox(job)
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
            job.persist()
            job.cond.notify_all()

    # ---- stop / forget / shutdown ----------------------------------------------------------
    def _expire(self, job: Job) -> None:
        self._stop(job, abort=False, reason="max_duration_exceeded")

    def stop(self, job_id: str, abort: bool = False) -> JobState:
        job = self.get(job_id)
        self._stop(job, abort=abort, reason="aborted" if abort else "stopped")
        return job.snapshot()

    def _stop(self, job: Job, abort: bool, reason: str) -> None:
        with job.cond:
            if job.state.finished:
                return
            if job.stop_reason is None or abort:
                job.stop_reason = reason
            proc = job.proc
            setup = job.setup_proc
        if setup is not None:
            procs.signal_group(setup.pid, signal.SIGKILL)
        if job.sub.image:
            self.containers.signal(job, signal.SIGKILL if abort else signal.SIGTERM)
            if not abort:
                self._timer(job, job.sub.stop_duration, self.containers.signal, job, signal.SIGKILL)
            return
        if proc is None or proc.returncode is not None:
            return
        if abort:
            procs.signal_group(proc.pid, signal.SIGKILL)
            return
        procs.signal_group(proc.pid, signal.SIGTERM)
        self._timer(job, job.sub.stop_duration, self._kill, job)

    def _kill(self, job: Job) -> None:
        proc = job.proc
        if proc is not None and proc.returncode is None:
            procs.signal_group(proc.pid, signal.SIGKILL)

    def forget(self, job_id: str) -> None:
        job = self.get(job_id)
        with job.cond:
            if not job.state.finished:
                raise JobConflict(f"job {job_id} is {job.state.state}; stop it before deleting it")
        with self._lock:
            self._jobs.pop(job_id, None)
        self.sandboxes.release(job_id)
        job.logs.close()
        shutil.rmtree(job.dir, ignore_errors=True)

    def shutdown(self, max_grace: float = 30.0) -> None:
        """Stop every job gracefully (their stop_duration, at most ``max_grace``), then kill."""
        with self._lock:
            self._closing = True
            jobs = [j for j in self._jobs.values() if not j.state.finished]
        if jobs:
            grace = min(max_grace, max(j.sub.stop_duration for j in jobs))
            for j in jobs:
                self._stop(j, abort=False, reason="stopped")
            self._await(jobs, time.monotonic() + grace + 0.5)
            for j in jobs:
                self._stop(j, abort=True, reason="stopped")
            self._await(jobs, time.monotonic() + READER_DRAIN_S + 2.0)
        self.sandboxes.reap({j.sub.job_id for j in jobs if not j.state.finished})  # and unused reservations

    @staticmethod
    def _await(jobs: list[Job], deadline: float) -> None:
        for j in jobs:
            with j.cond:
                while not j.state.finished and time.monotonic() < deadline:
                    j.cond.wait(max(0.01, deadline - time.monotonic()))


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _stop_message(reason: str, max_duration: float | None) -> str:
    if reason == "max_duration_exceeded":
        return f"max_duration ({max_duration or 0:g}s) exceeded"
    return {"stopped": "stopped by request", "aborted": "aborted by request"}.get(reason, reason)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
