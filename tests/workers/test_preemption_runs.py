"""Preemption end to end (local backend, real server and agents): on a fleet of two instances held by two
low-priority tasks, a high-priority run takes the place of exactly one, the most recently started; the
victim gets SIGTERM with its deadline readable in ``CORRAL_PREEMPTION_FILE``, its submission fails
``interrupted_by_no_capacity`` naming the preemptor, and it is submitted again (although it has no
``retry``), keeping its place in the queue ahead of a run submitted after it (the run's status message
naming the preemptor meanwhile), and finishes after the preemptor; the other low run is untouched. A
multi-node run is preempted and requeued whole, and a project below its nominal quota reclaims an exported
instance from a borrowing project, which then goes to it although another project's run waits too. A
preempted dev environment is not requeued: its run ends failed, its message naming the preemptor."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from pathlib import Path

from server_harness import fleet_body, get_run, make_settings, running_server, task_body, wait_for

CONFIG = """
projects:
  - name: main
    preemptible_max_priority: 50
scheduling:
  preemption: {enabled: true, min_priority_gap: 10, min_runtime: 0, grace_period: 2s}
"""


async def test_high_priority_run_preempts_the_newest_low_one_which_is_requeued(tmp_path: Path) -> None:
    release, notice, started = tmp_path / "release", tmp_path / "notice", tmp_path / "b-started"
    wait_release = f"for i in $(seq 600); do [ -f {release} ] && exit 0; sleep 0.1; done; exit 1"
    low_b = (
        f"if [ -f {notice} ]; then test -f {release}; exit $?; fi; "  # the new submission: after the preemptor
        f"trap 'cat \"$CORRAL_PREEMPTION_FILE\" > {notice}; date +%s >> {notice}; exit 0' TERM; "
        f"touch {started}; while true; do sleep 0.1; done"
    )
    settings = make_settings(tmp_path, enable_prometheus_metrics=True)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))
        r = await c.post("/api/project/main/runs/apply", json=task_body([wait_release], name="low-a", priority=0))
        assert r.status_code == 200, r.text

        async def running(name: str) -> bool:
            return bool((await get_run(c, name))["status"] == "running")

        await wait_for(lambda: running("low-a"))
        r = await c.post("/api/project/main/runs/apply", json=task_body([low_b], name="low-b", priority=0))
        assert r.status_code == 200, r.text
        await wait_for(lambda: running("low-b"))
        await wait_for(lambda: _exists(started))
        r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="low-c", priority=0))
        assert r.status_code == 200, r.text
        high = task_body([f"sleep 3; touch {release}"], name="high", priority=90)
        asked = time.time()
        assert (await c.post("/api/project/main/runs/apply", json=high)).status_code == 200

        async def finished(name: str) -> dict[str, object] | None:
            run = await get_run(c, name)
            return run if run["status"] in ("done", "failed", "terminated") else None

        async def requeued() -> list[str]:
            names = [e["run_name"] for e in (await c.post("/api/scheduling/queue", json={})).json()]
            return names if "low-b" in names and "high" not in names else []

        # while the preemptor runs, the requeued run waits in its original place: before low-c
        assert await wait_for(requeued) == ["low-b", "low-c"]

        # and the run says who preempted it while it waits
        async def says_who() -> dict[str, object] | None:
            run = await get_run(c, "low-b")
            return run if str(run["status_message"]).startswith("Preempted by run high") else None

        assert await wait_for(says_who, timeout=10), await get_run(c, "low-b")
        high_run = await wait_for(lambda: finished("high"), timeout=30)
        b_run = await wait_for(lambda: finished("low-b"), timeout=30)
        a_run = await wait_for(lambda: finished("low-a"), timeout=30)
        assert (await wait_for(lambda: finished("low-c"), timeout=30))["status"] == "done"

        assert high_run["status"] == "done", high_run
        assert a_run["status"] == "done" and len(a_run["jobs"][0]["job_submissions"]) == 1, a_run
        subs = b_run["jobs"][0]["job_submissions"]
        assert b_run["status"] == "done", [(x["status"], x["termination_reason"]) for x in subs]
        assert [(x["status"], x["termination_reason"]) for x in subs] == [
            ("failed", "interrupted_by_no_capacity"),
            ("done", "done_by_runner"),
        ]
        assert "Preempted by run high" in subs[0]["termination_reason_message"]
        assert "Preempted by run high" in subs[0]["status_message"]

        # the victim read its deadline: the grace period (2 s) after the stop, in the file, before SIGTERM
        lines = notice.read_text().splitlines()
        deadline = int(lines[0].removeprefix("CORRAL_PREEMPTION_DEADLINE="))
        termed = int(lines[-1])
        assert lines[1].startswith("CORRAL_PREEMPTION_MESSAGE=") and "high" in lines[1]
        assert asked - 1 <= termed <= deadline <= termed + 3, (asked, termed, deadline)

        events = await c.post("/api/events/list", json={"target_runs": [b_run["id"]]})
        assert events.status_code == 200, events.text
        assert any("preempted by run high" in e["message"] for e in events.json()), events.json()
        assert "corral_preemptions_total 1" in (await c.get("/metrics")).text


async def _exists(path: Path) -> bool:
    return path.exists()


RECLAIM = """
projects:
  - name: main
    quota: {nominal: {cpu: 0}}
    preemptible_max_priority: 50
  - name: team-b
    quota: {nominal: {cpu: 64}}
  - name: team-c
scheduling:
  preemption: {enabled: true, min_runtime: 0, grace_period: 2s}
"""


async def test_a_project_below_its_nominal_quota_reclaims_from_a_borrowing_one(tmp_path: Path) -> None:
    """main's fleet of two, exported to team-b and team-c; main (nominal 0) holds both; team-b (nominal
    above one instance) takes one back from main's most recent run, which is requeued and finishes
    afterwards. A run of team-c (no nominal, so it reclaims nothing) waits too, ahead of team-b's by fair
    share (both hold nothing) and priority, yet the freed instance goes to team-b's run, which preempted:
    nothing more is preempted for it."""
    release = tmp_path / "release"
    hold = f"for i in $(seq 600); do [ -f {release} ] && exit 0; sleep 0.1; done; exit 1"
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(RECLAIM)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))
        share = {"name": "share", "importer_projects": ["team-b", "team-c"], "exported_fleets": ["fl"]}
        assert (await c.post("/api/project/main/exports/create", json=share)).status_code == 200
        for name in ("main-1", "main-2"):
            body = task_body([hold], name=name, priority=50)
            assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

            async def running(name: str = name) -> bool:
                return bool((await get_run(c, name))["status"] == "running")

            await wait_for(running)
        other = task_body([f"date +%s.%N > {tmp_path}/other-start"], name="other", priority=40)
        assert (await c.post("/api/project/team-c/runs/apply", json=other)).status_code == 200
        body = task_body([f"date +%s.%N > {tmp_path}/back-start; sleep 1; touch {release}"], name="back", priority=0)
        assert (await c.post("/api/project/team-b/runs/apply", json=body)).status_code == 200

        async def finished(name: str, project: str = "main") -> dict[str, object] | None:
            run = await get_run(c, name, project)
            return run if run["status"] in ("done", "failed", "terminated") else None

        back = await wait_for(lambda: finished("back", "team-b"), timeout=30)
        assert back["status"] == "done", back
        first = await wait_for(lambda: finished("main-1"), timeout=30)
        second = await wait_for(lambda: finished("main-2"), timeout=30)
        assert first["status"] == "done" and len(first["jobs"][0]["job_submissions"]) == 1, first
        subs = second["jobs"][0]["job_submissions"]
        assert [(x["status"], x["termination_reason"]) for x in subs] == [
            ("failed", "interrupted_by_no_capacity"),
            ("done", "done_by_runner"),
        ], subs
        why = "Preempted by run back of project team-b (a project reclaiming its quota)"
        assert why in subs[0]["termination_reason_message"]
        assert (await wait_for(lambda: finished("other", "team-c"), timeout=30))["status"] == "done"
        # the instance main-2 gave back went to back, the preemptor; other ran once main-1 was done
        assert float((tmp_path / "back-start").read_text()) < float((tmp_path / "other-start").read_text())


async def test_a_multi_node_run_is_preempted_whole_and_requeued_whole(tmp_path: Path) -> None:
    gang = (
        f"if [ -f {tmp_path}/notice-$DSTACK_NODE_RANK ]; then test -f {tmp_path}/high-ran; exit $?; fi; "
        f"trap 'touch {tmp_path}/notice-$DSTACK_NODE_RANK; exit 0' TERM; while true; do sleep 0.1; done"
    )
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        body = task_body([gang], name="pair", nodes=2, priority=0)
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def running() -> bool:
            return bool((await get_run(c, "pair"))["status"] == "running")

        await wait_for(running)
        high = task_body([f"touch {tmp_path}/high-ran"], name="high", priority=90)
        assert (await c.post("/api/project/main/runs/apply", json=high)).status_code == 200

        async def finished(name: str) -> dict[str, object] | None:
            run = await get_run(c, name)
            return run if run["status"] in ("done", "failed", "terminated") else None

        assert (await wait_for(lambda: finished("high"), timeout=30))["status"] == "done"
        pair = await wait_for(lambda: finished("pair"), timeout=30)
        per_node = [[(x["status"], x["termination_reason"]) for x in j["job_submissions"]] for j in pair["jobs"]]
        assert per_node == [[("failed", "interrupted_by_no_capacity"), ("done", "done_by_runner")]] * 2, per_node
        assert (tmp_path / "notice-0").exists() and (tmp_path / "notice-1").exists()


DEV_CONFIG = """
projects:
  - name: main
    preemptible_max_priority: 50
    preemptible_run_types: [dev-environment]
scheduling:
  preemption: {enabled: true, min_priority_gap: 10, min_runtime: 0, grace_period: 1s}
"""


async def test_a_preempted_dev_environment_ends_and_says_why_instead_of_being_requeued(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(DEV_CONFIG)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        dev = {"type": "dev-environment", "name": "dev", "ide": "vscode", "priority": 0}
        r = await c.post(
            "/api/project/main/runs/apply", json={"force": False, "plan": {"run_spec": {"configuration": dev}}}
        )
        assert r.status_code == 200, r.text

        async def status(name: str) -> str:
            return str((await get_run(c, name))["status"])

        await wait_for(lambda: _is(status("dev"), "running"), timeout=60)
        r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="high", priority=90))
        assert r.status_code == 200, r.text

        async def finished(name: str) -> dict[str, object] | None:
            run = await get_run(c, name)
            return run if run["status"] in ("done", "failed", "terminated") else None

        dev_run = await wait_for(lambda: finished("dev"), timeout=30)
        assert (dev_run["status"], dev_run["termination_reason"]) == ("failed", "job_failed"), dev_run
        assert str(dev_run["status_message"]).startswith("Preempted by run high"), dev_run
        subs = dev_run["jobs"][0]["job_submissions"]
        assert [(x["status"], x["termination_reason"]) for x in subs] == [("failed", "interrupted_by_no_capacity")]
        assert (await wait_for(lambda: finished("high"), timeout=30))["status"] == "done"


async def _is(value: Awaitable[str], expected: str) -> bool:
    return await value == expected
