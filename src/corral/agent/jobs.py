"""The job runner: the agent's registry of jobs; it accepts, lists, follows, stops and forgets them, and
persists their state.

Layout under the agent's work dir: ``jobs/<job_id>/`` holds ``submission.json`` (without repo
credentials), ``state.json`` (one page rewritten whole on every change) and the log files; the job's own
files go to ``jobs/<job_id>/workdir``, which stands in for a container's filesystem: the repo, the
``files:`` archives and the working dir are placed in it by :mod:`corral.agent.workdir` (in a thread of
the job's own when there is a repo or archives to prepare, so ``POST /jobs`` answers at once). When the
agent can (root), a job's network and port relays are opened by ``POST /jobs`` (which answers with its
ports). Each job's life from start to end is :mod:`corral.agent.job_lifecycle`'s. On start, jobs left
running by a previous agent process are killed and marked failed ("agent restarted"); a job with an
``image`` has a container that outlives an agent restart and is followed again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable

from . import procs, sandbox, workdir
from .containers import ContainerRunner
from .docker import Docker
from .job import Job, JobConflict, JobNotFound, Notice
from .job_lifecycle import READER_DRAIN_S, JobLifecycle
from .protocol import JobState, JobSubmission, LogEntry, LogsReply

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_WAIT_S = 30.0
#: How long a logs poll waits for the end of a job whose process exited (its output drained, its sandbox released).
SETTLE_WAIT_S = 0.5
#: The stop reason of the jobs an agent's shutdown stops (SIGTERM, SIGINT, ``POST /shutdown``): not the server's
#: request, so never reported as one.
SHUTDOWN = "agent_shutdown"
#: How long a job's forget waits for its end to give its sandbox back (a quick step: it is never stuck).
SANDBOX_GIVE_BACK_S = 5.0


class JobRunner(JobLifecycle):
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
        #: Called with a job's id when it is forgotten (the sampler drops its samples).
        self.on_forget: Callable[[str], None] | None = None
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

    def running(self) -> list[Job]:
        """The jobs running now (what the sampler measures)."""
        with self._lock:
            jobs = list(self._jobs.values())
        return [j for j in jobs if j.state.state == "running"]

    def list_jobs(self) -> list[JobState]:
        with self._lock:
            jobs = list(self._jobs.values())
        return [j.snapshot() for j in jobs]

    def logs(
        self, job_id: str, offset: int, limit: int, wait: float, known_state: str | None = None, release: bool = False
    ) -> LogsReply:
        """Entries from ``offset``, waiting up to ``wait`` for one, for the job to finish or for its state
        to change (at once if it is no longer ``known_state``, the state the caller last saw); ``release``: the
        entries before ``offset`` are stored by the server and leave this disk."""
        job = self.get(job_id)
        if release:
            job.logs.release(offset)
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
            # Its process has exited and only its settling (the last output drained, the sandbox released) is
            # left: a short wait for it answers with the job's end, not with its last output and then, one more
            # long poll later, its end.
            proc = job.proc
            settle_by = min(deadline, time.monotonic() + SETTLE_WAIT_S)
            while not job.state.finished and proc is not None and proc.returncode is not None:
                remaining = settle_by - time.monotonic()
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
                # written once, in a directory made for it: a file cut short by a crash is one the next start
                # leaves alone, as it does a job whose state was never written
                with open(os.path.join(job_dir, "submission.json"), "x") as f:
                    f.write(json.dumps(sub.redacted().to_dict()))
                job = Job(job_dir, sub, JobState(job_id=sub.job_id, state="pending"))
                job.persist()
                self._jobs[sub.job_id] = job
        if existing is not None:
            return existing.snapshot()  # idempotent
        what = f"image {sub.image}" if sub.image else "a host process"
        job.diag(f"Job {sub.run_name} ({sub.job_id}) received: {what}")
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

    def reserve_address(self, job_id: str) -> str | None:
        """The address the job will have in its sandbox (None without one), reserved from now on."""
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"job id {job_id!r} is not a valid id ([A-Za-z0-9._-], max 128)")
        if not self.sandboxes.available:
            return None
        with self._lock:
            known = set(self._jobs)
        self.sandboxes.release_stale(known)
        return self.sandboxes.slots.address(self.sandboxes.reserve(job_id))

    def stop(self, job_id: str, abort: bool = False, notice: Notice | None = None) -> JobState:
        """Stop the job (``notice``: with a deadline it can read, e.g. a preemption's)."""
        job = self.get(job_id)
        self._stop(job, abort=abort, reason="aborted" if abort else "stopped", notice=notice)
        return job.snapshot()

    def forget(self, job_id: str) -> None:
        job = self.get(job_id)
        with job.cond:
            if not job.state.finished:
                raise JobConflict(f"job {job_id} is {job.state.state}; stop it before deleting it")
        with self._lock:
            self._jobs.pop(job_id, None)
        if self.on_forget is not None:
            self.on_forget(job_id)
        job.sandbox_given_back.wait(SANDBOX_GIVE_BACK_S)  # its end hands its slot on or gives it back first
        if not job.slot_given_back:  # a slot reserved for it and never used, or one its end could not give back
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
                self._stop(j, abort=False, reason=SHUTDOWN)
            self._await(jobs, time.monotonic() + grace + 0.5)
            for j in jobs:
                self._stop(j, abort=True, reason=SHUTDOWN)
            self._await(jobs, time.monotonic() + READER_DRAIN_S + 2.0)
        self.sandboxes.cancel_bridge_check()  # reap takes the bridge down now if no slot is left
        self.sandboxes.spare.stop()  # and gives back the spare network
        self.sandboxes.reap({j.sub.job_id for j in jobs if not j.state.finished})  # and unused reservations
        self.sandboxes.launcher.close()

    @staticmethod
    def _await(jobs: list[Job], deadline: float) -> None:
        for j in jobs:
            with j.cond:
                while not j.state.finished and time.monotonic() < deadline:
                    j.cond.wait(max(0.01, deadline - time.monotonic()))
