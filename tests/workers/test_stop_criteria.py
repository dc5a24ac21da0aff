"""``stop_criteria`` of a multi-node task (local backend, real server and agents), as dstack 0.22.5 runs it:
``master-done`` ends the run done once its master job is, stopping the other nodes (``done_by_runner``);
``all-done`` (the default) waits for every node."""

from __future__ import annotations

from pathlib import Path

from server_harness import finished_run, fleet_body, make_settings, running_server, task_body

#: The master (rank 0) ends at once; the worker would run for ten minutes.
SCRIPT = 'if [ "$DSTACK_NODE_RANK" = 0 ]; then echo master done; exit 0; fi; sleep 600'


async def test_master_done_ends_the_run_when_the_master_job_is_done(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        body = task_body([SCRIPT], name="pair", nodes=2, stop_criteria="master-done")
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text
        run = await finished_run(c, "pair")
        assert (run["status"], run["termination_reason"]) == ("done", "all_jobs_done"), run
        master, worker = (j["job_submissions"] for j in run["jobs"])
        assert len(master) == len(worker) == 1
        assert (master[0]["status"], master[0]["exit_status"]) == ("done", 0)
        assert (worker[0]["status"], worker[0]["termination_reason"]) == ("done", "done_by_runner"), worker
        assert "master-done" in worker[0]["termination_reason_message"]


async def test_all_done_waits_for_every_node(tmp_path: Path) -> None:
    script = 'if [ "$DSTACK_NODE_RANK" = 0 ]; then exit 0; fi; sleep 2; echo worker done'
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        body = task_body([script], name="pair", nodes=2, stop_criteria="all-done")
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200
        run = await finished_run(c, "pair")
        assert (run["status"], run["termination_reason"]) == ("done", "all_jobs_done"), run
        worker = run["jobs"][1]["job_submissions"]
        assert (worker[0]["status"], worker[0]["termination_reason"]) == ("done", "done_by_runner")
        assert worker[0]["exit_status"] == 0
