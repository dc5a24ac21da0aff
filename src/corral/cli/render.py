"""Rich output of the CLI: consoles, the confirmation prompt and the tables dstack's CLI prints
(runs, fleets, offers, plan properties). Imported lazily by the commands, never at start-up.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.theme import Theme

from corral.cli import formatting as f
from corral.cli import table_fit as tf
from corral.cli.errors import CLIError

JSON = dict[str, Any]

_THEME = Theme(
    {
        "secondary": "grey58",
        "success": "green",
        "warning": "yellow",
        "error": "red",
        "code": "bold sea_green3",
    }
)

NO_OFFERS_WARNING = (
    "[warning]No matching instance offers available: no fleet of this project has, or may create, an "
    "instance with the resources asked for.\n"
    "See what the fleets have with [code]corral fleet -v[/] and what they could offer with [code]corral offer[/]; "
    "or apply a fleet that fits, e.g. [code]corral apply -f examples/fleet.dstack.yml[/].[/]\n"
)
NO_FLEETS_WARNING = (
    "[error]The project has no fleets: a run needs one to run on.\n"
    "Apply a fleet first, e.g. [code]corral apply -f examples/fleet.dstack.yml[/] (one on this machine), "
    "then apply the run again.[/]\n"
)
NO_FLEET_OFFERS_WARNING = (
    "[warning]No matching instance offers available: no backend of this project can create an instance "
    "with these resources.\n"
    "See what they offer with [code]corral offer[/] (e.g. [code]corral offer --gpu 1[/]); ask for less, "
    "or list hosts you have in an SSH fleet (examples/ssh-fleet.dstack.yml).[/]\n"
)

_console: Console | None = None


def console() -> Console:
    """The stdout console (created on first use, so tests that swap ``sys.stdout`` see output)."""
    global _console
    if _console is None:
        _console = Console(theme=_THEME, highlight=False)
    return _console


def reset_console() -> None:
    """Forget the console (tests that run the CLI in-process call it between runs)."""
    global _console
    _console = None


def th(text: str) -> str:
    """A bold property name."""
    return f"[bold]{text}[/bold]"


def confirm(prompt: str) -> bool:
    """Ask ``prompt [y/n]``; a closed stdin is an error telling the user about ``-y``."""
    out = console()
    while True:
        try:
            answer = out.input(f"{prompt} [bold magenta]\\[y/n][/]: ")
        except EOFError:
            out.print()
            raise CLIError(f"{_plain(prompt)} Cannot ask: stdin is closed. Pass -y to confirm.")
        answer = answer.strip().lower()
        if answer in ("y", "yes"):
            return True
        if answer in ("n", "no"):
            return False
        out.print("[error]Please enter Y or N[/]")


def _plain(text: str) -> str:
    from rich.text import Text

    return Text.from_markup(text).plain


def props_table(rows: Sequence[tuple[str, str]]) -> Table:
    """A two-column borderless table of bold names and values (plan headers)."""
    table = Table(box=None, show_header=False)
    table.add_column(no_wrap=True)
    table.add_column()
    for name, value in rows:
        table.add_row(th(name), escape(value))
    return table


_QUOTA_COLUMNS = ("nominal", "max", "used", "borrowed", "entitlement", "capacity")


def _quota_rows(usage: JSON) -> list[tuple[str, dict[str, Any]]]:
    """One row per resource any column names (GPUs per model, then ``gpu`` in all, cpu, memory, ...)."""
    rows: dict[str, dict[str, Any]] = {}
    for col in _QUOTA_COLUMNS:
        for key, value in (usage.get(col) or {}).items():
            if key == "gpu" and isinstance(value, dict):
                for model, amount in value.items():
                    rows.setdefault("gpu" if model == "any" else f"gpu {model}", {})[col] = amount
            else:
                rows.setdefault(key, {})[col] = value
    order = ["cpu", "memory", "instances", "price_per_hour"]
    return sorted(
        rows.items(),
        key=lambda kv: (
            kv[0] != "gpu" and not kv[0].startswith("gpu "),
            order.index(kv[0]) if kv[0] in order else -1,
            kv[0],
        ),
    )


def _amount(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(int(value)) if isinstance(value, (int, float)) else str(value)


def quota_table(usage: JSON) -> Table:
    """``corral project quota``: one row per resource, with the project's weight and share in the title."""
    share = usage.get("weighted_share")
    title = (
        f"project {usage.get('project_name', '')}  weight {_amount(usage.get('weight'))}"
        f"  weighted share {share if share is not None else '-'}"
    )
    table = Table(box=None, title=escape(title), title_justify="left")
    table.add_column("RESOURCE", no_wrap=True)
    for col in _QUOTA_COLUMNS:
        table.add_column(col.upper(), justify="right", no_wrap=True)
    for name, values in _quota_rows(usage):
        table.add_row(escape(name), *(_amount(values.get(col)) for col in _QUOTA_COLUMNS))
    return table


def _expand() -> bool:
    return shutil.get_terminal_size(fallback=(120, 40)).columns <= 110


# ---- offers -------------------------------------------------------------------------------


def offers_table(offers: Sequence[JSON], total_offers: int, mute_tail_rows: bool = True) -> Table:
    """``#  BACKEND  RESOURCES  INSTANCE TYPE  PRICE`` as ``dstack offer`` and ``apply`` print it."""
    table = Table(box=None, expand=_expand())
    table.add_column("#")
    table.add_column("BACKEND", style="grey58", ratio=2)
    table.add_column("RESOURCES", ratio=4)
    table.add_column("INSTANCE TYPE", style="grey58", no_wrap=True, ratio=2)
    table.add_column("PRICE", style="grey58", ratio=1)
    table.add_column()
    for i, offer in enumerate(offers, start=1):
        instance = offer.get("instance") or {}
        name = str(instance.get("name") or "")
        total_blocks = offer.get("total_blocks") or 1
        if total_blocks > 1:
            name += f" ({offer.get('blocks')}/{total_blocks})"
        availability = str(offer.get("availability") or "")
        table.add_row(
            str(i),
            f.format_backend(offer.get("backend"), offer.get("region"), offer.get("corral_backend")),
            f.format_instance_resources(instance.get("resources"), include_spot=True),
            escape(name),
            f.format_price(offer.get("price")),
            "" if availability in ("", "unknown", "available") else availability.replace("_", " "),
            style=None if i == 1 or not mute_tail_rows else "secondary",
        )
    if total_offers > len(offers):
        table.add_row("", "...", style="secondary")
    return table


def print_offers(offers: Sequence[JSON], total_offers: int, max_price: float | None) -> None:
    """The offers table, the ``Shown N of M offers`` line, or the no-offers warning."""
    out = console()
    if not offers:
        out.print(NO_OFFERS_WARNING)
        return
    out.print(offers_table(offers, total_offers))
    if total_offers > len(offers):
        price = f"${max_price or 0:3f}".rstrip("0").rstrip(".")
        out.print(f"[secondary] Shown {len(offers)} of {total_offers} offers, {price} max[/]")
    out.print()


# ---- runs ---------------------------------------------------------------------------------


def _status_cell(text: str, status: str) -> str:
    return f"[{f.status_style(text, status)}]{escape(text)}[/]"


def _job_cells(submission: JSON) -> dict[str, str]:
    cells = {
        "RESOURCES": "-",
        "GPU": "-",
        "PRICE": "-",
        "COST": "",
        "BACKEND": "-",
        "INSTANCE TYPE": "",
        "INSTANCE": "-",
    }
    jpd = submission.get("job_provisioning_data")
    if not jpd:
        return cells
    instance_type = jpd.get("instance_type") or {}
    price = jpd.get("price")
    type_name = str(instance_type.get("name") or "")
    offer = (submission.get("job_runtime_data") or {}).get("offer")
    if offer and (offer.get("total_blocks") or 1) > 1:
        instance_type = offer.get("instance") or instance_type
        price = offer.get("price")
        type_name = f"{instance_type.get('name')} ({offer.get('blocks')}/{offer.get('total_blocks')})"
    resources = instance_type.get("resources") or {}
    cells.update(
        BACKEND=f.format_backend(jpd.get("backend"), jpd.get("region"), jpd.get("corral_backend")),
        RESOURCES=f.format_instance_resources(resources),
        GPU=f.format_instance_resources(resources, gpu_only=True),
        PRICE=f.format_price(price, bool(resources.get("spot"))),
        **{"INSTANCE TYPE": escape(type_name)},
        INSTANCE=escape(str(jpd.get("corral_instance") or "-")),
    )
    return cells


_RUN_COLUMNS = {
    False: (
        tf.Column("NAME", style="bold"),
        tf.Column("BACKEND", style="grey58", drop_rank=3),
        tf.Column("INSTANCE", style="grey58", drop_rank=4),
        tf.Column("GPU", drop_rank=5),
        tf.Column("PRICE", style="grey58", drop_rank=2),
        tf.Column("COST", style="grey58", drop_rank=2),
        tf.Column("STATUS", wraps=True, min_width=12, narrowest=12),  # a job's message (the sandbox's, say) wraps
        tf.Column("SUBMITTED", style="grey58", drop_rank=1),
    ),
    True: (
        tf.Column("NAME", style="bold"),
        tf.Column("BACKEND", style="grey58", drop_rank=3),
        tf.Column("INSTANCE", style="grey58", drop_rank=4),
        tf.Column("RESOURCES", style="grey58", drop_rank=5, wraps=True, min_width=16),
        tf.Column("INSTANCE TYPE", style="grey58", drop_rank=1),
        tf.Column("PRICE", style="grey58", drop_rank=2),
        tf.Column("COST", style="grey58", drop_rank=2),
        tf.Column("STATUS", wraps=True, min_width=12, narrowest=12),  # a job's message (the sandbox's, say) wraps
        tf.Column("SUBMITTED", style="grey58", drop_rank=6),
        tf.Column("ERROR", wraps=True, min_width=24),
    ),
}


def runs_table(runs: Sequence[JSON], verbose: bool = False, width: int | None = None) -> Table:
    """``NAME BACKEND INSTANCE GPU PRICE COST STATUS SUBMITTED`` (``-v``: RESOURCES, INSTANCE TYPE, ERROR), fitted
    to ``width`` (default: the console's): the least useful columns are dropped first, resources and
    errors wrap; nothing is cut short. ``COST`` is the run's (its price times its jobs' running time so far)."""
    rows: list[tuple[dict[str, str], str | None]] = []
    for run in runs:
        spec = run.get("run_spec") or {}
        jobs = [j for j in run.get("jobs") or [] if j.get("job_submissions")]
        run_row = {
            "NAME": escape(str(spec.get("run_name") or "")),
            "SUBMITTED": f.pretty_date(run.get("submitted_at")),
            "STATUS": _status_cell(f.run_status_text(run), str(run.get("status"))),
            "RESOURCES": "-",
            "GPU": "-",
            "PRICE": "-",
            "COST": f.format_price(run.get("cost")),
            "BACKEND": "-",
            "INSTANCE": "-",
            "ERROR": escape(str(run.get("error") or "")),
        }
        if len(jobs) != 1:
            rows.append((run_row, None))
        replicas = {(j.get("job_spec") or {}).get("replica_num", 0) for j in jobs}
        conf = spec.get("configuration") or {}
        grouped = conf.get("type") == "task" and bool(conf.get("groups"))
        for job in jobs:
            job_spec = job.get("job_spec") or {}
            sub = job["job_submissions"][-1]
            row = _job_cells(sub)
            if len(jobs) == 1:
                row.update(NAME=run_row["NAME"], SUBMITTED=run_row["SUBMITTED"], COST=run_row["COST"])
                row["ERROR"] = run_row["ERROR"] or escape(str(sub.get("error") or ""))
            else:
                parts = []
                if len(replicas) > 1:
                    parts.append(f"replica={job_spec.get('replica_num', 0)}")
                if grouped:  # a task's node groups
                    parts.append(f"group={escape(str(job_spec.get('node_group_name') or '0'))}")
                parts.append(f"job={job_spec.get('job_num', 0)}")
                row["NAME"] = "   " + " ".join(parts)
                row["SUBMITTED"] = f.pretty_date(sub.get("submitted_at"))
                row["ERROR"] = escape(str(sub.get("error") or ""))
            row["STATUS"] = _status_cell(f.job_status_text(sub), str(sub.get("status")))
            if sub.get("status") == "running" and sub.get("corral_ready") is not None:  # a service replica
                row["STATUS"] += " [green](ready)[/]" if sub["corral_ready"] else " [warning](not ready)[/]"
            rows.append((row, "secondary" if len(jobs) != 1 else None))
    return tf.fitted_table(_RUN_COLUMNS[verbose], rows, width or console().width)


# ---- fleets -------------------------------------------------------------------------------


def _dim(value: str) -> str:
    return f"[secondary]{escape(value)}[/]" if value else ""


def _fleet_gpu(resources: JSON | None) -> str:
    gpu = (resources or {}).get("gpu")
    if not isinstance(gpu, dict):
        return ""
    count = gpu.get("count") or {}
    if not count or (count.get("min") == 0 and not count.get("max")):
        return ""
    names = gpu.get("name")
    parts = [",".join(names) if names else "gpu"]
    if gpu.get("memory"):
        parts.append(f.format_range(gpu["memory"], "GB"))
    parts.append(f.format_range(count))
    return ":".join(p for p in parts if p)


def _instance_status(instance: JSON) -> str:
    status = str(instance.get("status") or "")
    total = instance.get("total_blocks")
    available = status in ("idle", "busy")
    if available and total is not None and total > 1:
        busy = f"[{f.status_style('busy', 'busy')}]busy[/]"
        text = f"[secondary]{instance.get('busy_blocks', 0)}/{total}[/] {busy}"
    else:
        text = _status_cell(status, status)
    if available:
        health = instance.get("health_status") or "healthy"
        if instance.get("unreachable"):
            text += " [bold indian_red1](unreachable)[/]"
        elif health == "warning":
            text += " [bold gold1](warning)[/]"
        elif health != "healthy":
            text += f" [bold indian_red1]({escape(str(health))})[/]"
    return text


def _instance_error(inst: JSON) -> str:
    if inst.get("status") != "terminated" or not inst.get("termination_reason"):
        return ""
    return str(inst.get("termination_reason_message") or inst["termination_reason"])


def fleets_table(fleets: Sequence[JSON], project: str, verbose: bool = False, width: int | None = None) -> Table:
    """``NAME NODES GPU SPOT BACKEND PRICE STATUS CREATED``, a row per fleet then per instance; ``ERROR``
    too when verbose or when an instance failed (an SSH host that could not be set up says why). Fitted to
    ``width`` (default: the console's) as ``runs_table`` is."""
    show_errors = verbose or any(_instance_error(i) for fl in fleets for i in fl.get("instances") or [])
    columns = [
        tf.Column("NAME"),
        tf.Column("NODES", style="grey58", drop_rank=4),
        tf.Column("RESOURCES", wraps=True, drop_rank=5) if verbose else tf.Column("GPU", drop_rank=5),
        tf.Column("SPOT", style="grey58", drop_rank=1),
        tf.Column("BACKEND", drop_rank=3),
        tf.Column("PRICE", drop_rank=2),
        tf.Column("STATUS", wraps=True, min_width=12, narrowest=12),  # an instance's health wraps too
        tf.Column("CREATED", style="grey58", drop_rank=6),
    ]
    if show_errors:
        columns.append(tf.Column("ERROR", wraps=True, min_width=24))
    rows: list[tuple[dict[str, str], str | None]] = []

    def add(row: dict[str, str]) -> None:
        rows.append((row, None))

    for fleet in sorted(fleets, key=lambda x: str(x.get("created_at") or ""), reverse=True):
        spec = fleet.get("spec") or {}
        conf = spec.get("configuration") or {}
        profile = f.merged_profile(spec, fleet=True)
        if conf.get("ssh_config") is not None:
            nodes = str(len((conf["ssh_config"] or {}).get("hosts") or []))
            resources = gpu = spot = price = ""
            backend = "ssh"
        else:
            nodes = f.format_nodes(conf.get("nodes"))
            resources = f.format_resources_spec(conf.get("resources"))
            gpu = _fleet_gpu(conf.get("resources"))
            backends = conf.get("backends") or []
            backend = ", ".join(str(b).replace("remote", "ssh") for b in backends) or "*"
            spot = str(profile.get("spot_policy") or "")
            max_price = profile.get("max_price")
            price = f"$0..{f.format_price(max_price)[1:]}" if max_price is not None else ""
        name = str(fleet.get("name") or "")
        if fleet.get("project_name") not in (None, project):
            name = f"{fleet['project_name']}/{name}"
        status = str(fleet.get("status") or "")
        add(
            {
                "NAME": _dim(name),
                "NODES": escape(nodes),
                "RESOURCES": _dim(resources),
                "GPU": _dim(gpu),
                "BACKEND": _dim(backend),
                "PRICE": _dim(price),
                "SPOT": escape(spot),
                "STATUS": _status_cell(status, status),
                "CREATED": f.pretty_date(fleet.get("created_at")),
                "ERROR": escape(str(fleet.get("status_message") or "")) if verbose else "",
            }
        )
        for inst in fleet.get("instances") or []:
            add(_instance_row(inst))
    return tf.fitted_table(columns, rows, width or console().width)


def _instance_row(inst: JSON) -> dict[str, str]:
    backend = inst.get("backend")
    is_ssh = backend == "remote"
    resources = (inst.get("instance_type") or {}).get("resources")
    hide = inst.get("instance_type") is None or (is_ssh and inst.get("status") in ("pending", "provisioning"))
    spot = price = ""
    if not is_ssh:
        spot = "spot" if (resources or {}).get("spot") else "on-demand"
        price = f.format_price(inst.get("price"))
    name = f"   instance={inst.get('instance_num', 0)}"
    if inst.get("corral_backend") == "ssh" and inst.get("hostname"):
        name += f" ({inst['hostname']})"  # an SSH fleet's host, by its address
    row = {
        "NAME": escape(name),
        "RESOURCES": "" if hide else f.format_instance_resources(resources),
        "GPU": "" if hide else f.format_instance_resources(resources, gpu_only=True),
        "BACKEND": f.format_backend(backend, inst.get("region"), inst.get("corral_backend")),
        "SPOT": spot,
        "PRICE": price,
        "STATUS": _instance_status(inst),
        "CREATED": f.pretty_date(inst.get("created")),
    }
    if _instance_error(inst):
        row["ERROR"] = escape(_instance_error(inst))
    return row
