"""The runs pages: the list (every project the user can see, finished runs included, filters on project,
status and user; bulk stop), a run's page (configuration, jobs and submissions, status messages, queue
position, service URL and replicas' readiness, the log tail) and Stop / Abort. Each reads and acts
through the services the API's runs routes call, with the same rules (any project member may stop)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import yaml
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.api.deps import ctx_of
from corral.domain.records import ProjectRec
from corral.domain.statuses import FINISHED_RUN
from corral.schemas.requests import ListRunsBody
from corral.services import accounts, runs
from corral.services.errors import ResourceNotExists, ServiceError
from corral.ui import auth
from corral.ui.charts import job_charts
from corral.ui.pages_events import recent
from corral.ui.render import absolute, dollars, iso, page, relative

PAGE_SIZE = 100
FINISHED = FINISHED_RUN
STATUSES = ("pending", "submitted", "provisioning", "running", "terminating", "terminated", "failed", "done")


async def visible_runs(
    request: Request, user: Any, project: str | None, status: str | None, username: str | None, limit: int = PAGE_SIZE
) -> list[dict[str, Any]]:
    """The runs the list shows (newest first), through ``runs.list_runs`` as ``/api/runs/list`` calls it."""
    ctx = ctx_of(request)
    ids = await accounts.member_project_ids(ctx.db, user, [project] if project else None)
    user_id = None
    if username:
        try:
            user_id = (await accounts.find_user(ctx.db, username)).id
        except ResourceNotExists:
            return []
    if not status:
        body = ListRunsBody(include_jobs=True, job_submissions_limit=1, limit=limit)
        found: list[dict[str, Any]] = orjson.loads(orjson.dumps(await runs.list_runs(ctx, ids, body, user_id)))
        return found
    # a status is looked for page by page (``runs/list``'s largest), newest first, among the unfinished runs
    # only for an unfinished status (the service's ``only_active``, as ``runs/list`` has it), and through the
    # latest 1,000 at most
    found = []
    after: tuple[str, str] | None = None
    scanned = 0
    while len(found) < limit and scanned < 1000:
        body = ListRunsBody.model_validate(
            {
                "include_jobs": True,
                "job_submissions_limit": 1,
                "limit": PAGE_SIZE,
                "only_active": status not in FINISHED,
                **({"prev_submitted_at": after[0], "prev_run_id": after[1]} if after is not None else {}),
            }
        )
        batch: list[dict[str, Any]] = orjson.loads(orjson.dumps(await runs.list_runs(ctx, ids, body, user_id)))
        scanned += len(batch)
        found += [r for r in batch if status == "active" or r["status"] == status]
        if len(batch) < PAGE_SIZE:
            break
        after = (batch[-1]["submitted_at"], batch[-1]["id"])
    return found[:limit]


def run_row(r: dict[str, Any]) -> dict[str, Any]:
    """What a row of the list shows of a run (also sent by the live stream for runs that appear)."""
    spec = r.get("run_spec") or {}
    conf = spec.get("configuration") or {}
    latest = r.get("latest_job_submission") or {}
    jpd = latest.get("job_provisioning_data") or {}
    return {
        "id": r["id"],
        "name": spec.get("run_name") or "",
        "project": r["project_name"],
        "user": r["user"],
        "type": conf.get("type") or "",
        "status": r["status"],
        "status_message": r.get("status_message") or r["status"],
        "message": "" if (r.get("status_message") or r["status"]) == r["status"] else r.get("status_message"),
        "submitted_at": r.get("submitted_at"),
        "submitted_iso": iso(r.get("submitted_at")),
        "submitted_abs": absolute(r.get("submitted_at")),
        "submitted_rel": relative(r.get("submitted_at")),
        "fleet": (r.get("fleet") or {}).get("name") or "",
        "backend": where(jpd),
        "cost": dollars(r.get("cost")),
        "finished": r["status"] in FINISHED,
    }


def where(jpd: dict[str, Any]) -> str:
    """Where a job runs, as dstack's CLI says it: ``aws (us-east-1)``; local and SSH hosts by corral's name
    (dstack's wire calls both ``remote``)."""
    name = str(jpd.get("corral_backend") or jpd.get("backend") or "")
    region = jpd.get("region")
    return f"{name} ({region})" if name and region and region != name else name


async def runs_list(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    q = request.query_params
    project, status, username = q.get("project") or None, q.get("status") or None, q.get("user") or None
    found = await visible_runs(request, s.user, project, status, username)
    projects = await accounts.list_projects(ctx.db, s.user, include_not_joined=s.user.global_role == "admin")
    users = await accounts.user_names(ctx.db, s.user)
    return page(
        request,
        "runs.html",
        title="Runs",
        nav="runs",
        rows=[run_row(r) for r in found],
        projects=[p.name for p in projects],
        users=users,
        statuses=("active", *STATUSES),
        f_project=project or "",
        f_status=status or "",
        f_user=username or "",
        notice=q.get("notice") or "",
    )


async def find_run(request: Request, user: Any, project_name: str, run_ref: str) -> tuple[ProjectRec, dict[str, Any]]:
    """The project (the caller must be a member: ``runs/get``'s rule) and the run, by id or by name."""
    project = await accounts.project_access(ctx_of(request).db, user, project_name, "member")
    try:
        uuid.UUID(run_ref)
        by_id = True
    except ValueError:
        by_id = False
    run = await runs.get(ctx_of(request), project, None if by_id else run_ref, run_ref if by_id else None)
    return project, run


def shown_configuration(value: Any) -> Any:
    """A configuration as its author would write it: the fields left unset (null, empty) dropped."""
    if isinstance(value, dict):
        kept = {k: shown_configuration(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, [], {}, "")}
    if isinstance(value, list):
        return [shown_configuration(v) for v in value]
    return value


def _jobs(run: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for j in run.get("jobs") or []:
        spec = j.get("job_spec") or {}
        subs = j.get("job_submissions") or []
        latest = subs[-1] if subs else {}
        out.append(
            {
                "name": spec.get("job_name") or "",
                "replica_num": spec.get("replica_num", 0),
                "job_num": spec.get("job_num", 0),
                "submissions": list(reversed(subs)),
                "latest": latest,
                "resources": (latest.get("job_provisioning_data") or {}).get("instance_type") or {},
                "where": [where(s.get("job_provisioning_data") or {}) for s in reversed(subs)],
            }
        )
    return out


async def run_page(request: Request) -> Response:
    s = await auth.require(request)
    project, run = await find_run(request, s.user, request.path_params["project"], request.path_params["run"])
    spec = run.get("run_spec") or {}
    conf = spec.get("configuration") or {}
    jobs = _jobs(run)
    chosen = request.query_params.get("job") or ""
    log_job = next((j for j in jobs if j["latest"].get("id") == chosen), jobs[0] if jobs else None)
    service = run.get("service")
    replicas = [j for j in jobs if conf.get("type") == "service"]
    found_events = await recent(request, s.user, within_runs=[run["id"]])
    charts = await job_charts(ctx_of(request), project, run, log_job)
    return page(
        request,
        "run.html",
        events=found_events,
        charts=charts,
        title=f"Run {spec.get('run_name')}",
        nav="runs",
        run=run,
        row=run_row(run),
        project=project.name,
        configuration=yaml.safe_dump(shown_configuration(conf), sort_keys=False, default_flow_style=False),
        jobs=jobs,
        log_job=log_job,
        service=service,
        replicas=replicas,
        queue_position=run.get("corral_queue_position"),
        notice=request.query_params.get("notice") or "",
    )


async def _stop(request: Request, user: Any, project_name: str, names: list[str], abort: bool) -> None:
    project = await accounts.project_access(ctx_of(request).db, user, project_name, "member")
    await runs.stop(ctx_of(request), project, names, abort, user)


async def stop_one(request: Request) -> Response:
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    abort = (form.get("abort") or [""])[0] == "1"
    project_name, ref = request.path_params["project"], request.path_params["run"]
    project, run = await find_run(request, s.user, project_name, ref)
    await _stop(request, s.user, project.name, [run["run_spec"]["run_name"]], abort)
    word = "Aborting" if abort else "Stopping"
    return RedirectResponse(f"/projects/{project.name}/runs/{run['id']}?notice={word}", status_code=303)


async def stop_many(request: Request) -> Response:
    """Bulk stop: the checked runs of each project in one ``runs.stop`` (one ``runs/stop`` request's work)."""
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    abort = (form.get("abort") or [""])[0] == "1"
    by_project: dict[str, list[str]] = {}
    for ref in form.get("run") or []:
        project_name, sep, name = ref.partition("/")
        if not sep or not name:
            raise ServiceError(f"Bad run reference {ref!r}: expected project/run")
        by_project.setdefault(project_name, []).append(name)
    if not by_project:
        raise ServiceError("No runs were selected: tick the runs to stop first.")
    # every project's rule is checked before any run is stopped: a refusal stops nothing
    projects = {p: await accounts.project_access(ctx_of(request).db, s.user, p, "member") for p in by_project}
    for project_name, names in by_project.items():
        await runs.stop(ctx_of(request), projects[project_name], names, abort, s.user)
    count = sum(len(n) for n in by_project.values())
    return RedirectResponse(f"/runs?notice={'Aborting' if abort else 'Stopping'}+{count}+run(s)", status_code=303)
