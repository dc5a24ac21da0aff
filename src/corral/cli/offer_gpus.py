"""``corral offer --group-by gpu[,backend,region,count]``: the offers' GPUs grouped (``gpus/list``), in the
table dstack 0.22.5's ``dstack offer --group-by`` prints (``# GPU SPOT $/GPU BACKEND(S) [REGION(S)]``, one
row per group: ``NAME:MEMORY:COUNT``, the spot kinds, the price per GPU or its range, and the availability
when none is available), or with ``--json`` as ``{project, requirements, group_by, gpus}``.
"""

from __future__ import annotations

from typing import Any

GROUP_BY = ("gpu", "backend", "region", "count")


def parse_group_by(values: list[str]) -> list[str]:
    """``--group-by`` values, repeated or comma-separated, checked as dstack checks them."""
    from corral.cli.errors import CLIError

    out: list[str] = []
    for arg in values:
        for value in (v.strip() for v in arg.split(",")):
            if not value:
                continue
            if value not in GROUP_BY:
                raise CLIError(f"Invalid group-by value: '{value}'. Valid choices are: {', '.join(sorted(GROUP_BY))}")
            out.append(value)
    if out and "gpu" not in out:
        raise CLIError(f"Cannot group by '{', '.join(out)}' without also grouping by 'gpu'")
    return out


def _number(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _range(low: Any, high: Any, fmt: Any = str) -> str:
    return fmt(low) if low == high else f"{fmt(low)}..{fmt(high)}"


def _where(group: dict[str, Any], with_region_column: bool) -> tuple[str, str]:
    """The BACKEND(S) cell and the REGION(S) cell of a group."""
    backend = group.get("backend") or ", ".join(group.get("backends") or [])
    regions = group.get("regions") or []
    region = group.get("region") or (", ".join(regions) if len(regions) <= 3 else f"{len(regions)} regions")
    if with_region_column or not region:
        return str(backend), str(region)
    return f"{backend} ({region})", ""


def gpu_table(gpus: list[dict[str, Any]]) -> Any:
    """The groups' table, columns as dstack names them for what the groups hold."""
    from rich.table import Table

    single_backend = any(g.get("backend") for g in gpus)
    if single_backend and any(g.get("region") for g in gpus):
        columns = ["BACKEND", "REGION"]
    elif single_backend and any(g.get("regions") for g in gpus):
        columns = ["BACKEND", "REGIONS"]
    else:
        columns = ["BACKENDS"]
    table = Table(box=None)
    for col in ("#", "GPU", "SPOT", "$/GPU", *columns, ""):
        table.add_column(col, no_wrap=col == "GPU")
    for i, g in enumerate(gpus, start=1):
        count, price = g.get("count") or {}, g.get("price") or {}
        spec = f"{g.get('name')}:{int(g.get('memory_mib') or 0) // 1024}GB:{_range(count.get('min'), count.get('max'))}"
        spot = ", ".join(kind for kind in ("spot", "on-demand") if kind in (g.get("spot") or []))
        prices = _range(float(price.get("min") or 0), float(price.get("max") or 0), _number)
        avail = g.get("availability") or []
        shown = "" if any(a in ("unknown", "available") for a in avail) else ", ".join(sorted(set(avail)))
        backend, region = _where(g, len(columns) == 2)
        table.add_row(str(i), spec, spot, prices, backend, *([region] if len(columns) == 2 else []), shown)
    return table
