"""``GET /metrics``'s run counts come from counts kept with every write of a run: through a seeded random
sequence of applies, stops, finishes and deletes on a real server (local backend, workers on; SQLite and
Postgres) they stay equal to a ``GROUP BY`` over the runs, and the series say so. ``dstack_pending_runs_total``
(dstack 0.22.5's counter of runs going back to ``pending``: a retry with no replica left running) counts the
whole-run retries by project and run type."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from server_harness import RunningServer, finished_run, fleet_body, get_run, task_body, wait_for

#: One statement, so that Postgres reads both sides in one snapshot (the workers write meanwhile).
COMPARE = sa.text(
    "SELECT 'kept', project_id, user_id, status, count FROM run_counts WHERE count <> 0 "
    "UNION ALL SELECT 'recount', project_id, user_id, status, COUNT(*) FROM runs "
    "GROUP BY project_id, user_id, status"
)
FINISHED = ("done", "failed", "terminated")


async def _check(server: RunningServer) -> dict[tuple[str, str, str], int]:
    kept: dict[tuple[str, str, str], int] = {}
    recount: dict[tuple[str, str, str], int] = {}
    async with server.ctx.db.read() as conn:
        for side, project_id, user_id, status, n in await conn.execute(COMPARE):
            (kept if side == "kept" else recount)[(project_id, user_id, status)] = int(n)
    assert kept == recount
    return kept


async def _scrape(server: RunningServer) -> dict[str, Any]:
    server.ctx.settings = replace(server.ctx.settings, enable_prometheus_metrics=True)
    async with server.client() as c:
        r = await c.get("/metrics")
    assert r.status_code == 200
    return {"text": r.text, "families": {f.name: f for f in text_string_to_metric_families(r.text)}}


async def test_run_counts_follow_applies_stops_finishes_and_deletes(server: RunningServer) -> None:
    rng = random.Random(47)
    commands = (["true"], ["exit 3"], ["sleep 60"])
    names: list[str] = []
    deleted: set[str] = set()
    async with server.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))).is_success
        for step in range(14):
            kind = rng.choice(("apply", "apply", "stop", "finish", "delete")) if names else "apply"
            if kind == "apply":
                name = f"r{step}"
                body = task_body(rng.choice(commands), name=name)
                assert (await c.post("/api/project/main/runs/apply", json=body)).is_success
                names.append(name)
            elif kind == "stop":
                stop = {"runs_names": [rng.choice(names)], "abort": rng.random() < 0.5}
                assert (await c.post("/api/project/main/runs/stop", json=stop)).is_success
            elif kind == "finish":
                await finished_run(c, rng.choice(names))
            else:
                finished = [n for n in names if n not in deleted and (await get_run(c, n))["status"] in FINISHED]
                if finished:
                    name = rng.choice(finished)
                    assert (await c.post("/api/project/main/runs/delete", json={"runs_names": [name]})).is_success
                    deleted.add(name)
            await _check(server)
        stop_all = {"runs_names": [n for n in names if n not in deleted], "abort": False}
        assert (await c.post("/api/project/main/runs/stop", json=stop_all)).is_success
        outcomes = [(await finished_run(c, n))["status"] if n not in deleted else "deleted" for n in names]
    kept = await _check(server)
    assert sum(kept.values()) == len(names)  # a deleted run is still counted, as dstack counts it
    assert len(deleted) >= 1 and len(set(outcomes)) >= 2, outcomes  # the sequence went somewhere
    families = (await _scrape(server))["families"]
    labels = {"dstack_project_name": "main", "dstack_user_name": "admin"}
    total = [s for s in families["dstack_run_count"].samples if s.labels == labels]
    assert [s.value for s in total] == [float(len(names))]
    done = [s.value for s in families["dstack_run_count_done"].samples if s.labels == labels]
    assert done == [float(sum(v for (_, _, status), v in kept.items() if status == "done"))]


async def test_pending_runs_total_counts_whole_run_retries(server: RunningServer, tmp_path: Any) -> None:
    marker = tmp_path / "first-try"
    once = f"if [ -f {marker} ]; then echo second try; else touch {marker}; exit 3; fi"
    retry = {"on_events": ["error"], "duration": "1h"}
    async with server.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))).is_success
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="plain"))
        before = await _scrape(server)
        assert "dstack_pending_runs_total" not in before["text"]  # none yet: a family without samples is left out
        await c.post("/api/project/main/runs/apply", json=task_body([once], name="flaky", retry=retry))
        run = await finished_run(c, "flaky")
        assert run["status"] == "done" and len(run["jobs"][0]["job_submissions"]) == 2, run
        await finished_run(c, "plain")

    async def scraped_once() -> dict[str, Any] | None:
        got = await _scrape(server)
        return got if "dstack_pending_runs_total{" in got["text"] else None

    text = (await wait_for(scraped_once))["text"]
    lines = [line for line in text.splitlines() if "dstack_pending_runs_total" in line]
    assert lines == [
        "# HELP dstack_pending_runs_total Number of pending runs",
        "# TYPE dstack_pending_runs_total counter",
        'dstack_pending_runs_total{project_name="main",run_type="task"} 1.0',
    ]
