"""``schedule``: a scheduled run waits ``pending`` with ``next_triggered_at`` and no jobs, its trigger
submits its job, it goes back to ``pending`` after each end and fires again; across two server replicas
on Postgres a trigger fires once. The triggers worker is driven with a fake clock (``pass_once(now=...)``)
so the test never waits for a real minute; the runs between triggers are real (local backend)."""

from __future__ import annotations

import asyncio
import base64
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.store.triggers import Waiting
from corral.workers.runs import decide_run, rescheduled
from corral.workers.triggers import Triggers, due_triggers
from pg_harness import new_database_url
from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

#: Far from the wall clock (the real workers' timers never fire it during the test): only the fake clock does.
YEARLY = {"cron": "0 0 1 1 *"}


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_due_triggers_and_the_next_one() -> None:
    waiting = [Waiting("a", "a", 100.0), Waiting("b", "b", 50.0), Waiting("c", "c", 300.0)]
    due, upcoming = due_triggers(waiting, 100.0)
    assert [w.id for w in due] == ["b", "a"] and upcoming == 300.0
    assert due_triggers([], 5.0) == ([], None)


def test_a_scheduled_run_ends_back_in_pending_unless_a_user_stopped_it() -> None:
    assert rescheduled(["0 * * * *"], "all_jobs_done", 10.0) == 3600.0
    # never the trigger that started it again (a replica whose clock is behind)
    assert rescheduled(["0 * * * *"], "all_jobs_done", 3000.0, fired=3600.0) == 7200.0
    assert rescheduled(["0 * * * *"], "job_failed", 10.0) == 3600.0
    assert rescheduled(["0 * * * *"], "stopped_by_user", 0.0) is None
    assert rescheduled(["0 * * * *"], "aborted_by_user", 0.0) is None
    assert rescheduled(None, "all_jobs_done", 0.0) is None
    # stopped before its first trigger: no jobs, the stop ends it
    assert decide_run("terminating", "stopped_by_user", []) == ("terminated", "stopped_by_user")


async def _trigger(run: dict[str, Any]) -> float:
    assert run["status"] == "pending", run
    assert run["next_triggered_at"] is not None
    return _ts(run["next_triggered_at"]) + 1


async def test_schedule_fires_once_per_trigger_across_two_replicas(tmp_path: Path) -> None:
    url, key = new_database_url(), base64.b64encode(os.urandom(32)).decode()
    common = {"database_url": url, "encryption_key": key, "local_instances_dir": tmp_path / "instances"}
    first = make_settings(tmp_path / "a", **common)
    second = make_settings(tmp_path / "b", **common)
    async with running_server(first) as a, running_server(second) as b, a.client() as on_a, b.client() as on_b:
        assert (await on_a.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))).is_success
        body = task_body(["echo tick"], name="cron-run", schedule=YEARLY, fleets=["fl"])
        applied = await on_b.post("/api/project/main/runs/apply", json=body)
        assert applied.status_code == 200, applied.text
        assert applied.json()["status"] == "pending" and applied.json()["jobs"] == []
        run = await get_run(on_a, "cron-run")
        assert run["jobs"] == [] and run["status_message"] == "pending"
        replicas = (Triggers(a.ctx), Triggers(b.ctx))
        for trigger in range(2):
            now = await _trigger(await get_run(on_a, "cron-run"))
            fired = await asyncio.gather(*(r.pass_once(now=now) for r in replicas))
            assert sorted(fired) == [0, 1], fired  # one replica fired it, the other found nothing to do

            async def executed(n: int = trigger) -> dict[str, Any] | None:
                got = await get_run(on_a, "cron-run")
                subs = [s for j in got["jobs"] for s in j["job_submissions"]]
                done = len(subs) == n + 1 and subs[-1]["status"] == "done"
                return got if done and got["status"] == "pending" else None

            back = await wait_for(executed, timeout=40)
            assert back["status_message"] == "pending"
            subs = [s["submission_num"] for j in back["jobs"] for s in j["job_submissions"]]
            assert subs == list(range(trigger + 1))
            # the next trigger: a year after the one that fired (though the wall clock is before it)
            assert _ts(back["next_triggered_at"]) > now + 360 * 86400
        # a second pass at the same time fires nothing more
        assert await replicas[0].pass_once(now=now) == 0
        stopped = await on_a.post("/api/project/main/runs/stop", json={"runs_names": ["cron-run"], "abort": False})
        assert stopped.is_success

        async def ended() -> dict[str, Any] | None:
            got = await get_run(on_b, "cron-run")
            return got if got["status"] == "terminated" else None

        final = await wait_for(ended, timeout=20)
        assert final["termination_reason"] == "stopped_by_user" and final["next_triggered_at"] is None


def test_ps_shows_the_next_trigger() -> None:
    from corral.cli.runs_cmd import _waiting_lines

    run = {"run_spec": {"run_name": "nightly"}, "status": "pending", "next_triggered_at": "2026-12-02T03:00:00+00:00"}
    assert _waiting_lines([run]) == ["nightly: next trigger at 2026-12-02 03:00 UTC (schedule)"]


async def test_the_server_s_own_triggers_worker_fires_a_due_trigger(tmp_path: Path) -> None:
    """The running server's worker (wall clock, woken by a wake-up) fires a trigger that has come."""
    import sqlalchemy as sa

    from corral.store.tables import runs

    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))).is_success
        body = task_body(["echo fired"], name="due", schedule=YEARLY, fleets=["fl"])
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200
        async with s.ctx.db.write() as conn:  # its trigger has come (rather than waiting for January)
            await conn.execute(sa.update(runs).where(runs.c.run_name == "due").values(next_triggered_at=1.0))
        s.ctx.wakeups.wake("triggers")

        async def ran() -> dict[str, Any] | None:
            got = await get_run(c, "due")
            return got if got["jobs"] and got["status"] == "pending" else None

        back = await wait_for(ran, timeout=30)
        assert back["jobs"][0]["job_submissions"][0]["status"] == "done"
