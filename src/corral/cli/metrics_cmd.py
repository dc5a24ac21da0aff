"""``corral metrics RUN [--watch] [--replica N] [--job N]``: each job's latest CPU, memory and GPU use.

Like ``dstack metrics``: every job of the run by default (``--replica``/``--job`` narrow it), from
``GET metrics/job/{run}`` (the latest two samples: CPU needs a difference). One row per job: its name and
status, ``CPU`` (percent of one core, above 100 on several), ``MEMORY`` (working set / the job's total),
then one ``gpu=N`` cell per GPU (utilisation and memory). ``--watch`` refreshes every 2 s until Ctrl-C.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption

if TYPE_CHECKING:
    from rich.table import Table

    from corral.sdk.client import CorralClient

WATCH_INTERVAL = 2.0


def _latest(metrics: dict[str, Any], name: str) -> Any:
    for m in metrics.get("metrics") or []:
        if m.get("name") == name and m.get("values"):
            return m["values"][0]
    return None


def _gb(value: Any) -> str:
    return f"{value / 10**9:.1f}GB" if isinstance(value, (int, float)) else "-"


def job_cells(metrics: dict[str, Any]) -> tuple[str, str, str]:
    """(CPU, MEMORY, GPU) cells of one job's series; ``-`` where there is no sample yet."""
    cpu = _latest(metrics, "cpu_usage_percent")
    used = _latest(metrics, "memory_working_set_bytes")
    total = _latest(metrics, "memory_total_bytes")
    memory = "-" if used is None else (f"{_gb(used)}/{_gb(total)}" if total else _gb(used))
    gpus = []
    for i in range(int(_latest(metrics, "gpus_detected_num") or 0)):
        util = _latest(metrics, f"gpu_util_percent_gpu{i}")
        mem = _latest(metrics, f"gpu_memory_usage_bytes_gpu{i}")
        gpu_total = _latest(metrics, "gpu_memory_total_bytes")
        gpus.append(f"gpu={i} {util}% {_gb(mem)}/{_gb(gpu_total)}" if gpu_total else f"gpu={i} {util}% {_gb(mem)}")
    return ("-" if cpu is None else f"{cpu}%"), memory, "\n".join(gpus) or "-"


def _jobs(run: dict[str, Any], replica: int | None, job: int | None) -> list[dict[str, Any]]:
    out = []
    for j in run.get("jobs") or []:
        spec = j.get("job_spec") or {}
        if (replica is None or spec.get("replica_num") == replica) and (job is None or spec.get("job_num") == job):
            out.append(j)
    return out


def metrics_table(client: CorralClient, project: str, run_name: str, replica: int | None, job: int | None) -> Table:
    from rich.table import Table

    from corral.cli.errors import CLIError

    run = client.runs_get(project, run_name)
    jobs = _jobs(run, replica, job)
    if not jobs:
        wanted = " ".join(f"{k}={v}" for k, v in (("replica", replica), ("job", job)) if v is not None)
        raise CLIError(f"Run {run_name} has no job matching {wanted}")
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "STATUS", "CPU", "MEMORY", "GPU"):
        table.add_column(column, no_wrap=column != "GPU")
    for j in jobs:
        spec = j.get("job_spec") or {}
        subs = j.get("job_submissions") or [{}]
        series = client.job_metrics(
            project, run_name, int(spec.get("replica_num") or 0), int(spec.get("job_num") or 0), 1
        )
        table.add_row(str(spec.get("job_name") or ""), str(subs[-1].get("status") or ""), *job_cells(series))
    return table


def metrics(
    run_name: Annotated[str, typer.Argument(metavar="RUN", help="The run whose jobs to show.")],
    watch: Annotated[bool, typer.Option("-w", "--watch", help="Refresh every 2 s until Ctrl-C.")] = False,
    replica: Annotated[
        Optional[int], typer.Option("--replica", min=0, help="Show only this replica (default: all jobs).")
    ] = None,
    job: Annotated[
        Optional[int], typer.Option("--job", min=0, help="Show only this job number (default: all).")
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Show the CPU, memory and GPU use of a run's jobs."""
    import time

    from corral.cli import render
    from corral.cli.common import client_for

    client, project_name = client_for(project)
    out = render.console()
    with client:
        if not watch:
            out.print(metrics_table(client, project_name, run_name, replica, job))
            return
        from rich.live import Live

        try:
            with Live(console=out, refresh_per_second=1) as live:
                while True:
                    live.update(metrics_table(client, project_name, run_name, replica, job))
                    time.sleep(WATCH_INTERVAL)
        except KeyboardInterrupt:
            pass
