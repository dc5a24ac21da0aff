"""Scoped passes of the runs worker: a job's change in this process wakes the runs worker for that job's run
only (``Wakeups.wake_for``), so that a pass reads the runs that changed instead of every run in flight; any
other wake-up, the first pass and the safety net's pass cover every run. Real SQLite, the real worker."""

from __future__ import annotations

from pathlib import Path

from corral.context import Context, Wakeups
from corral.settings import Settings
from corral.store import run_states
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.workers.runs import Runs
from store_rows import run_statuses, two_runs_settling


async def test_a_pass_covers_everything_unless_it_was_woken_for_some_keys_only() -> None:
    w = Wakeups()
    heard: list[str] = []
    w.listen("runs", lambda: heard.append("runs"))
    assert w.take("runs") is None, "the first pass is a whole one"
    assert w.take("runs") is None, "so is a pass that nothing woke (run directly)"
    w.wake_for("runs", ["a"])
    w.wake_for("runs", ["b"])
    assert w.event("runs").is_set() and heard == ["runs", "runs"], "listeners (the UI's live pages) hear it"
    assert w.take("runs") == frozenset({"a", "b"})
    w.wake_for("runs", ["c"])
    w.wake_local("runs")
    assert w.take("runs") is None, "a wake-up without a scope makes the next pass a whole one"
    w.wake_for("runs", ["d"])
    w.make_whole("runs")
    assert w.take("runs") is None, "the safety net's pass is a whole one"
    w.wake_for("runs", ["e"])
    assert w.take("runs") == frozenset({"e"})


def test_names_another_replica_woke_wake_this_process_and_unknown_ones_are_ignored() -> None:
    w = Wakeups()
    heard: list[str] = []
    w.listen("access", lambda: heard.append("access"))
    for name in ("scheduler", "jobs"):
        w.take(name)
        w.event(name).clear()
    w.wake_remote(["scheduler", "access", "a-name-of-a-newer-version"])
    assert w.event("scheduler").is_set() and not w.event("jobs").is_set()
    assert heard == ["access"]


async def test_a_scoped_pass_settles_only_its_runs_and_a_whole_pass_the_rest(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    await upgrade(db)
    ctx = Context(Settings(server_dir=tmp_path, database_url=db.url), db, {})
    try:
        await two_runs_settling(db)
        worker = Runs(ctx)
        ctx.wakeups.take("runs")  # as if the first (whole) pass had run before these jobs changed
        ctx.wakeups.wake_for("runs", ["started"])
        await worker.pass_once()
        assert await run_statuses(db) == {"ran": "provisioning", "started": "running"}, "only the woken run is read"
        async with db.read() as conn:
            assert [r.id for r in await run_states.active_run_states(conn, settling=True, run_ids=["ran"])] == ["ran"]
            assert await run_states.active_run_states(conn, settling=True, run_ids=[]) == []
        ctx.wakeups.wake_local("runs")
        await worker.pass_once()
        assert await run_statuses(db) == {"ran": "done", "started": "running"}
    finally:
        await db.dispose()
