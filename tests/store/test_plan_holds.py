"""The commit point honours preemption holds (on SQLite and Postgres): the block a preemption freed on an
instance goes to the run that preempted for it, not to another run's job placed by a stale plan (one made
before the victim ended), while the preemptor waits and for ``HOLD_FOR`` after the victim ended. A preemptor
of another project is named by its project; without preemption (``holds=False``) nothing is held."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from test_plan_apply import OFFER, _db

from corral.scheduler.codec import offer_to_json
from corral.scheduler.holds import HOLD_FOR
from corral.scheduler.types import Assign, Gang, Plan
from corral.store.db import Database
from corral.store.plan_apply import apply_plan
from corral.store.tables import instances, jobs, runs
from store_rows import another_project


async def _setup(db: Database, message: str, ended_ago: float, preemptor_project: str = "p") -> None:
    """Instance ``i`` of two blocks: one busy (run ``r``'s job ``busy``), one freed by ``victim`` (ended
    ``ended_ago`` seconds ago, its stop naming the preemptor); run ``high`` (of ``preemptor_project``) and
    run ``other`` wait with a job each."""
    now = time.time()
    async with db.write() as conn:
        await another_project(conn, now, "q", "team-b")
        await conn.execute(
            sa.insert(instances).values(
                id="i", project_id="p", fleet_id="f", name="f-0", instance_num=0, status="busy",
                unreachable=False, backend="local", price=0.0, offer=json.dumps(offer_to_json(OFFER)),
                total_blocks=2, busy_blocks=1, created_at=now, last_processed_at=now, deleted=False,
            )
        )  # fmt: skip
        for run_id, project_id in (("high", preemptor_project), ("other", "p")):
            await conn.execute(
                sa.insert(runs).values(
                    id=run_id, project_id=project_id, user_id="u", run_name=run_id, submitted_at=now,
                    last_processed_at=now, status="submitted", run_spec="{}", priority=0, deployment_num=0,
                    deleted=False,
                )
            )  # fmt: skip
        rows = [
            ("busy", "r", "p", "running", "i", None, None, None),
            ("victim", "r", "p", "failed", "i", "preempted", message, now - ended_ago),
            ("high-0", "high", preemptor_project, "submitted", None, None, None, None),
            ("other-0", "other", "p", "submitted", None, None, None, None),
        ]
        for num, (job_id, run_id, project_id, status, inst, stop, why, finished) in enumerate(rows):
            await conn.execute(
                sa.insert(jobs).values(
                    id=job_id, run_id=run_id, project_id=project_id, run_name=run_id, job_num=num, replica_num=0,
                    job_name=job_id, submission_num=0, deployment_num=0, submitted_at=now, last_processed_at=now,
                    status=status, job_spec="{}", priority=0, blocks=1, log_offset=0, instance_id=inst,
                    stop_requested=stop, termination_reason_message=why, finished_at=finished,
                )
            )  # fmt: skip


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = await _db(db_url)
    yield database
    await database.dispose()  # (its pooled connections closed, not left to the collector)


def _place(job_id: str, run_id: str) -> Plan:
    return Plan((Gang(run_id, (Assign(job_id, "i", 1),)),))


WITHIN = "Preempted by run high (a higher-priority run of its project)"


async def test_a_held_block_goes_to_its_preemptor_only(db: Database) -> None:
    await _setup(db, WITHIN, ended_ago=1.0)
    stale = await apply_plan(db, _place("other-0", "other"), time.time(), holds=True)
    assert stale.rejected_runs == ["other"] and not stale.assigned
    placed = await apply_plan(db, _place("high-0", "high"), time.time(), holds=True)
    assert placed.assigned == ["high-0"]


async def test_without_preemption_nothing_is_held(db: Database) -> None:
    await _setup(db, WITHIN, ended_ago=1.0)
    assert (await apply_plan(db, _place("other-0", "other"), time.time())).assigned == ["other-0"]


async def test_a_hold_ends_with_its_bound(db: Database) -> None:
    await _setup(db, WITHIN, ended_ago=HOLD_FOR + 1)
    assert (await apply_plan(db, _place("other-0", "other"), time.time(), holds=True)).assigned == ["other-0"]


async def test_a_hold_ends_once_its_preemptor_no_longer_waits(db: Database) -> None:
    await _setup(db, WITHIN, ended_ago=1.0)
    async with db.write() as conn:  # the preemptor was stopped (or placed elsewhere)
        await conn.execute(sa.update(jobs).where(jobs.c.id == "high-0").values(status="terminated"))
    assert (await apply_plan(db, _place("other-0", "other"), time.time(), holds=True)).assigned == ["other-0"]


@pytest.mark.parametrize("named", ["team-b", "main"])
async def test_a_reclaiming_preemptor_is_found_by_its_project(db: Database, named: str) -> None:
    """The stop names the reclaiming run's project: only a waiting run of that name in that project holds."""
    await _setup(db, f"Preempted by run high of project {named} (a project reclaiming its quota)", 1.0, "q")
    result = await apply_plan(db, _place("other-0", "other"), time.time(), holds=True)
    assert result.assigned == ([] if named == "team-b" else ["other-0"])
