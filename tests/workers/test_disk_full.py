"""A full disk under the server's state directory, as a real 64 MB tmpfs (no injected errors): a write that
fails for lack of space answers 507 naming the directory and its free space, reads keep working, a new run is
refused below the free-space watermark, everything heals by itself when space is freed (the work a failed write
held back within seconds, with no restart and no other wake-up), the server starts on a full disk, and a job's
output is stored once."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from corral.context import Context
from corral.domain.metrics import MetricsPoint
from corral.store import metrics as metrics_store
from corral.store.db import Database
from corral.store.migrate import upgrade
from corral.workers.metrics_retention import MetricsRetention
from corral.workers.runs import Runs
from corral.workers.runtime import run_passes
from server_harness import finished_run, fleet_body, get_run, make_settings, running_server, task_body, wait_for
from skip_policy import needs_root
from store_rows import run_statuses, two_runs_settling
from tmpfs_mount import MiB, fill, free, tmpfs

pytestmark = needs_root("mounting a tmpfs needs root (CI runs as root)")

#: The size of the state directory in the issue's timeline.
DISK = 64 * MiB
#: The watermark these tests set (the default is larger than their whole disk).
WATERMARK = 16 * MiB
#: Resources that fit a local instance whose disk is the 64 MB state directory.
SMALL = {"cpu": "1..", "memory": "0.1GB..", "disk": "0.01GB.."}


def task(name: str, *commands: str) -> dict[str, Any]:
    return task_body(list(commands), name=name, resources=SMALL)


def refused_for_space(r: Any, state_dir: Path) -> str:
    assert r.status_code == 507, (r.status_code, r.text)
    msg = str(r.json()["detail"][0]["msg"])
    assert str(state_dir) in msg and "MiB free" in msg, msg
    return msg


async def test_a_full_state_dir_refuses_writes_with_507_serves_reads_and_heals_without_a_restart(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "server", DISK) as state:
        settings = make_settings(tmp_path, min_free_disk=WATERMARK, disk_reserve=4 * MiB)
        async with running_server(settings) as s, s.client() as c:
            assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))).status_code == 200
            assert (await c.post("/api/project/main/runs/apply", json=task("before", "echo before"))).status_code == 200
            before = await finished_run(c, "before")
            sub = before["jobs"][0]["job_submissions"][-1]
            assert before["status"] == "done", (sub["termination_reason"], sub["termination_reason_message"])

            filler = fill(state)  # to the last byte
            r = await c.post("/api/users/create", json={"username": "alice", "global_role": "user"})
            refused_for_space(r, state)  # SQLite's "database or disk is full", answered 507
            r = await c.post("/api/project/main/runs/apply", json=task("during", "echo during"))
            assert "CORRAL_MIN_FREE_DISK_MB" in refused_for_space(r, state)
            # reads keep working
            assert (await c.post("/api/project/main/runs/list", json={})).status_code == 200
            assert (await c.post("/api/project/main/runs/get", json={"run_name": "before"})).status_code == 200

            # below the watermark but not full: a new run is still refused, by the watermark
            filler.unlink()
            filler = fill(state, leave=WATERMARK // 2)
            r = await c.post("/api/project/main/runs/apply", json=task("during", "echo during"))
            assert "CORRAL_MIN_FREE_DISK_MB" in refused_for_space(r, state)

            filler.unlink()  # space returns: everything works again, no restart
            r = await c.post("/api/users/create", json={"username": "alice", "global_role": "user"})
            assert r.status_code == 200, r.text
            assert (await c.post("/api/project/main/runs/apply", json=task("after", "echo after"))).status_code == 200
            assert (await finished_run(c, "after"))["status"] == "done"


#: A job that prints as fast as it can, 200-byte lines, for ever.
FLOOD = "yes " + "x" * 199


async def test_a_job_flooding_the_disk_is_held_above_the_floor_and_stops_deletes_and_new_runs_work(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "server", DISK) as state:
        settings = make_settings(tmp_path, min_free_disk=WATERMARK, disk_reserve=4 * MiB)
        async with running_server(settings) as s, s.client() as c:
            assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))).status_code == 200
            assert (await c.post("/api/project/main/runs/apply", json=task("flood", FLOOD))).status_code == 200

            async def low() -> bool:
                return free(state) < WATERMARK // 2 + MiB

            await wait_for(low, timeout=120, interval=0.2)  # the database stopped at 16 MiB, the agent at 8 MiB
            for _ in range(10):  # the job goes on printing; the disk is never full (the agent stops at 8 MiB free,
                await asyncio.sleep(0.3)  # the database's own writes -- metrics, events, its WAL -- take a little)
                assert free(state) > 2 * MiB, free(state)
            flood = await get_run(c, "flood")
            assert flood["status"] == "running"
            assert "CORRAL_MIN_FREE_DISK_MB" in flood["status_message"], flood["status_message"]
            r = await c.post("/api/project/main/runs/apply", json=task("during", "echo during"))
            assert "CORRAL_MIN_FREE_DISK_MB" in refused_for_space(r, state)
            # writes that cannot wait still fit: a user, a stop, the job's end, a delete
            r = await c.post("/api/users/create", json={"username": "carol", "global_role": "user"})
            assert r.status_code == 200, r.text
            r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["flood"], "abort": False})
            assert r.status_code == 200, r.text
            assert (await finished_run(c, "flood"))["status"] == "terminated"
            r = await c.post("/api/project/main/runs/delete", json={"runs_names": ["flood"]})
            assert r.status_code == 200, r.text

            async def space_back() -> bool:  # the stopped job's output left its agent's disk
                return free(state) > WATERMARK

            await wait_for(space_back, timeout=30, interval=0.2)
            assert (await c.post("/api/project/main/runs/apply", json=task("after", "echo after"))).status_code == 200
            assert (await finished_run(c, "after"))["status"] == "done"


async def test_the_server_starts_on_a_full_disk_and_says_why_writes_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "server", DISK) as state:
        settings = make_settings(tmp_path, min_free_disk=WATERMARK, disk_reserve=4 * MiB)
        async with running_server(settings) as s, s.client() as c:  # the database and the reserve are made
            assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))).status_code == 200
        filler = fill(state)
        assert free(state) == 0
        async with running_server(settings) as s, s.client() as c:
            said = [r.getMessage() for r in caplog.records if r.name == "corral.server"]
            assert any(str(state) in m and "reserve" in m and "refused until space returns" in m for m in said), said
            assert (await c.post("/api/project/main/fleets/list", json={})).status_code == 200
            r = await c.post("/api/project/main/runs/apply", json=task("during", "echo during"))
            assert "CORRAL_MIN_FREE_DISK_MB" in refused_for_space(r, state)
            filler.unlink()  # space returns: no restart needed
            assert (await c.post("/api/project/main/runs/apply", json=task("after", "echo after"))).status_code == 200
            assert (await finished_run(c, "after"))["status"] == "done"


async def test_a_jobs_output_is_stored_once_the_agent_drops_what_the_server_stored(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "server", DISK) as state:
        settings = make_settings(tmp_path, min_free_disk=WATERMARK, disk_reserve=4 * MiB)
        async with running_server(settings) as s, s.client() as c:
            assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))).status_code == 200
            prints = "python3 -c \"import sys\nfor i in range(100000): sys.stdout.write('%099d\\n' % i)\""
            assert (
                await c.post("/api/project/main/runs/apply", json=task("once", prints, "sleep 600"))
            ).status_code == 200
            found = await wait_for(lambda: asyncio.to_thread(lambda: list(state.glob("instances/**/logs.dat"))))
            (dat,) = found
            assert isinstance(dat, Path)

            async def all_on_the_agent() -> bool:
                return dat.stat().st_size >= 10_000_000

            await wait_for(all_on_the_agent, timeout=60, interval=0.2)

            async def released() -> int | None:  # the server stored it all and said so on its next poll
                held = dat.stat().st_blocks * 512
                return held if held <= 64 * 1024 else None

            await wait_for(released, timeout=60, interval=0.2)
            assert dat.stat().st_size >= 10_000_000
            r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["once"], "abort": True})
            assert r.status_code == 200
            assert (await finished_run(c, "once"))["status"] == "terminated"


async def test_a_stop_and_a_delete_are_written_on_a_disk_full_to_the_last_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Something else than corral filled the disk to the last byte: a stop and a delete -- what frees space --
    still go through, written in the room the emergency reserve gives back."""
    with tmpfs(tmp_path / "server", DISK) as state:
        settings = make_settings(tmp_path, min_free_disk=WATERMARK, disk_reserve=4 * MiB)
        async with running_server(settings) as s, s.client() as c:
            assert (state / "disk-reserve").exists()
            assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))).status_code == 200
            assert (await c.post("/api/project/main/runs/apply", json=task("held", "sleep 600"))).status_code == 200

            async def running() -> bool:
                return str((await get_run(c, "held"))["status"]) == "running"

            await wait_for(running, timeout=60)
            filler = fill(state)  # to the last byte
            r = await c.post("/api/users/create", json={"username": "bob", "global_role": "user"})
            refused_for_space(r, state)
            r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["held"], "abort": True})
            assert r.status_code == 200, r.text
            assert not (state / "disk-reserve").exists()
            assert "emergency reserve was released" in caplog.text
            assert (await finished_run(c, "held"))["status"] == "terminated"
            r = await c.post("/api/project/main/runs/delete", json={"runs_names": ["held"]})
            assert r.status_code == 200, r.text
            filler.unlink()


def give_back_the_wal(database: Path) -> None:
    """Checkpoint the server's SQLite database and truncate its write-ahead log, as SQLite does itself with
    ``wal_checkpoint(TRUNCATE)`` (https://www.sqlite.org/pragma.html#pragma_wal_checkpoint): the next write must
    take new blocks for the log, so that on a full disk it fails for sure (a log cycling in blocks it already holds
    would let a few small writes through)."""
    with sqlite3.connect(database, timeout=30) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def said_full(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "could not write" in r.getMessage()]


async def test_a_run_whose_end_could_not_be_written_ends_within_seconds_of_space_returning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills to the last byte while a run is in flight: its job ends, and the write of that end fails.
    Once space is freed, the run ends within seconds -- with no other wake-up (the safety net is a minute away)
    and no restart -- and the server's log said so in one line naming the state directory and its free space, not
    with a traceback per try."""
    caplog.set_level(logging.INFO, logger="corral")
    with tmpfs(tmp_path / "server", DISK) as state:
        settings = make_settings(tmp_path, min_free_disk=WATERMARK)
        assert settings.safety_net_interval >= 60
        async with running_server(settings) as s, s.client() as c:
            assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))).status_code == 200
            assert (await c.post("/api/project/main/runs/apply", json=task("ends", "sleep 4"))).status_code == 200

            async def running() -> bool:
                return str((await get_run(c, "ends"))["status"]) == "running"

            await wait_for(running, timeout=60)
            await asyncio.to_thread(give_back_the_wal, state / "data" / "corral.db")
            filler = fill(state)  # to the last byte, before the job ends
            await asyncio.sleep(8)  # the job ended meanwhile; its end was tried again, and failed, a few times
            assert (await get_run(c, "ends"))["status"] == "running"

            filler.unlink()
            freed = time.monotonic()
            ended = await finished_run(c, "ends", timeout=30)
            took = time.monotonic() - freed
            assert ended["status"] == "done", ended["jobs"][0]["job_submissions"][-1]
            assert took < 6, f"the run ended {took:.1f} s after space returned"

            (line,) = said_full(caplog)  # once for the whole episode, however many tries failed
            msg = line.getMessage()
            assert str(state) in msg and "MiB free" in msg, msg
            assert line.exc_info is None, "a full disk is said in one line, without a traceback"
            tracebacks = [r.getMessage() for r in caplog.records if r.exc_info is not None]
            assert not tracebacks, tracebacks
            assert any("every worker is woken" in r.getMessage() for r in caplog.records)


async def test_a_worker_pass_that_failed_for_lack_of_space_is_tried_again_whole_until_space_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The runs worker is woken for one run (``wake_for``) while the disk is full: its pass fails. It is tried
    again, whole (what it was woken for is not lost, and the other run settles too), after a short backoff, and
    goes through within seconds of space returning, with no other wake-up; the failures are said in one line, and
    every worker is woken once space returned."""
    caplog.set_level(logging.INFO, logger="corral")
    with tmpfs(tmp_path / "server", 8 * MiB) as state:
        db = Database(f"sqlite+aiosqlite:///{state / 'corral.db'}")
        ctx = Context(make_settings(tmp_path, database_url=db.url, min_free_disk=0), db, {})
        stopping = False
        passes: asyncio.Task[None] | None = None
        try:
            await upgrade(db)
            await two_runs_settling(db)
            ctx.wakeups.take("runs")  # as if the first (whole) pass had run before these jobs changed
            for name in ("scheduler", "jobs"):
                ctx.wakeups.event(name).clear()
            await asyncio.to_thread(give_back_the_wal, state / "corral.db")
            filler = fill(state)
            ctx.wakeups.wake_for("runs", ["started"])
            passes = asyncio.create_task(run_passes(ctx, "runs", Runs(ctx).pass_once, lambda: stopping))
            await asyncio.sleep(3)  # the pass failed, was tried again and failed again
            assert await run_statuses(db) == {"ran": "provisioning", "started": "provisioning"}
            assert not passes.done()

            filler.unlink()
            freed = time.monotonic()

            async def settled() -> bool:
                return await run_statuses(db) == {"ran": "done", "started": "running"}

            await wait_for(settled, timeout=30, interval=0.1)  # "ran" too: the pass tried again was a whole one
            took = time.monotonic() - freed
            assert took < 6, f"the pass went through {took:.1f} s after space returned"

            (line,) = said_full(caplog)
            msg = line.getMessage()
            assert "the runs pass" in msg and str(state) in msg and "MiB free" in msg, msg
            assert line.exc_info is None
            assert not [r.getMessage() for r in caplog.records if r.exc_info is not None]
            assert any("space returned" in r.getMessage() for r in caplog.records)
            assert ctx.wakeups.event("scheduler").is_set() and ctx.wakeups.event("jobs").is_set(), "all woken"
        finally:
            stopping = True
            if passes is not None:
                passes.cancel()
                await asyncio.gather(passes, return_exceptions=True)
            await db.dispose()


async def test_a_periodic_worker_on_a_full_disk_says_so_in_one_line_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The workers that run on their own interval (here the metrics retention, whose deletes must write) say a lack
    of space in the one line of the episode, without a traceback, and keep running."""
    caplog.set_level(logging.INFO, logger="corral")
    with tmpfs(tmp_path / "server", 8 * MiB) as state:
        db = Database(f"sqlite+aiosqlite:///{state / 'corral.db'}")
        ctx = Context(make_settings(tmp_path, database_url=db.url, min_free_disk=0), db, {})
        worker = MetricsRetention(ctx, batch=2)
        running: asyncio.Task[None] | None = None
        try:
            await upgrade(db)
            old = int((time.time() - 10 * 86_400) * 1_000_000)  # past every retention
            async with db.write() as conn:  # samples of a job gone since
                await metrics_store.add_points(conn, "gone", [MetricsPoint(old + i, 0, 1, 1, (), ()) for i in range(5)])
            await asyncio.to_thread(give_back_the_wal, state / "corral.db")
            filler = fill(state)
            running = asyncio.create_task(worker.run())

            async def failed() -> bool:
                return bool(said_full(caplog))

            await wait_for(failed, timeout=10)
            (line,) = said_full(caplog)
            assert "the metrics retention pass" in line.getMessage() and str(state) in line.getMessage()
            assert not [r.getMessage() for r in caplog.records if r.exc_info is not None]
            assert not running.done(), "it goes on, at its next interval"
            filler.unlink()
        finally:
            worker.stop()
            if running is not None:
                await asyncio.wait_for(running, timeout=5)
            await db.dispose()
