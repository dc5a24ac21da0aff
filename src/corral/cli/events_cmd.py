"""``corral event [--watch] [--since 10m|RFC3339] [--target-run|--within-run|--target-fleet|--within-fleet NAME]``.

Like ``dstack event``: ``POST /api/events/list`` within the project (or the named run or fleet, whose id
``runs/get`` / ``fleets/get`` give); without ``--since`` the last 100 events, oldest first; with it, every
event since then in ascending pages. ``--watch`` polls every 2 s over a 20 s window (events commit after
their ``recorded_at``), printing each event once. One line per event:
``[2026-01-21 13:09:37] [👤admin] [run cursor] Run submitted. Status: SUBMITTED``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption

if TYPE_CHECKING:
    from corral.sdk.client import CorralClient

#: Seconds between polls of ``--watch`` and how far back each poll looks (dstack's CLI: 2 s and 20 s).
WATCH_INTERVAL = 2.0
WATCH_WINDOW = timedelta(seconds=20)
PAGE = 100

SinceOption = Annotated[
    Optional[str],
    typer.Option(
        "--since",
        metavar="WHEN",
        help="Only events newer than this: a duration (10s, 5m, 1d) or an RFC 3339 time (2026-09-24T15:30:00Z). "
        "Without it, the last 100 events.",
    ),
]
WatchOption = Annotated[bool, typer.Option("-w", "--watch", help="Print new events as they happen, until Ctrl-C.")]


TargetRun = Annotated[Optional[str], typer.Option("--target-run", metavar="NAME", help="Only events of this run.")]
WithinRun = Annotated[
    Optional[str], typer.Option("--within-run", metavar="NAME", help="Only events of this run and its jobs.")
]
TargetFleet = Annotated[
    Optional[str], typer.Option("--target-fleet", metavar="NAME", help="Only events of this fleet.")
]
WithinFleet = Annotated[
    Optional[str], typer.Option("--within-fleet", metavar="NAME", help="Only events of this fleet and its instances.")
]


def parse_since(value: str, now: datetime) -> datetime:
    """``--since``: a duration back from ``now`` or an RFC 3339 time (naive times are UTC)."""
    from corral.domain.durations import parse_duration

    try:
        return now - timedelta(seconds=parse_duration(value))
    except (ValueError, TypeError):
        pass
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        from corral.cli.errors import CLIError

        raise CLIError(
            f"--since {value!r} is neither a duration (10s, 5m, 1d) nor an RFC 3339 time (2026-09-24T15:30:00Z)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def event(  # noqa: C901
    project: ProjectOption = None,
    since: SinceOption = None,
    watch: WatchOption = False,
    target_run: TargetRun = None,
    within_run: WithinRun = None,
    target_fleet: TargetFleet = None,
    within_fleet: WithinFleet = None,
) -> None:
    """View events: who did what to the project's runs, jobs, fleets, instances, members."""
    import time

    from corral.cli.common import client_for
    from corral.cli.errors import CLIError

    if target_run and target_fleet:
        raise CLIError("--target-run and --target-fleet cannot be used together")
    if within_run and within_fleet:
        raise CLIError("--within-run and --within-fleet cannot be used together")
    start = parse_since(since, datetime.now(timezone.utc)) if since else None
    client, project_name = client_for(project)
    with client:
        filters: dict[str, Any] = {}
        if target_run:
            filters["target_runs"] = [client.runs_get(project_name, target_run)["id"]]
        elif target_fleet:
            filters["target_fleets"] = [client.fleets_get(project_name, target_fleet)["id"]]
        if within_run:
            filters["within_runs"] = [client.runs_get(project_name, within_run)["id"]]
        elif within_fleet:
            filters["within_fleets"] = [client.fleets_get(project_name, within_fleet)["id"]]
        elif not filters:
            filters["within_projects"] = [client.projects_get(project_name)["project_id"]]
        seen: dict[str, datetime] = {}
        latest: datetime | None = None
        try:
            while True:
                if start is None and latest is None:
                    batch = list(reversed(client.events_list(filters, limit=PAGE, ascending=False)))
                else:
                    floor = start or datetime.fromtimestamp(0, timezone.utc)
                    after = max(floor, latest - WATCH_WINDOW) if latest is not None and watch else (latest or floor)
                    batch = list(_pages(client, filters, after))
                for e in batch:
                    at = _time(e["recorded_at"])
                    if e["id"] not in seen:
                        seen[e["id"]] = at
                        print(format_event(e, project_name), flush=True)
                    latest = at if latest is None else max(latest, at)
                if not watch:
                    return
                if latest is None:
                    latest = start or datetime.now(timezone.utc)
                horizon = latest - WATCH_WINDOW
                for key in [k for k, at in seen.items() if at < horizon]:
                    del seen[key]
                time.sleep(WATCH_INTERVAL)
        except KeyboardInterrupt:
            return


def _pages(client: CorralClient, filters: dict[str, Any], since: datetime) -> Iterator[dict[str, Any]]:
    prev: dict[str, Any] = {"prev_recorded_at": since.isoformat()}
    while True:
        page = client.events_list({**filters, **prev}, limit=PAGE, ascending=True)
        yield from page
        if len(page) < PAGE:
            return
        prev = {"prev_recorded_at": page[-1]["recorded_at"], "prev_id": page[-1]["id"]}


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def format_event(e: dict[str, Any], project: str) -> str:
    """One line, as ``dstack event`` prints it (other projects' targets as ``project/name``)."""
    at = _time(e["recorded_at"]).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    targets = []
    for t in e["targets"]:
        name = t["name"]
        if t.get("project_name") and t["type"] != "project" and t["project_name"] != project:
            name = f"{t['project_name']}/{name}"
        targets.append(f"{t['type']} {name}")
    actor = f" [👤{e['actor_user']}]" if e.get("actor_user") else ""
    return f"[{at}]{actor} [{', '.join(targets)}] {e['message']}"
