"""Jobs that fail after they ran, resubmitted by their ``retry`` (local backend, real server and agents):
a failure then a success, a crash loop stopped by ``retry.duration``, no retry without one, and a
multi-node replica resubmitted whole."""

from __future__ import annotations

from pathlib import Path

from server_harness import finished_run, fleet_body, make_settings, running_server, task_body

ON_ERROR = {"on_events": ["error"], "duration": "1h"}


async def test_failed_job_resubmitted_until_it_succeeds(tmp_path: Path) -> None:
    marker = tmp_path / "first-try"
    once = f"if [ -f {marker} ]; then echo second try; else touch {marker}; echo first try; exit 3; fi"
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))
        await c.post("/api/project/main/runs/apply", json=task_body([once], name="flaky", retry=ON_ERROR))
        await c.post("/api/project/main/runs/apply", json=task_body(["exit 3"], name="no-retry"))
        run = await finished_run(c, "flaky")
        assert run["status"] == "done" and run["termination_reason"] == "all_jobs_done", run
        subs = run["jobs"][0]["job_submissions"]
        assert [(x["submission_num"], x["status"], x["exit_status"]) for x in subs] == [
            (0, "failed", 3),
            (1, "done", 0),
        ]
        assert subs[0]["termination_reason"] == "container_exited_with_error"
        assert run["latest_job_submission"]["id"] == subs[1]["id"]

        plain = await finished_run(c, "no-retry")
        assert plain["status"] == "failed" and plain["termination_reason"] == "job_failed"
        assert len(plain["jobs"][0]["job_submissions"]) == 1


async def test_crash_loop_stops_when_the_retry_duration_runs_out(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        retry = {"on_events": ["error"], "duration": "2s"}
        await c.post("/api/project/main/runs/apply", json=task_body(["exit 1"], name="crash", retry=retry))
        run = await finished_run(c, "crash")
        assert run["status"] == "failed" and run["termination_reason"] == "retry_limit_exceeded", run
        subs = run["jobs"][0]["job_submissions"]
        assert len(subs) >= 2 and all(x["status"] == "failed" for x in subs)
        assert [x["submission_num"] for x in subs] == list(range(len(subs)))
        first_failure = min(x["finished_at"] for x in subs)
        assert first_failure is not None


async def test_multi_node_replica_is_resubmitted_whole(tmp_path: Path) -> None:
    m0, m1 = tmp_path / "rank0", tmp_path / "rank1"
    script = (
        f'if [ "$DSTACK_NODE_RANK" = 0 ] && [ ! -f {m0} ]; then touch {m0}; sleep 600; fi; '
        f'if [ "$DSTACK_NODE_RANK" = 1 ] && [ ! -f {m1} ]; then touch {m1}; sleep 1; exit 5; fi; '
        'echo "rank $DSTACK_NODE_RANK ok"'
    )
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        await c.post("/api/project/main/runs/apply", json=task_body([script], name="pair", nodes=2, retry=ON_ERROR))
        run = await finished_run(c, "pair")
        assert run["status"] == "done", [
            (x["submission_num"], x["status"], x["termination_reason"], x["termination_reason_message"])
            for j in run["jobs"]
            for x in j["job_submissions"]
        ]
        rank0, rank1 = (j["job_submissions"] for j in run["jobs"])
        assert [x["status"] for x in rank1] == ["failed", "done"] and rank1[0]["exit_status"] == 5
        # the healthy node of the failed replica was stopped by the server, then submitted again with it
        assert [x["status"] for x in rank0] == ["terminated", "done"]
        assert rank0[0]["termination_reason"] == "terminated_by_server"
        assert rank0[0]["termination_reason_message"] == "Run is to be resubmitted"
        assert rank0[1]["submission_num"] == rank1[1]["submission_num"] == 1


async def test_without_retry_a_failed_node_fails_the_run_and_the_server_stops_the_others(tmp_path: Path) -> None:
    script = 'if [ "$DSTACK_NODE_RANK" = 1 ]; then sleep 1; exit 5; fi; sleep 600'
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        await c.post("/api/project/main/runs/apply", json=task_body([script], name="pair", nodes=2))
        run = await finished_run(c, "pair")
        assert run["status"] == "failed" and run["termination_reason"] == "job_failed", run
        rank0, rank1 = (j["job_submissions"] for j in run["jobs"])
        assert len(rank0) == len(rank1) == 1
        assert rank1[0]["status"] == "failed" and rank1[0]["exit_status"] == 5
        assert (rank0[0]["status"], rank0[0]["termination_reason"]) == ("terminated", "terminated_by_server")
        assert rank0[0]["termination_reason_message"] == "Stopped: another job of the run failed"


async def test_max_duration_ends_the_job_terminated_and_the_run_failed(tmp_path: Path) -> None:
    """dstack 0.22.5: the job ``terminated``/``max_duration_exceeded``; without a retry that applies (``error``
    does not cover it) the run ``failed``/``job_failed``."""
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        body = task_body(["sleep 60"], name="too-long", max_duration="1s", stop_duration="1s", retry=ON_ERROR)
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200
        run = await finished_run(c, "too-long")
        assert (run["status"], run["termination_reason"]) == ("failed", "job_failed"), run
        subs = run["jobs"][0]["job_submissions"]
        assert len(subs) == 1, subs
        assert (subs[0]["status"], subs[0]["termination_reason"]) == ("terminated", "max_duration_exceeded")
