"""A new run from a YAML configuration: the page takes a ``.dstack.yml`` document and a project, shows
its plan first (``runs/get_plan``'s: the action, what the scheduler would refuse at once, the offers), and
applies it only when asked from that plan (``runs/apply``, force off). Any project member may, as with the
API; errors are shown on the page, each naming its field, with the document kept as it was typed."""

from __future__ import annotations

from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.api.deps import ctx_of
from corral.schemas.requests import RunPlanBody, RunPlanIn
from corral.services import accounts, runs
from corral.services.errors import InvalidConfiguration, ServiceError
from corral.services.run_apply import apply as apply_run
from corral.ui import auth
from corral.ui.pages_resources import resources_text
from corral.ui.render import page

#: What the form starts with: a small task every local fleet can run.
EXAMPLE = """type: task
name: hello
commands:
  - echo hello from corral
resources:
  cpu: 1..
"""
CONFIGURATION = "configuration"


class Refused(Exception):
    """What the page shows above the form: one line per problem, each naming its field."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def parse_document(text: str) -> dict[str, Any]:
    """The YAML document as a mapping, or :class:`Refused` saying where it is not one."""
    if not text.strip():
        raise Refused([f"{CONFIGURATION}: give a run configuration (type: task, service or dev-environment)"])
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise Refused([f"{CONFIGURATION}: not valid YAML{where}: {problem}"]) from None
    if not isinstance(doc, dict):
        raise Refused([f"{CONFIGURATION}: a mapping of fields (type: task, commands: ...), not {type(doc).__name__}"])
    return doc


def error_lines(e: InvalidConfiguration) -> list[str]:
    """``configuration.resources.gpu: <message>`` for each pydantic error (the request body's prefix
    dropped: the page's user wrote only the configuration)."""
    out = []
    for err in e.errors:
        loc = [str(x) for x in err.get("loc") or () if x not in ("body", "run_spec", "plan")]
        out.append(f"{'.'.join(loc) or CONFIGURATION}: {err.get('msg')}")
    return out


def plan_view(plan: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of ``runs/get_plan``'s answer."""
    jobs = plan.get("job_plans") or []
    first = jobs[0] if jobs else {}
    offers = [
        {**o, "resources": resources_text(o.get("instance")), "instance_name": (o.get("instance") or {}).get("name")}
        for o in first.get("offers") or []
    ]
    effective = (plan.get("effective_run_spec") or {}).get(CONFIGURATION) or {}
    current = plan.get("current_resource") or {}
    return {
        "current_id": current.get("id") or "",
        "current_deployment": current.get("deployment_num", ""),
        "action": plan.get("action"),
        "error": plan.get("corral_plan_error"),
        "jobs": len(jobs),
        "offers": offers,
        "total_offers": first.get("total_offers", 0),
        "max_price": first.get("max_price"),
        "effective": yaml.safe_dump(effective, sort_keys=False),
        "run_name": (plan.get("effective_run_spec") or {}).get("run_name") or effective.get("name"),
    }


def planned_against(form: dict[str, list[str]]) -> dict[str, Any] | None:
    """The run the plan was made against (``current_resource``: its id and deployment), as the plan's form
    carries it: applying then updates that run in place, or is refused if it changed since."""
    run_id = (form.get("current_id") or [""])[0]
    deployment = (form.get("current_deployment") or [""])[0]
    if not run_id:
        return None
    return {"id": run_id, **({"deployment_num": int(deployment)} if deployment.isdigit() else {})}


async def _projects(request: Request, s: auth.Session) -> list[str]:
    found = await accounts.list_projects(ctx_of(request).db, s.user, include_not_joined=False)
    return [p.name for p in found]


async def new_run_form(request: Request) -> Response:
    s = await auth.require(request)
    names = await _projects(request, s)
    chosen = request.query_params.get("project") or (names[0] if names else "")
    return page(
        request, "run_new.html", title="New run", nav="runs", projects=names, project=chosen, text=EXAMPLE,
        plan=None, errors=[],
    )  # fmt: skip


async def new_run_submit(request: Request) -> Response:
    """``step=plan`` shows the plan of the document; ``step=apply`` (the plan's button) submits it."""
    s = await auth.require(request)
    form = await auth.form_of(request, s)
    ctx = ctx_of(request)
    chosen = (form.get("project") or [""])[0].strip()
    text = (form.get(CONFIGURATION) or [""])[0]
    step = (form.get("step") or ["plan"])[0]
    if not chosen:
        raise ServiceError("project: choose the project to run in")
    project = await accounts.project_access(ctx.db, s.user, chosen, "member")
    values: dict[str, Any] = {"title": "New run", "nav": "runs", "project": chosen, "text": text}
    try:
        spec = {"run_spec": {CONFIGURATION: parse_document(text)}}
        if step == "apply":
            planned = RunPlanIn.model_validate({**spec, "current_resource": planned_against(form)})
            run = await apply_run(ctx, project, s.user, planned, False)
            return RedirectResponse(f"/projects/{project.name}/runs/{run['id']}?notice=Submitted", status_code=303)
        plan = await runs.get_plan(ctx, project, s.user, RunPlanBody.model_validate(spec))
    except Refused as e:
        errors = e.lines
    except InvalidConfiguration as e:
        errors = error_lines(e)
    except ServiceError as e:
        errors = [e.msg]
    else:
        names = await _projects(request, s)
        return page(request, "run_new.html", projects=names, errors=[], plan=plan_view(plan), **values)
    names = await _projects(request, s)
    return page(request, "run_new.html", status=400, projects=names, errors=errors, plan=None, **values)
