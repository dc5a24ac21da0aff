"""The status choke point (``store/events.py``'s tracked updates, checked by ``store/transitions.py``): every change
a transition table of ``domain/statuses.py`` allows is written, every other one is refused and leaves its row as it
was -- under ``STRICT`` (the test suite's setting) by raising, which rolls the transaction back, otherwise by
writing nothing of that row while the rest of the transaction commits.

One Hypothesis state machine per table drives a row of a real SQLite database through the store's own update
functions, every way they write (by id, expecting the status the row is in or one of two, by a WHERE clause),
from any status, with and without events stored."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from corral.domain.statuses import (
    TRANSITIONS,
    FleetStatus,
    IllegalTransition,
    InstanceStatus,
    JobStatus,
    RunStatus,
    is_legal_transition,
)
from corral.store import events as event_store
from corral.store import fleets as fleet_store
from corral.store import runs as run_store
from corral.store import transitions
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.store.tables import fleets, instances, jobs, runs
from store_rows import a_run, admin_and_project

T = TypeVar("T")
_SUBMISSIONS = itertools.count()  # the jobs' run takes one job per submission number

TABLES = {"jobs": jobs, "runs": runs, "instances": instances, "fleets": fleets}
STATUSES: dict[str, list[Enum]] = {
    "jobs": list(JobStatus),
    "runs": list(RunStatus),
    "instances": list(InstanceStatus),
    "fleets": list(FleetStatus),
}
#: How a status is written: by id (any status; the one the row is in; it or another), or by a WHERE clause.
WAYS = ("by_id", "expect_current", "expect_two", "where")


def test_strict_in_tests() -> None:
    """The suite runs with illegal changes raising (``tests/conftest.py``)."""
    assert transitions.STRICT


async def _insert(conn: Any, table: str, row_id: str, status: str, now: float) -> None:
    if table == "runs":
        await a_run(conn, row_id, now, status=status)
    elif table == "jobs":
        await conn.execute(
            sa.insert(jobs).values(
                id=row_id, run_id="r0", project_id="p", run_name="r0", job_num=0, replica_num=0, job_name=row_id,
                submission_num=next(_SUBMISSIONS), deployment_num=0, submitted_at=now, last_processed_at=now,
                status=status, job_spec="{}", priority=0, blocks=1, log_offset=0,
            )
        )  # fmt: skip
    elif table == "instances":
        await conn.execute(
            sa.insert(instances).values(
                id=row_id, project_id="p", name=row_id, instance_num=0, status=status, unreachable=False,
                backend="local", busy_blocks=0, created_at=now, deleted=False, last_processed_at=now,
            )
        )  # fmt: skip
    else:
        await conn.execute(
            sa.insert(fleets).values(
                id=row_id, project_id="p", name=row_id, created_at=now, last_processed_at=now, status=status,
                spec="{}", deleted=False,
            )
        )  # fmt: skip


async def _write(conn: Any, table: str, row_id: str, current: str, values: dict[str, Any], way: str) -> bool:
    """Write ``values`` to the row the store's own way for ``table``; whether it was written."""
    t = TABLES[table]
    expect: tuple[str, ...] | None = None
    if way == "expect_current":
        expect = (current,)
    elif way == "expect_two":
        expect = (current, next(s.value for s in STATUSES[table] if s.value != current))
    if way == "where":
        return await event_store.tracked_update(conn, t, t.c.id == row_id, values) > 0
    if table == "runs":
        return await run_store.update_run(conn, row_id, values, expect)
    if table == "jobs":
        return await run_store.update_job(conn, row_id, values, expect)
    if table == "instances":
        return await fleet_store.update_instance(conn, row_id, values, expect)
    return await event_store.tracked_update_by_id(conn, t, row_id, values, expect)


class _Driver:
    """A database and the event loop its machines run their coroutines on."""

    def __init__(self, path: Path, events_ttl: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.db = Database(f"sqlite+aiosqlite:///{path}", events_ttl=events_ttl)
        self.run(self._setup())

    def run(self, aw: Awaitable[T]) -> T:
        return self.loop.run_until_complete(aw)

    async def _setup(self) -> None:
        await upgrade(self.db)
        now = time.time()
        async with self.db.write() as conn:
            await admin_and_project(conn, now)
            await a_run(conn, "r0", now, status="running")  # the jobs' run

    async def read(self, table: str, row_id: str) -> tuple[str, float]:
        t = TABLES[table]
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(t.c.status, t.c.last_processed_at).where(t.c.id == row_id))).one()
        return row.status, float(row.last_processed_at)

    def close(self) -> None:
        self.run(self.db.dispose())
        self.loop.close()


def _machine(driver: _Driver, table: str) -> Callable[[], RuleBasedStateMachine]:
    kind = transitions.KINDS[table]
    statuses = [s.value for s in STATUSES[table]]

    class Machine(RuleBasedStateMachine):
        """One row and the status the table says it has; a sibling row written in the same transactions."""

        @initialize(start=st.sampled_from(statuses))
        def insert(self, start: str) -> None:
            self.id, self.sibling = str(uuid.uuid4()), str(uuid.uuid4())
            self.status, self.stamp, self.steps = start, 1.0, 1

            async def go() -> None:
                async with driver.db.write() as conn:
                    await _insert(conn, table, self.id, start, self.stamp)
                    await _insert(conn, table, self.sibling, start, self.stamp)

            driver.run(go())

        @rule(new=st.sampled_from(statuses), way=st.sampled_from(WAYS), strict=st.booleans())
        def move(self, new: str, way: str, strict: bool) -> None:
            legal = is_legal_transition(kind, self.status, new)
            self.steps += 1
            stamp = float(self.steps)  # written with the status: a refused row keeps its old one
            sibling_stamp = -stamp  # a change of another column of another row, in the same transaction

            async def go() -> bool:
                async with driver.db.write() as conn:
                    await _write(conn, table, self.sibling, "", {"last_processed_at": sibling_stamp}, "by_id")
                    return await _write(
                        conn, table, self.id, self.status, {"status": new, "last_processed_at": stamp}, way
                    )

            transitions.STRICT = strict
            try:
                written = driver.run(go())
                raised = False
            except IllegalTransition:
                written, raised = False, True
            finally:
                transitions.STRICT = True
            assert raised == (strict and not legal), (self.status, new, way, strict)
            assert written == legal, (self.status, new, way, strict)
            status, at = driver.run(driver.read(table, self.id))
            if legal:
                self.status, self.stamp = new, stamp
            assert (status, at) == (self.status, self.stamp), (new, way, strict)
            # the transaction committed unless the refusal raised
            _, sibling_at = driver.run(driver.read(table, self.sibling))
            assert (sibling_at == sibling_stamp) != raised

        @invariant()
        def row_matches(self) -> None:
            if hasattr(self, "id"):
                assert driver.run(driver.read(table, self.id)) == (self.status, self.stamp)

    Machine.__name__ = f"{kind.capitalize()}Transitions"
    return Machine


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("events_ttl", [30 * 24 * 3600.0, 0.0], ids=["events", "no-events"])
def test_the_choke_point_keeps_the_table(tmp_path: Path, table: str, events_ttl: float) -> None:
    driver = _Driver(tmp_path / "c.db", events_ttl)
    try:
        run_state_machine_as_test(  # type: ignore[no-untyped-call]  # (hypothesis leaves it unannotated)
            _machine(driver, table),
            settings=settings(
                max_examples=25,
                stateful_step_count=12,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            ),
        )
    finally:
        driver.close()


def test_every_table_names_every_status() -> None:
    for kind, (enum, table) in TRANSITIONS.items():
        assert set(table) == set(enum), kind
        for old, news in table.items():
            assert old not in news, f"{kind}: {old.value} -> itself is no transition"


async def test_tracked_update_refuses_an_illegal_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    await upgrade(db)
    now = time.time()
    async with db.write() as conn:
        await admin_and_project(conn, now)
        await a_run(conn, "r1", now, status="done")
    done = {"status": "running", "status_message": "back from the dead"}
    with pytest.raises(IllegalTransition, match="run r1 cannot go from done to running"):
        async with db.write() as conn:
            await event_store.tracked_update(conn, runs, runs.c.id == "r1", done)
    monkeypatch.setattr(transitions, "STRICT", False)  # production: refused, logged, nothing of the row written
    async with db.write() as conn:
        assert await event_store.tracked_update(conn, runs, runs.c.id == "r1", done) == 0
        assert not await run_store.update_run(conn, "r1", done)
    async with db.read() as conn:
        row = (await conn.execute(sa.select(runs.c.status, runs.c.status_message).where(runs.c.id == "r1"))).one()
    assert tuple(row) == ("done", None)
    await db.dispose()
