"""Records -> dstack's wire objects (User, Project, Fleet, Instance, Run, Job, JobSubmission).

Every enum value is one dstack's client knows: local instances go on the wire as backend ``remote``
with corral's own name in the extra field ``corral_backend``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from corral.domain import costs, inactivity
from corral.domain.access import can_manage_secrets
from corral.domain.cron import next_trigger
from corral.domain.documents import spec_configuration
from corral.domain.fleets import without_ssh_keys
from corral.domain.records import FleetRec, InstanceRec, JobRec, MemberRec, ProjectRec, RunRec, UserRec
from corral.domain.statuses import FINISHED_RUN
from corral.scheduler.preemption import PREEMPTED_PREFIX
from corral.schemas import wire
from corral.services.credentials import revealed
from corral.services.service_runs import service_field
from corral.store.encryption import Cipher

WIRE_BACKEND = {"local": "remote", "ssh": "remote"}


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return _iso(ts)


@functools.lru_cache(maxsize=65536)
def _iso(ts: float) -> str:
    """Stored times repeat on every read of a run: format each once."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def user(u: UserRec) -> dict[str, Any]:
    return {
        "id": u.id,
        "username": u.name,
        "created_at": iso(u.created_at),
        "global_role": u.global_role,
        "email": u.email,
        "active": u.active,
        "permissions": {"can_create_projects": True},
        "ssh_public_key": u.ssh_public_key,
    }


def user_with_creds(u: UserRec, cipher: Callable[[], Cipher]) -> dict[str, Any]:
    """dstack's ``UserWithCreds``: the token and private key opened (they are stored sealed)."""
    shown = revealed(cipher, u)
    return {**user(shown), "creds": {"token": shown.token}, "ssh_private_key": shown.ssh_private_key}


def project(
    p: ProjectRec, members: list[MemberRec] | None = None, managers_manage_secrets: bool = False
) -> dict[str, Any]:
    return {
        "project_id": p.id,
        "project_name": p.name,
        "owner": user(p.owner),
        "created_at": iso(p.created_at),
        "backends": [
            {
                "name": WIRE_BACKEND.get(b["type"], b["type"]),
                "config": {"type": WIRE_BACKEND.get(b["type"], b["type"])},
            }
            for b in p.backends
        ]
        if members is not None
        else [],
        "members": [
            {
                "user": user(m.user),
                "project_role": m.project_role,
                "permissions": {
                    "can_manage_ssh_fleets": True,
                    "can_manage_secrets": can_manage_secrets(
                        m.user.global_role, m.project_role, managers_manage_secrets
                    ),
                },
            }
            for m in (members or [])
        ],
        "is_public": p.is_public,
        "templates_repo": None,
    }


def instance(i: InstanceRec) -> dict[str, Any]:
    return {
        "id": i.id,
        "project_name": i.project_name,
        "backend": WIRE_BACKEND.get(i.backend, i.backend),
        "corral_backend": i.backend,
        "instance_type": wire.instance_type(i.offer),
        "name": i.name,
        "fleet_id": i.fleet_id,
        "fleet_name": i.fleet_name,
        "instance_num": i.instance_num,
        "job_name": i.job_name,
        "hostname": i.hostname,
        "status": i.status,
        "unreachable": i.unreachable,
        "health_status": "healthy",
        "termination_reason": i.termination_reason,
        "termination_reason_message": i.termination_reason_message,
        "created": iso(i.created_at),
        "finished_at": iso(i.finished_at),
        "region": i.region,
        "availability_zone": None,
        "price": i.price,
        "total_blocks": i.total_blocks,
        "busy_blocks": i.busy_blocks,
        "gpu_driver": None,
        # corral's: what the backend says of a live instance (a Slurm allocation's time limit, why it pends)
        "status_message": i.status_message if i.status not in ("terminating", "terminated") else None,
    }


def _failed_host(i: InstanceRec) -> bool:
    """An SSH fleet's host whose bootstrap failed: it stays listed, with its error, until applied again."""
    return i.backend == "ssh" and i.status == "terminated" and i.termination_reason == "error"


def fleet(f: FleetRec) -> dict[str, Any]:
    shown = [i for i in f.instances if i.status != "terminated" or f.status == "terminated" or _failed_host(i)]
    failed = [i for i in shown if _failed_host(i)]
    status_message = f.status_message
    if failed and f.status == "active":  # every failed host's error, rather than the last failure alone
        hosts = len((spec_configuration(f.spec).get("ssh_config") or {}).get("hosts") or [])
        status_message = f"{len(failed)} of {hosts} hosts failed: " + "; ".join(
            str(i.termination_reason_message or i.hostname) for i in failed
        )
    return {
        "id": f.id,
        "name": f.name,
        "project_name": f.project_name,
        "spec": without_ssh_keys(f.spec),
        "created_at": iso(f.created_at),
        "status": f.status,
        "status_message": status_message,
        "instances": [instance(i) for i in shown],
    }


def _job_status_message(j: JobRec) -> str:
    """The words dstack's server puts here (``_get_job_status_message``); its CLI shows them in ``ps``."""
    if j.status == "failed" and j.termination_reason == "failed_to_start_due_to_no_capacity":
        if "No matching fleet found" in (j.termination_reason_message or ""):
            return "no fleets"
        return j.status_message or "no capacity"  # or why the instance could not be had: a quota, no image...
    if j.status == "failed" and j.termination_reason == "container_exited_with_error":
        return f"exited ({j.exit_status})" if j.exit_status is not None else "error"
    if j.status == "failed" and j.termination_reason == "interrupted_by_no_capacity":
        # dstack's word, or the run that preempted it (not a message of the job's running, such as the sandbox's)
        preempted = j.termination_reason_message or ""
        return preempted if preempted.startswith(PREEMPTED_PREFIX) else "interrupted"
    if j.status == "failed":
        return j.status_message or "error"
    if j.status == "done":
        return "exited (0)"
    if j.status == "terminated" and j.termination_reason == "terminated_by_user":
        return "stopped"
    if j.termination_reason == "aborted_by_user":
        return "aborted"
    return j.status_message or j.status


def job_submission(j: JobRec, idle_limit: int | None = None) -> dict[str, Any]:
    runtime = dict(j.job_runtime_data) if j.job_runtime_data is not None else None
    # the pull's progress rides in the runtime data (workers/jobs/container.py); dstack has it alongside
    pull_progress = runtime.pop("image_pull_progress", None) if runtime is not None else None
    return {
        "id": j.id,
        "submission_num": j.submission_num,
        "deployment_num": j.deployment_num,
        "submitted_at": iso(j.submitted_at),
        "last_processed_at": iso(j.last_processed_at),
        "finished_at": iso(j.finished_at),
        # as dstack's: a running dev environment with ``inactivity_duration`` shows how long it has been idle
        "inactivity_secs": inactivity.inactive_secs(j.ssh_seen_at, time.time())
        if idle_limit is not None and j.status == "running" and j.ssh_seen_at is not None
        else None,
        "status": j.status,
        "status_message": _job_status_message(j),
        "termination_reason": j.termination_reason,
        "termination_reason_message": j.termination_reason_message,
        "exit_status": j.exit_status,
        "job_provisioning_data": j.job_provisioning_data,
        "job_runtime_data": runtime,
        "error": None,
        # one per probe of the spec (a replica without probes is probed at its port: not shown, as dstack)
        "probes": [{"success_streak": int(p.get("success_streak") or 0)} for p in j.probes]
        if j.probes and j.job_spec.get("probes")
        else [],
        "image_pull_progress": pull_progress if j.status == "pulling" else None,
        "corral_waiting": j.status_message if j.status == "submitted" else None,
        # corral: a service replica the proxy routes to now (its probes pass); None for other jobs
        "corral_ready": j.ready if j.status == "running" or j.ready is None else False,
    }


#: dstack's IDEs: the name it shows and the scheme of its links (``ides/*.py``).
IDES = {
    "vscode": ("VS Code", "vscode"),
    "cursor": ("Cursor", "cursor"),
    "windsurf": ("Windsurf", "windsurf"),
    "zed": ("Zed", "zed"),
}


def ide_url(ide: str, authority: str, working_dir: str) -> str:
    scheme = IDES[ide][1]
    if ide == "zed":
        return f"zed://ssh/{authority}{working_dir}"
    return f"{scheme}://vscode-remote/ssh-remote+{authority}{working_dir}"


def job_connection_info(r: RunRec, j: JobRec) -> dict[str, Any] | None:
    """dstack's ``job_connection_info`` of a running job (null otherwise): the host the attached CLI names
    (the run, or the job's name for jobs other than 0/0), and a dev environment's IDE link."""
    if j.status != "running":
        return None
    host = r.run_name if (j.job_num, j.replica_num) == (0, 0) else j.job_name
    conf = spec_configuration(r.run_spec)
    ide = str(conf.get("ide") or "") if conf.get("type") == "dev-environment" else ""
    working_dir = (j.job_runtime_data or {}).get("working_dir")
    known = ide in IDES
    return {
        "ide_name": IDES[ide][0] if known else None,
        "attached_ide_url": ide_url(ide, host, working_dir) if known and working_dir else None,
        "proxied_ide_url": None,
        "attached_ssh_command": ["ssh", host],
        "proxied_ssh_command": None,
        "sshproxy_hostname": None,
        "sshproxy_port": None,
        "sshproxy_upstream_id": None,
    }


def jobs(r: RunRec) -> list[dict[str, Any]]:
    idle_limit = inactivity.duration_of(dict(spec_configuration(r.run_spec)))
    grouped: dict[tuple[int, int], list[JobRec]] = {}
    for j in r.jobs:
        grouped.setdefault((j.replica_num, j.job_num), []).append(j)
    out = []
    for key in sorted(grouped):
        subs = sorted(grouped[key], key=lambda j: j.submission_num)
        out.append(
            {
                "job_spec": subs[-1].job_spec,
                "job_submissions": [job_submission(s, idle_limit) for s in subs],
                "job_connection_info": job_connection_info(r, subs[-1]),
            }
        )
    return out


def next_triggered_at(r: RunRec, now: float | None = None) -> str | None:
    """A scheduled run's next trigger, as dstack 0.22.5 shows it: none once the run has finished; the one a
    pending run waits for; else (the run is executing a trigger) the next one after now."""
    if r.next_triggered_at is None or r.status in FINISHED_RUN:
        return None
    if r.status == "pending":
        return iso(r.next_triggered_at)
    conf = spec_configuration(r.run_spec)
    schedule = conf.get("schedule") or (r.run_spec.get("profile") or {}).get("schedule") or {}
    crons = schedule.get("cron") or []
    upcoming = next_trigger([crons] if isinstance(crons, str) else crons, time.time() if now is None else now)
    return iso(upcoming) if upcoming is not None else None


def _preempted_by(subs: list[dict[str, Any]]) -> str | None:
    """While a preempted run's new submission waits, the message of the submission preempted, which
    names the run that preempted it; None for any other retry."""
    if len(subs) < 2 or subs[-1]["status"] != "submitted":
        return None
    prev = subs[-2]
    message = prev.get("termination_reason_message") or ""
    if prev["termination_reason"] == "interrupted_by_no_capacity" and message.startswith(PREEMPTED_PREFIX):
        return str(message)
    return None


def run(r: RunRec, queue_position: int | None = None, now: float | None = None) -> dict[str, Any]:
    """dstack's Run; its ``cost`` is counted over the submissions loaded (all of them, or the latest
    ``job_submissions_limit`` of each job a list asked for, as dstack's), those still going up to ``now``."""
    js = jobs(r)
    latest = None
    if js:
        latest = js[0]["job_submissions"][-1] if js[0]["job_submissions"] else None
    status_message = r.status_message
    if status_message is None:
        status_message = latest["status_message"] if latest and r.status not in ("done",) else r.status
        if r.status in ("done", "pending"):  # pending: a scheduled run between triggers (its jobs ended)
            status_message = r.status
        if r.status == "submitted" and latest and latest.get("corral_waiting"):
            status_message = "pending"
        if r.status == "submitted" and latest and latest["submission_num"] > 0:
            status_message = _preempted_by(js[0]["job_submissions"]) or "retrying"  # as dstack words a retry
    out = {
        "id": r.id,
        "project_name": r.project_name,
        "user": r.user_name,
        "fleet": {"id": r.fleet_id, "name": r.fleet_name} if r.fleet_id and r.fleet_name else None,
        "submitted_at": iso(r.submitted_at),
        "last_processed_at": iso(r.last_processed_at),
        "status": r.status,
        "status_message": status_message,
        "termination_reason": r.termination_reason,
        "run_spec": r.run_spec,
        "jobs": js,
        "latest_job_submission": latest,
        "cost": costs.run_cost(r.jobs, time.time() if now is None else now),
        "service": service_field(r.project_name, r.run_name, spec_configuration(r.run_spec), r.gateway),
        "deployment_num": r.deployment_num,
        "error": None,
        "deleted": r.deleted,
        "next_triggered_at": next_triggered_at(r),
    }
    if queue_position is not None:
        out["corral_queue_position"] = queue_position
    return out
