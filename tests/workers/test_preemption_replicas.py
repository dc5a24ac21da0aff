"""Preemption and quotas with two server replicas on one Postgres, both running their workers (local
backend, instances shared through one instances directory), deciding at once.

Low-priority runs fill a fleet, then high-priority runs are submitted together, half through each replica:
each high run preempts exactly one low run (one ``interrupted_by_no_capacity`` submission per high run,
each naming a different preemptor, none preempted twice), an instance never holds more jobs than its
blocks nor the fleet more instances than ``nodes.max`` at any sampled moment, the victims are requeued and
finish after the high runs, and the oldest low run is untouched. A project's ``quota.max`` holds at every
sampled moment while 20 runs are submitted at once, half through each replica, and every run finishes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.scheduler.holds import preemptor
from corral.settings import Settings
from corral.store.fleets import LIVE_JOB_STATUSES
from corral.store.quotas import HOLDING_STATUSES
from corral.store.tables import instances, jobs
from pg_harness import new_database_url
from server_harness import (
    RunningServer,
    finished_run,
    fleet_body,
    get_run,
    make_settings,
    running_server,
    task_body,
    wait_for,
)

PREEMPTION = """
projects:
  - name: main
    preemptible_max_priority: 50
scheduling:
  preemption: {enabled: true, min_priority_gap: 10, min_runtime: 0, grace_period: 1s}
"""

QUOTA = """
projects:
  - name: main
    quota: {max: {cpu: 3, instances: 3}}
    preemptible_max_priority: 50
scheduling:
  preemption: {enabled: true, min_runtime: 0, grace_period: 1s}
"""

NODES = 5
HIGH = 4


def _replicas(tmp: Path, config: str) -> tuple[Settings, Settings]:
    url, key = new_database_url(), base64.b64encode(os.urandom(32)).decode()
    common = {"database_url": url, "encryption_key": key, "local_instances_dir": tmp / "instances"}
    out = []
    for name in ("a", "b"):
        settings = make_settings(tmp / name, **common)
        settings.server_dir.mkdir(parents=True)
        (settings.server_dir / "config.yml").write_text(config)
        out.append(settings)
    return out[0], out[1]


@contextlib.asynccontextmanager
async def _sampling(check: Callable[[], Awaitable[list[str]]]) -> AsyncIterator[list[str]]:
    """Run ``check`` every 50 ms in the background; what it found wrong, gathered."""
    found: list[str] = []

    async def loop() -> None:
        while True:
            found.extend(await check())
            await asyncio.sleep(0.05)

    task = asyncio.create_task(loop())
    try:
        yield found
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _capacity_check(s: RunningServer, fleet_id: str, nodes_max: int) -> Callable[[], Awaitable[list[str]]]:
    """An instance never holds more unfinished jobs' blocks than it has; the fleet never more instances
    than ``nodes_max`` that are not terminated (one read transaction: one moment of the rows)."""

    async def check() -> list[str]:
        async with s.ctx.db.read() as conn:
            held = (
                await conn.execute(
                    sa.select(instances.c.name, instances.c.total_blocks, sa.func.sum(jobs.c.blocks), sa.func.count())
                    .join(instances, instances.c.id == jobs.c.instance_id)
                    .where(jobs.c.status.in_(LIVE_JOB_STATUSES))
                    .group_by(instances.c.name, instances.c.total_blocks)
                )
            ).all()
            live = (
                await conn.execute(
                    sa.select(sa.func.count()).where(
                        instances.c.fleet_id == fleet_id, instances.c.status != "terminated", ~instances.c.deleted
                    )
                )
            ).scalar_one()
        wrong = [f"{n}: {used} blocks held by {k} jobs of {total}" for n, total, used, k in held if used > (total or 1)]
        if live > nodes_max:
            wrong.append(f"fleet has {live} live instances, nodes.max {nodes_max}")
        return wrong

    return check


def _quota_check(s: RunningServer, on_a: Any, on_b: Any) -> Callable[[], Awaitable[list[str]]]:
    """What the project's jobs hold, recounted from the rows and as each replica's quotas/usage says."""

    async def check() -> list[str]:
        async with s.ctx.db.read() as conn:
            holding = (
                await conn.execute(
                    sa.select(sa.func.count(sa.distinct(jobs.c.instance_id))).where(
                        jobs.c.status.in_(HOLDING_STATUSES), jobs.c.instance_id.is_not(None)
                    )
                )
            ).scalar_one()
        wrong = [f"{holding} instances held by jobs of main"] if holding > 3 else []
        for name, c in (("a", on_a), ("b", on_b)):
            used = (await c.post("/api/projects/main/quotas/usage", json={})).json()["used"]
            if used.get("instances", 0) > 3 or used.get("cpu", 0) > 3:
                wrong.append(f"quotas/usage on replica {name}: {used}")
        return wrong

    return check


async def _apply(c: Any, body: dict[str, Any]) -> None:
    r = await c.post("/api/project/main/runs/apply", json=body)
    assert r.status_code == 200, r.text


async def test_high_runs_through_both_replicas_preempt_one_low_run_each(tmp_path: Path) -> None:
    release = tmp_path / "release"
    low = f"for i in $(seq 900); do [ -f {release} ] && exit 0; sleep 0.1; done; exit 1"
    first, second = _replicas(tmp_path, PREEMPTION)
    async with running_server(first) as a, running_server(second) as b, a.client() as on_a, b.client() as on_b:
        applied = await on_a.post("/api/project/main/fleets/apply", json=fleet_body(nodes=f"0..{NODES}"))
        assert applied.status_code == 200, applied.text
        async with _sampling(_capacity_check(a, applied.json()["id"], NODES)) as overcommits:
            lows = [f"low-{i}" for i in range(NODES)]
            for i, name in enumerate(lows):  # one after the other: a known start order
                await _apply((on_a, on_b)[i % 2], task_body([low], name=name, priority=0))

                async def running(name: str = name) -> bool:
                    return bool((await get_run(on_a, name))["status"] == "running")

                await wait_for(running, timeout=30)
            highs = [f"high-{i}" for i in range(HIGH)]
            await asyncio.gather(
                *(_apply((on_a, on_b)[i % 2], task_body(["sleep 2"], name=n, priority=90)) for i, n in enumerate(highs))
            )
            high_runs = [await finished_run((on_a, on_b)[i % 2], n, timeout=40) for i, n in enumerate(highs)]
            release.touch()
            low_runs = [await finished_run(on_b, n, timeout=40) for n in lows]
        assert overcommits == [], overcommits[:10]
        assert [r["status"] for r in high_runs] == ["done"] * HIGH, high_runs
        for run in high_runs:
            assert len(run["jobs"][0]["job_submissions"]) == 1, run["jobs"][0]["job_submissions"]

        subs = {r["run_spec"]["run_name"]: r["jobs"][0]["job_submissions"] for r in low_runs}
        assert [r["status"] for r in low_runs] == ["done"] * NODES, {n: _outcomes(s) for n, s in subs.items()}
        preempted = {n: s for n, s in subs.items() if len(s) > 1}
        # the oldest low run is not needed: the others, most recent first, make room for one high run each
        assert sorted(preempted) == lows[1:], {n: _outcomes(s) for n, s in subs.items()}
        for name, s in preempted.items():
            assert _outcomes(s) == [("failed", "interrupted_by_no_capacity"), ("done", "done_by_runner")], (name, s)
        assert _outcomes(subs[lows[0]]) == [("done", "done_by_runner")]

        # one stop per preemptor, each naming a different high run: none preempted twice, none for nothing
        async with a.ctx.db.read() as conn:
            stops = (
                await conn.execute(
                    sa.select(jobs.c.run_name, jobs.c.submission_num, jobs.c.termination_reason_message).where(
                        jobs.c.termination_reason == "interrupted_by_no_capacity"
                    )
                )
            ).all()
        by = Counter((preemptor(m) or ("?", None))[0] for _, _, m in stops)
        assert by == Counter(highs), [tuple(r) for r in stops]
        assert all(n in lows and k == 0 for n, k, _ in stops), [tuple(r) for r in stops]


async def test_a_quota_holds_with_20_submitters_through_both_replicas(tmp_path: Path) -> None:
    first, second = _replicas(tmp_path, QUOTA)
    async with running_server(first) as a, running_server(second) as b, a.client() as on_a, b.client() as on_b:
        applied = await on_b.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..8", blocks=1))
        assert applied.status_code == 200, applied.text
        names = [f"q{i}" for i in range(20)]
        async with (
            _sampling(_quota_check(a, on_a, on_b)) as overruns,
            _sampling(_capacity_check(b, applied.json()["id"], 8)) as overcommits,
        ):
            await asyncio.gather(
                *(_apply((on_a, on_b)[i % 2], task_body(["sleep 0.5"], name=n)) for i, n in enumerate(names))
            )

            async def waiting_for_quota() -> bool:
                runs = (await on_a.post("/api/project/main/runs/list", json={})).json()
                messages = [(x["latest_job_submission"] or {}).get("status_message") or "" for x in runs]
                return any(m.startswith("Waiting for quota") for m in messages)

            await wait_for(waiting_for_quota, timeout=30)
            done = [await finished_run((on_a, on_b)[i % 2], n, timeout=60) for i, n in enumerate(names)]
        assert overruns == [], overruns[:10]
        assert overcommits == [], overcommits[:10]
        assert [r["status"] for r in done] == ["done"] * 20, [(r["run_spec"]["run_name"], r["status"]) for r in done]


def _outcomes(subs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(x["status"], x["termination_reason"]) for x in subs]
