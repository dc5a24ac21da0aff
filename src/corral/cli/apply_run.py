"""``corral apply`` for runs: plan, confirm, submit, then follow the run to its end.

The run's code goes as dstack's CLI sends it (see :mod:`corral.cli.repo_code`): ``repos/init``, the
``files:`` archives, the plan, then -- once confirmed -- ``repos/upload_code`` and ``runs/apply``.

Following means: poll ``runs/get`` while the run is submitted or provisioning (printing each
status change), then stream the job's logs with ``logs/poll`` until the run finishes, and exit
with the job's exit status. Ctrl-C detaches and leaves the run going.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from corral.cli import formatting as f
from corral.cli.common import LogCursor, latest_submission, waiting_reason
from corral.cli.errors import CLIError

if TYPE_CHECKING:
    from corral.cli.repo_code import RepoOptions
    from corral.sdk.client import CorralClient

JSON = dict[str, Any]
_WAITING_RUN = ("submitted", "pending", "provisioning", "terminating")
_WAITING_JOB = ("submitted", "provisioning", "pulling")


def apply_run(  # noqa: C901, PLR0915
    client: CorralClient,
    project: str,
    raw: JSON,
    configuration_path: str,
    yes: bool,
    detach: bool,
    force: bool,
    max_offers: int = 3,
    repo_options: RepoOptions | None = None,
) -> int:
    """Plan, confirm, submit and (unless ``detach``) follow a run; returns the exit code."""
    from pathlib import Path

    from corral.cli import render, repo_code
    from corral.sdk.errors import ClientError

    out = render.console()
    config_dir = Path(configuration_path).expanduser().resolve().parent
    repo = repo_code.for_run(raw, config_dir, repo_options or repo_code.RepoOptions())
    run_spec: JSON = {
        "run_name": raw.get("name"),
        "repo_id": repo.repo_id,
        "repo_data": repo.repo_data,
        "repo_code_hash": repo.code_hash,
        "repo_dir": repo_code.repo_dir_of(raw),
        "file_archives": [],
        "configuration_path": configuration_path,
        "configuration": raw,
        "profile": {"name": "default"},
    }
    try:
        with out.status("Getting apply plan..."):
            if repo.repo_id == repo_code.VIRTUAL:
                client.repos_init_virtual(project)
            else:
                client.repos_init(project, repo.repo_id, repo.repo_info, repo.repo_creds)
            run_spec["file_archives"] = repo_code.upload_files(client, raw, config_dir)
            plan = client.runs_get_plan(project, run_spec, max_offers=max_offers)
    except ClientError as e:
        raise CLIError(str(e))
    job_plans = plan.get("job_plans") or [{}]
    no_fleets = not job_plans[0].get("offers") and not client.fleets_list(project)
    print_run_plan(plan, no_fleets)

    run_name = run_spec["run_name"] or (plan.get("run_spec") or {}).get("run_name")
    run_spec["run_name"] = run_name
    question = f"Submit the run [code]{run_name}[/]?" if run_name else "Submit a new run?"
    current = plan.get("current_resource")
    stop_first = False
    if current is not None:
        effective = plan.get("effective_run_spec") or plan.get("run_spec") or {}
        unchanged = (current.get("run_spec") or {}).get("configuration") == effective.get("configuration")
        if plan.get("action") == "update" and not unchanged:
            out.print(f"Active run [code]{run_name}[/] already exists. Detected changes that can be updated in-place.")
            question = "Update the run?"
        elif current.get("status") not in f.FINISHED_RUN_STATUSES:
            if unchanged:
                out.print(f"Active run [code]{run_name}[/] already exists. Detected no changes.")
                if yes and not force:
                    out.print("Use --force to apply anyway.")
                    return 0
            else:
                out.print(
                    f"Active run [code]{run_name}[/] already exists. "
                    "Detected changes that [error]cannot[/] be updated in-place."
                )
            question, stop_first = "Stop and override the run?", True
    if not yes and not render.confirm(question):
        out.print("\nExiting...")
        return 0
    if stop_first and run_name:
        with out.status("Stopping run..."):
            client.runs_stop(project, [run_name], abort=False)
            while client.runs_get(project, run_name).get("status") not in f.FINISHED_RUN_STATUSES:
                time.sleep(1)
    try:
        with out.status("Applying plan..."):
            if repo.code_hash is not None:
                client.repos_upload_code(project, repo.repo_id, repo.code_hash, repo.code)
            run = client.runs_apply(project, {"run_spec": run_spec, "current_resource": current}, force)
    except ClientError as e:
        raise CLIError(str(e))
    name = str((run.get("run_spec") or {}).get("run_name") or run_name)
    if detach:
        verb = "updated" if plan.get("action") == "update" and current is not None else "submitted"
        out.print(f"Run [code]{name}[/] {verb}, detaching...")
        if run.get("service"):
            print_service_urls(client.url, run)
        return 0
    try:
        return follow_run(client, project, run)
    except KeyboardInterrupt:
        out.print(f"\nDetached; the run keeps going. Stop it with `corral stop {name}`")
        return 0


def print_service_urls(server_url: str, run: JSON) -> None:
    """Where a service is published (its path joined onto the server's URL, as dstack's CLI does)."""
    from corral.cli import render

    service = run.get("service") or {}
    if not service.get("url"):
        return
    out = render.console()
    url = f.proxy_url(server_url, str(service["url"]))
    out.print(f"Service is published at:\n  [link={url}]{url}[/]", highlight=False)
    model = service.get("model") or {}
    if model.get("base_url"):
        base = f.proxy_url(server_url, str(model["base_url"]))
        out.print(f"Model [code]{model.get('name')}[/] is published at:\n  [link={base}]{base}[/]", highlight=False)


def print_run_plan(plan: JSON, no_fleets: bool = False) -> None:
    """The plan's properties and its offers, as ``dstack apply`` prints them."""
    from corral.cli import render

    spec = plan.get("effective_run_spec") or plan.get("run_spec") or {}
    conf = spec.get("configuration") or {}
    job_plan = (plan.get("job_plans") or [{}])[0]
    job_spec = job_plan.get("job_spec") or {}
    req = job_spec.get("requirements") or {}
    profile = f.merged_profile(spec)

    conf_type = str(conf.get("type") or "")
    if conf_type == "task":
        conf_type += f" (nodes={conf.get('nodes') or 1})"
    idle = f.parse_duration(profile.get("idle_duration"))
    if idle is None:
        idle = f.DEFAULT_IDLE_DURATION
    max_duration = f.parse_duration(job_spec.get("max_duration"))
    rows = [
        ("Project", str(plan.get("project_name") or "")),
        ("User", str(plan.get("user") or "")),
        ("Configuration", str(spec.get("configuration_path") or "?")),
        ("Type", conf_type),
        ("Resources", f.format_resources_spec(req.get("resources"))),
        ("Spot policy", f.format_spot(req.get("spot"))),
        ("Max price", f.format_max_price(req.get("max_price"))),
        ("Retry policy", f.format_retry(job_spec.get("retry"))),
        ("Creation policy", str(profile.get("creation_policy"))),
        ("Idle duration", "-" if idle < 0 else f.format_duration(idle)),
        ("Max duration", f.format_duration(max_duration) if max_duration and max_duration > 0 else "off"),
    ]
    if conf.get("type") == "dev-environment":
        inactivity = f.parse_duration(conf.get("inactivity_duration"))
        rows.append(("Inactivity duration", f.format_duration(inactivity) if inactivity and inactivity > 0 else "off"))
    if conf.get("reservation"):
        rows.append(("Reservation", str(conf["reservation"])))
    out = render.console()
    out.print(render.props_table(rows))
    out.print()
    offers = job_plan.get("offers") or []
    if offers:
        render.print_offers(offers, int(job_plan.get("total_offers") or len(offers)), job_plan.get("max_price"))
    else:
        out.print(render.NO_FLEETS_WARNING if no_fleets else render.NO_OFFERS_WARNING)
    if plan.get("corral_plan_error"):  # the scheduler's verdict: this run would fail at once
        out.print(
            f"The run cannot be placed: {plan['corral_plan_error']}", style="error", markup=False, highlight=False
        )
        out.print()


def _ready(run: JSON) -> bool:
    if run.get("status") in _WAITING_RUN:
        return False
    sub = latest_submission(run)
    return not (sub and sub.get("status") in _WAITING_JOB and run.get("status") not in f.FINISHED_RUN_STATUSES)


def follow_run(client: CorralClient, project: str, run: JSON) -> int:  # noqa: C901
    """Show status changes until the run runs, stream its logs, return its exit code."""
    from rich.markup import escape

    from corral.cli import render

    out = render.console()
    name = str((run.get("run_spec") or {}).get("run_name"))
    shown = ""
    attempt = 0
    with out.status(f"Launching [code]{name}[/]...") as spinner:
        while not _ready(run):
            text = f.run_status_text(run)
            reason = waiting_reason(run)
            if reason:
                text = escape(f"{text} ({reason})")
            if text != shown:
                shown = text
                if out.is_terminal:
                    spinner.update(f"Launching [code]{name}[/]... [secondary]{text}[/]")
                else:
                    out.print(f"[code]{name}[/] {text}")
            time.sleep(0.25 if attempt < 20 else 1.0)
            attempt += 1
            run = client.runs_get(project, name)
    cursor = LogCursor(client, project, name)
    if run.get("status") in f.FINISHED_RUN_STATUSES:
        first = latest_submission(run) or {}
        if run.get("status") != "done" and first.get("exit_status") is None:
            raise CLIError(failure_message(run))
    else:
        out.print(render.runs_table([run]))
        out.print(f"\n[code]{name}[/] provisioning completed [secondary]({run.get('status')})[/]")
        if run.get("service"):
            print_service_urls(client.url, run)
    if run.get("status") not in f.FINISHED_RUN_STATUSES:
        from corral.cli.attach_cmd import stream_attached

        # the output from the job's /logs_ws over its SSH endpoint (the ports forwarded meanwhile), as
        # dstack's attached apply reads it; then the final status, which the server knows by then
        if stream_attached(client, run):
            deadline = time.monotonic() + 30
            while run.get("status") not in f.FINISHED_RUN_STATUSES and time.monotonic() < deadline:
                time.sleep(0.2)
                run = client.runs_get(project, name)
            if run.get("status") in f.FINISHED_RUN_STATUSES:
                return _finish(run)
            raise CLIError(f"Lost run connection: run {name} is still {run.get('status')}")
    while True:
        sub = latest_submission(run)
        if sub is not None:
            cursor.drain(str(sub["id"]))
        if run.get("status") in f.FINISHED_RUN_STATUSES:
            if sub is not None:
                cursor.drain(str(sub["id"]))
            return _finish(run)
        time.sleep(0.5)
        run = client.runs_get(project, name)


def failure_message(run: JSON) -> str:
    """Why a run ended without running: the job's ``termination_reason_message`` or status."""
    name = (run.get("run_spec") or {}).get("run_name")
    sub = latest_submission(run) or {}
    status = f.run_status_text(run)
    detail = sub.get("termination_reason_message") or sub.get("error") or run.get("error") or ""
    if status in ("stopped", "aborted", "terminated"):
        return f"Run {name} was {status} before it started"
    return f"Run {name} failed ({status})" + (f": {detail}" if detail else "")


def _finish(run: JSON) -> int:
    from rich.markup import escape

    from corral.cli import render

    out = render.console()
    sub = latest_submission(run) or {}
    text = f.job_status_text(sub) if sub else f.run_status_text(run)
    if run.get("status") == "done":
        out.print(f"[code]{escape(text.capitalize())}[/]")
        return 0
    line = f"[error]{escape(text.capitalize())}[/]"
    if sub.get("error"):
        line += f" ([error]{escape(str(sub['error']).capitalize())}[/])"
    out.print(line)
    if sub.get("termination_reason_message"):
        out.print(str(sub["termination_reason_message"]), style="error", markup=False, highlight=False)
    exit_status = sub.get("exit_status")
    return min(exit_status, 255) if isinstance(exit_status, int) and exit_status > 0 else 1
