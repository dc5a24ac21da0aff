"""The scheduling pass's reader of the projects' holdings (SQLite and Postgres): after any sequence of the store's
own writes (placements by the commit point, ends with their release, instances terminated or deleted) what it hands
out is what a whole read of the holding jobs counts on the live instances, and it reads again only the instances
written since its last read."""

from __future__ import annotations

import json
import random
import time

import sqlalchemy as sa
from test_plan_apply import _db

from corral.domain.quotas import Usage
from corral.scheduler.types import Assign, Gang, Plan
from corral.store import fleets as fleet_store
from corral.store.db import Database
from corral.store.fleet_reader import FleetReader
from corral.store.holdings_reader import HoldingsReader
from corral.store.plan_apply import apply_plan
from corral.store.quotas import Holding, held_on_instances, holdings_of
from corral.store.tables import instances, jobs, runs
from store_rows import another_project

#: The hosts' offers: (CPUs, memory in MiB, GPU models, price an hour, blocks).
OFFERS = [(8, 32768, [], 0.4, 2), (16, 65536, ["A100", "A100"], 3.1, 2), (4, 16384, [], 0.0, 1)]


async def _setting(db: Database, hosts: int) -> None:
    """A second project ``q`` with run ``rq`` beside ``p``'s run ``r``, and ``hosts`` idle hosts in fleet ``f``."""
    now = time.time()
    async with db.write() as conn:
        await another_project(conn, now, "q", "other")
        await conn.execute(
            sa.insert(runs).values(
                id="rq", project_id="q", user_id="u", run_name="rq", submitted_at=now, last_processed_at=now,
                status="submitted", run_spec="{}", priority=0, deployment_num=0, deleted=False,
            )
        )  # fmt: skip
        for n in range(hosts):
            cpus, mem, gpus, price, blocks = OFFERS[n % len(OFFERS)]
            resources = {"cpus": cpus, "memory_mib": mem, "gpus": [{"name": g} for g in gpus]}
            await conn.execute(
                sa.insert(instances).values(
                    id=f"h{n}", project_id="p", fleet_id="f", name=f"f-{n}", instance_num=n, status="idle",
                    unreachable=False, backend="ssh", price=price, total_blocks=blocks, busy_blocks=0,
                    offer=json.dumps({"backend": "ssh", "resources": resources}), created_at=now,
                    last_processed_at=now, deleted=False,
                )
            )  # fmt: skip


async def _job(db: Database, job_id: str, project: str, num: int, blocks: int) -> None:
    now = time.time()
    async with db.write() as conn:
        await conn.execute(
            sa.insert(jobs).values(
                id=job_id, run_id="r" if project == "p" else "rq", project_id=project, run_name="r", job_num=num,
                replica_num=0, job_name=job_id, submission_num=0, deployment_num=0, submitted_at=now,
                last_processed_at=now, status="submitted", job_spec="{}", priority=0, blocks=blocks, log_offset=0,
            )
        )  # fmt: skip


def _plain(holdings: dict[str, Holding]) -> dict[str, tuple[dict[str, float], frozenset[str]]]:
    """Holdings compared to the 9th decimal, a dimension at 0 the same as one not there."""

    def usage(u: Usage) -> dict[str, float]:
        return {k: round(v, 9) for k, v in u.items() if abs(v) > 1e-9}

    return {pid: (usage(h.usage), h.instance_ids) for pid, h in holdings.items()}


async def _both(db: Database, reader: HoldingsReader, whole: bool = False) -> tuple[dict[str, Holding], ...]:
    """What the reader hands out, and the whole read's count on the live instances, in one transaction."""
    async with db.read() as conn:
        fleets = FleetReader()
        await fleets.read(conn)
        kept = await reader.read(conn, fleets.live, whole)
        live = {s[0] for s in fleets.live}
        # the whole read, on the live instances only (``project_holdings`` counts jobs on terminated ones too)
        counted = holdings_of(h for h in await held_on_instances(conn) if h[0] in live)
    return kept, counted


async def test_the_kept_holdings_are_the_whole_reads_after_any_writes(db_url: str) -> None:
    db = await _db(db_url)
    await _setting(db, 9)
    reader = HoldingsReader()
    rng = random.Random(7)
    holding: dict[str, str] = {}  # job id -> its host
    gone: set[str] = set()
    for step in range(60):
        live_hosts = [f"h{n}" for n in range(9) if f"h{n}" not in gone]
        action = rng.random()
        if action < 0.55 or not holding:  # a placement by the commit point
            host = rng.choice(live_hosts)
            blocks = OFFERS[int(host[1:]) % len(OFFERS)][4]
            job_id = f"j{step}"
            await _job(db, job_id, rng.choice("pq"), step, rng.randint(1, blocks))
            result = await apply_plan(db, Plan((Gang("r", (Assign(job_id, host, 1),)),)), time.time())
            if result.assigned:
                holding[job_id] = host
        elif action < 0.9:  # a job's end, and its release
            job_id = rng.choice(sorted(holding))
            async with db.write() as conn:
                await conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(status="done"))
                await fleet_store.release_instance(conn, holding.pop(job_id), time.time())
        elif len(live_hosts) > 3:  # a host terminated (its jobs count no more on a live instance)
            host = rng.choice(live_hosts)
            gone.add(host)
            async with db.write() as conn:
                await conn.execute(sa.update(instances).where(instances.c.id == host).values(status="terminated"))
            holding = {j: h for j, h in holding.items() if h != host}
        kept, counted = await _both(db, reader)
        assert _plain(kept) == _plain(counted), f"step {step}"
    assert holding, "the walk ended with jobs held"
    await db.dispose()


async def test_only_instances_written_since_are_read_again_and_a_whole_read_sees_the_rest(db_url: str) -> None:
    db = await _db(db_url)
    await _setting(db, 3)
    reader = HoldingsReader()
    for n, (project, host) in enumerate((("p", "h0"), ("q", "h1"), ("p", "h1"))):
        await _job(db, f"j{n}", project, n, 1)
        assert (await apply_plan(db, Plan((Gang("r", (Assign(f"j{n}", host, 1),)),)), time.time())).assigned
    kept, counted = await _both(db, reader)
    assert _plain(kept) == _plain(counted)
    assert kept["p"].instance_ids == {"h0", "h1"} and kept["q"].instance_ids == {"h1"}
    again, _ = await _both(db, reader)
    assert all(again[p] is kept[p] for p in kept), "nothing written: the same records, nothing read again"

    # a job that stops holding with no write of its instance's row: counted on until the next whole read
    async with db.write() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == "j1").values(status="done"))
    stale, counted = await _both(db, reader)
    assert "q" in stale and "q" not in counted
    whole, counted = await _both(db, reader, whole=True)
    assert _plain(whole) == _plain(counted) and "q" not in whole
    await db.dispose()
