"""``corral ps``, ``logs``, ``stop`` and ``delete``: looking at and managing runs.

* ``ps``: ``POST /api/runs/list`` with ``only_active: true`` (unless ``-a``), then a second call
  with ``only_active: false, limit: 1`` to learn whether finished runs exist; if so, a hint says
  that only active runs are shown (dstack would show the latest finished run instead).
* ``logs``: ``runs/get`` for the job submission, then ``logs/poll`` page by page.
* ``stop``: ``runs/get`` then ``runs/stop``; ``delete``: ``runs/get`` then ``runs/delete``.
"""

from typing import Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption, YesOption

RunNameArg = Annotated[str, typer.Argument(help="The run's name.", metavar="RUN")]


def ps(
    all_: Annotated[bool, typer.Option("-a", "--all", help="Show finished runs too (the latest 100).")] = False,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Show resources, instance types and errors.")
    ] = False,
    watch: Annotated[bool, typer.Option("-w", "--watch", help="Refresh the table until Ctrl-C.")] = False,
    last: Annotated[
        Optional[int],
        typer.Option("-n", "--last", help="Show only the last N runs; implies --all.", min=1, max=100, metavar="N"),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the runs as JSON.")] = False,
    project: ProjectOption = None,
) -> None:
    """List runs (by default the active ones)."""
    import time

    from corral.cli import render
    from corral.cli.common import client_for
    from corral.cli.errors import CLIError

    if watch and json_:
        raise CLIError("--json cannot be used with --watch")
    client, project_name = client_for(project)
    out = render.console()
    with client:

        def fetch() -> tuple[list[dict[str, Any]], str | None]:
            show_all = all_ or last is not None
            runs = client.runs_list(project_name, only_active=not show_all, limit=last or 100)
            if show_all:
                return runs, None
            latest = client.runs_list(project_name, only_active=False, limit=1)
            if latest and latest[0].get("id") not in {r.get("id") for r in runs}:
                return runs, "Shown only active runs. Use -a to show all."
            return runs, None

        if json_:
            import json

            runs, _ = fetch()
            print(json.dumps({"project": project_name, "runs": runs}))
            return
        if not watch:
            runs, hint = fetch()
            out.print(render.runs_table(runs, verbose))
            for line in _waiting_lines(runs):
                out.print(line, style="secondary", markup=False, highlight=False)
            if hint:
                out.print(f"[secondary]{hint}[/]")
            return
        from rich.console import Group
        from rich.live import Live
        from rich.text import Text

        try:
            with Live(console=out, refresh_per_second=1) as live:
                while True:
                    runs, hint = fetch()
                    table = render.runs_table(runs, verbose)
                    waits = [Text(line, style="grey58") for line in _waiting_lines(runs)]
                    live.update(Group(table, *waits, Text(hint or "", style="grey58")))
                    time.sleep(2)
        except KeyboardInterrupt:
            pass


def _waiting_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One line per waiting run: what it waits for (the scheduler's message), and a scheduled run's next
    trigger (``schedule``)."""
    from corral.cli.common import waiting_reason

    out = []
    for run in runs:
        name = (run.get("run_spec") or {}).get("run_name")
        reason = waiting_reason(run)
        if reason:
            out.append(f"{name}: {reason}")
        trigger = run.get("next_triggered_at")
        if trigger:
            when = str(trigger).replace("T", " ")[:16]
            out.append(f"{name}: next trigger at {when} UTC (schedule)")
    return out


def logs(
    run_name: RunNameArg,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new logs until the run finishes.")
    ] = False,
    diagnose: Annotated[
        bool,
        typer.Option(
            "-d",
            "--diagnose",
            help="Show the agent's own log of the job instead (sandbox, mounts, image, process, exit).",
        ),
    ] = False,
    replica: Annotated[int, typer.Option("--replica", help="The replica number.", metavar="N")] = 0,
    job: Annotated[int, typer.Option("--job", help="The job number inside the replica.", metavar="N")] = 0,
    project: ProjectOption = None,
) -> None:
    """Print a run's logs (of replica 0, job 0 unless told otherwise)."""
    import time

    from corral.cli import formatting
    from corral.cli.common import LogCursor, client_for, get_run_or_fail, job_or_fail

    client, project_name = client_for(project)
    with client:
        run = get_run_or_fail(client, project_name, run_name)
        job_or_fail(run, job, replica)  # a job the run does not have is an error, not job 0's logs
        cursor = LogCursor(client, project_name, run_name, diagnose=diagnose)
        try:
            while True:
                sub = job_or_fail(run, job, replica)
                cursor.drain(str(sub["id"]))
                if not follow or run.get("status") in formatting.FINISHED_RUN_STATUSES:
                    return
                time.sleep(1)
                run = get_run_or_fail(client, project_name, run_name)
        except KeyboardInterrupt:
            return


def stop(
    run_name: RunNameArg,
    abort: Annotated[bool, typer.Option("-x", "--abort", help="Stop at once, without a graceful shutdown.")] = False,
    yes: YesOption = False,
    project: ProjectOption = None,
) -> None:
    """Stop a run."""
    from corral.cli import formatting, render
    from corral.cli.common import client_for, get_run_or_fail
    from corral.cli.errors import CLIError

    client, project_name = client_for(project)
    with client:
        run = get_run_or_fail(client, project_name, run_name)
        if run.get("status") in formatting.FINISHED_RUN_STATUSES:
            raise CLIError(f"Run {run_name} has already finished ({run.get('status')}): nothing to stop")
        if not yes and not render.confirm("Are you sure you want to stop the run?"):
            render.console().print("\nExiting...")
            return
        client.runs_stop(project_name, [run_name], abort=abort)
    render.console().print("Aborted" if abort else "Stopped")


def delete(
    run_name: RunNameArg,
    yes: YesOption = False,
    project: ProjectOption = None,
) -> None:
    """Delete a finished run."""
    from corral.cli import formatting, render
    from corral.cli.common import client_for, get_run_or_fail
    from corral.cli.errors import CLIError

    client, project_name = client_for(project)
    with client:
        run = get_run_or_fail(client, project_name, run_name)
        if run.get("status") not in formatting.FINISHED_RUN_STATUSES:
            raise CLIError(
                f"Run {run_name} is still active ({formatting.run_status_text(run)}): "
                f"stop it first with `corral stop {run_name}`, then delete it"
            )
        if not yes and not render.confirm(f"Delete the run [code]{run_name}[/]?"):
            render.console().print("\nExiting...")
            return
        client.runs_delete(project_name, [run_name])
    render.console().print(f"Run [code]{run_name}[/] deleted")
