"""``corral offer``: what the project's backends and fleets could offer for some resources.

One ``runs/get_plan`` with a throw-away task (``image: scratch``, ``commands: [":"]``, dstack's
"unconstrained" resources overridden by the options) and ``for_offers_only: true``. Under the table, a line
per backend whose offers' ``backend_data`` names the catalogue their prices come from (``price_notes``).
"""

from typing import Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption


def offer(
    gpu: Annotated[
        Optional[str], typer.Option("--gpu", help="GPU spec, e.g. A100:80GB:2 or 24GB..:1..", metavar="SPEC")
    ] = None,
    cpu: Annotated[Optional[str], typer.Option("--cpu", help="CPU count or range, e.g. 4..", metavar="SPEC")] = None,
    memory: Annotated[
        Optional[str], typer.Option("--memory", help="Memory size or range, e.g. 16GB..", metavar="SIZE")
    ] = None,
    disk: Annotated[
        Optional[str], typer.Option("--disk", help="Disk size or range, e.g. 100GB..", metavar="SIZE")
    ] = None,
    backend: Annotated[
        Optional[list[str]],
        typer.Option("-b", "--backend", help="Only this backend; repeatable.", metavar="BACKEND"),
    ] = None,
    fleet: Annotated[
        Optional[list[str]],
        typer.Option("--fleet", help="Only offers of this fleet; repeatable.", metavar="NAME"),
    ] = None,
    spot: Annotated[
        Optional[bool], typer.Option("--spot/--on-demand", help="Only spot, or only on-demand, offers.")
    ] = None,
    max_price: Annotated[
        Optional[float],
        typer.Option("--max-price", help="Only offers up to this hourly price.", metavar="PRICE"),
    ] = None,
    max_offers: Annotated[
        int, typer.Option("--max-offers", help="Show at most this many offers.", min=1, metavar="N")
    ] = 50,
    json_: Annotated[bool, typer.Option("--json", help="Print the offers as JSON.")] = False,
    group_by: Annotated[
        Optional[list[str]],
        typer.Option(
            "--group-by",
            help="Group the offers' GPUs by gpu, backend, region and count (gpu always); repeatable or "
            "comma-separated, e.g. --group-by gpu,backend.",
            metavar="FIELDS",
        ),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """List the instance offers matching the given resources, or their GPUs grouped (--group-by), and where
    their prices come from (for AWS: the price catalogue and its date, and the public IPv4 charge they leave
    out)."""
    import json

    from corral.cli import formatting, render
    from corral.cli.common import client_for

    configuration = _configuration(gpu, cpu, memory, disk, backend, fleet, spot, max_price)
    run_spec = {"configuration": configuration, "profile": {"name": "default"}}

    from corral.cli import offer_gpus

    grouped = offer_gpus.parse_group_by(group_by or [])
    client, project_name = client_for(project)
    out = render.console()
    with client:
        if fleet:
            _check_fleets(client, project_name, fleet)
        if grouped:
            _print_groups(client, project_name, run_spec, grouped, json_)
            return
        plan = client.runs_get_plan(project_name, run_spec, max_offers=max_offers, for_offers_only=True)
    job_plan = (plan.get("job_plans") or [{}])[0]
    requirements = (job_plan.get("job_spec") or {}).get("requirements") or {}
    offers = job_plan.get("offers") or []
    total = int(job_plan.get("total_offers") or len(offers))
    if json_:
        conf = (plan.get("run_spec") or {}).get("configuration") or configuration
        output = {
            "project": plan.get("project_name", project_name),
            "user": plan.get("user"),
            "requirements": {
                "resources": requirements.get("resources"),
                "max_price": requirements.get("max_price"),
                "spot": {"spot": True, "on-demand": False}.get(str(conf.get("spot_policy"))),
                "reservation": conf.get("reservation"),
            },
            "offers": offers,
            "total_offers": total,
        }
        print(json.dumps(output))
        return
    out.print(
        render.props_table(
            [
                ("Project", str(plan.get("project_name", project_name))),
                ("Resources", formatting.format_resources_spec(requirements.get("resources"))),
                ("Spot policy", formatting.format_spot(requirements.get("spot"))),
                ("Max price", formatting.format_max_price(requirements.get("max_price"))),
            ]
        )
    )
    out.print()
    _print_offers(offers, total, job_plan.get("max_price"))


def _print_offers(offers: list[dict[str, Any]], total: int, max_price: float | None) -> None:
    """The offers table, ``Shown N of M offers``, where the prices come from; or the no-offers warning."""
    from corral.cli import render

    out = render.console()
    if not offers:
        out.print(render.NO_OFFERS_WARNING)
        return
    out.print(render.offers_table(offers, total, mute_tail_rows=False))
    out.print()
    if total > len(offers):
        price = f"${max_price or 0:3f}".rstrip("0").rstrip(".")
        out.print(f"[secondary] Shown {len(offers)} of {total} offers, {price} max[/]")
    for line in price_notes(offers):
        out.print(f"[secondary] {line}[/]")


def price_notes(offers: list[dict[str, Any]]) -> list[str]:
    """One line per backend whose offers say where their prices come from (``backend_data.price_catalog``,
    ``price_date``) and what they leave out (``public_ipv4_hourly``)."""
    notes: dict[str, str] = {}
    for offer in offers:
        data = offer.get("backend_data") or {}
        backend = str(offer.get("corral_backend") or offer.get("backend"))
        if backend in notes or not data.get("price_catalog"):
            continue
        note = f"{backend} prices: {data['price_catalog']}, as of {data.get('price_date') or 'an unknown date'}"
        if data.get("public_ipv4_hourly"):
            note += f"; a public IPv4 address adds ${data['public_ipv4_hourly']}/h"
        notes[backend] = note
    return list(notes.values())


def _check_fleets(client: Any, project: str, names: list[str]) -> None:
    """``--fleet`` names a fleet the project has (or imports as ``project/name``), else a CLI error."""
    from corral.cli.errors import CLIError

    fleets = client.fleets_list(project)
    known = {str(f.get("name")) for f in fleets} | {f"{f.get('project_name')}/{f.get('name')}" for f in fleets}
    missing = [n for n in names if n not in known]
    if missing:
        have = ", ".join(sorted(str(f.get("name")) for f in fleets)) or "none"
        raise CLIError(f"Fleet {', '.join(missing)} not found in project {project} (its fleets: {have})")


def _print_groups(client: Any, project: str, run_spec: dict[str, Any], group_by: list[str], json_: bool) -> None:
    """``gpus/list`` grouped as asked, printed as ``dstack offer --group-by`` prints it."""
    import json

    from corral.cli import formatting, offer_gpus, render

    conf = run_spec["configuration"]
    gpus = client.gpus_list(project, run_spec, [g for g in group_by if g != "gpu"]).get("gpus") or []
    spot = {"spot": True, "on-demand": False}.get(str(conf.get("spot_policy")))
    if json_:
        requirements = {
            "resources": conf["resources"], "max_price": conf.get("max_price"), "spot": spot, "reservation": None,
        }  # fmt: skip
        print(json.dumps({"project": project, "requirements": requirements, "group_by": group_by, "gpus": gpus}))
        return
    out = render.console()
    rows = [
        ("Project", project),
        ("Resources", formatting.format_resources_spec(conf["resources"])),
        ("Spot policy", "auto" if spot is None else "spot" if spot else "on-demand"),
        ("Max price", f"${conf['max_price']:3f}".rstrip("0").rstrip(".") if conf.get("max_price") else "-"),
        ("Reservation", "-"),
        ("Group by", ", ".join(group_by)),
    ]
    out.print(render.props_table(rows))
    out.print()
    out.print(offer_gpus.gpu_table(gpus))


def _configuration(
    gpu: Optional[str],
    cpu: Optional[str],
    memory: Optional[str],
    disk: Optional[str],
    backend: Optional[list[str]],
    fleet: Optional[list[str]],
    spot: Optional[bool],
    max_price: Optional[float],
) -> dict[str, Any]:
    """The throw-away task whose plan lists the offers."""
    resources: dict[str, Any] = {"cpu": "1..", "memory": "0GB..", "gpu": "0..", "disk": None}
    for key, value in (("cpu", cpu), ("memory", memory), ("gpu", gpu)):
        if value is not None:
            resources[key] = value
    if disk is not None:
        resources["disk"] = disk
    configuration: dict[str, Any] = {
        "type": "task",
        "image": "scratch",
        "user": "root",
        "commands": [":"],
        "resources": resources,
    }
    if backend:
        configuration["backends"] = backend
    if fleet:
        configuration["fleets"] = fleet
    if spot is not None:
        configuration["spot_policy"] = "spot" if spot else "on-demand"
    if max_price is not None:
        configuration["max_price"] = max_price
    return configuration
