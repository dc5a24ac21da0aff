"""Helpers shared by the commands: the ``--project`` option, making a client for a project, and
following a run's logs. Only the standard library and Typer are imported at module level.
"""

from __future__ import annotations

import base64
import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from corral.sdk.client import CorralClient

JSON = dict[str, Any]

ProjectOption = Annotated[
    Optional[str],
    typer.Option(
        "--project",
        help="The project to use (default: the default project in ~/.corral/config.yml).",
        metavar="NAME",
        show_default=False,
    ),
]
YesOption = Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")]


def client_for(project: str | None) -> tuple[CorralClient, str]:
    """A client for ``project`` (or the default project) and the project's name."""
    from corral.sdk import config_file

    entry = config_file.get_project(project)
    from corral.sdk.client import CorralClient  # httpx is imported only once a project is known

    return CorralClient(entry["url"], entry["token"]), entry["name"]


def get_run_or_fail(client: CorralClient, project: str, run_name: str) -> JSON:
    """``runs/get``, turning "not found" into a one-line CLI error."""
    from corral.cli.errors import CLIError
    from corral.sdk.errors import ResourceNotExistsError

    try:
        return client.runs_get(project, run_name)
    except ResourceNotExistsError:
        raise CLIError(f"Run {run_name} not found in project {project}")


def latest_submission(run: JSON, job_num: int = 0, replica_num: int = 0) -> JSON | None:
    """The latest submission of the run's job (replica 0, job 0 by default)."""
    jobs = run.get("jobs") or []
    for job in jobs:
        spec = job.get("job_spec") or {}
        if spec.get("job_num", 0) == job_num and spec.get("replica_num", 0) == replica_num:
            subs = job.get("job_submissions") or []
            if subs:
                return dict(subs[-1])
    sub = run.get("latest_job_submission")
    return dict(sub) if sub else None


def waiting_reason(run: JSON) -> str | None:
    """What a run that waits in the queue waits for (the scheduler's message on its waiting job)."""
    if run.get("status") not in ("submitted", "pending"):
        return None
    for job in run.get("jobs") or []:
        subs = job.get("job_submissions") or []
        if subs and subs[-1].get("corral_waiting"):
            return str(subs[-1]["corral_waiting"])
    sub = run.get("latest_job_submission") or {}
    return str(sub["corral_waiting"]) if sub.get("corral_waiting") else None


def job_or_fail(run: JSON, job_num: int, replica_num: int) -> JSON:
    """The latest submission of the run's job ``job_num`` of replica ``replica_num``, or a CLI error
    naming what the run has."""
    from corral.cli.errors import CLIError

    name = (run.get("run_spec") or {}).get("run_name")
    specs = [j.get("job_spec") or {} for j in run.get("jobs") or []]
    replicas = sorted({s.get("replica_num", 0) for s in specs})
    if replica_num not in replicas:
        raise CLIError(f"Run {name} has no replica {replica_num} (replicas: {', '.join(map(str, replicas))})")
    jobs = sorted(s.get("job_num", 0) for s in specs if s.get("replica_num", 0) == replica_num)
    if job_num not in jobs:
        raise CLIError(f"Run {name} has no job {job_num} in replica {replica_num} (jobs: {', '.join(map(str, jobs))})")
    sub = latest_submission(run, job_num=job_num, replica_num=replica_num)
    if sub is None:
        raise CLIError(f"Job {job_num} of run {name} has not been submitted yet")
    return sub


class LogCursor:
    """Reads a job submission's logs page by page and writes the raw bytes to stdout.

    ``logs/poll``'s ``start_time`` is exclusive, so after the pages run out the cursor asks again
    from the last timestamp it printed; nothing is printed twice.
    """

    def __init__(self, client: CorralClient, project: str, run_name: str, diagnose: bool = False):
        self.client = client
        self.project = project
        self.run_name = run_name
        self.diagnose = diagnose
        self.submission_id: str | None = None
        self.last_timestamp: str | None = None

    def drain(self, submission_id: str) -> int:
        """Print everything new of ``submission_id``; returns how many events were printed."""
        if submission_id != self.submission_id:
            self.submission_id = submission_id
            self.last_timestamp = None
        printed = 0
        next_token: str | None = None
        sys.stdout.flush()
        out = sys.stdout.buffer
        while True:
            page = self.client.logs_poll(
                self.project,
                self.run_name,
                submission_id,
                start_time=None if next_token else self.last_timestamp,
                next_token=next_token,
                diagnose=self.diagnose,
            )
            events = page.get("logs") or []
            for event in events:
                out.write(base64.b64decode(event.get("message") or ""))
                self.last_timestamp = event.get("timestamp") or self.last_timestamp
            if events:
                out.flush()
                printed += len(events)
            next_token = page.get("next_token")
            if not next_token or not events:
                return printed
