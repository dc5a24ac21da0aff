"""A host lost mid-job: the job fails with ``instance_unreachable`` and, when its ``retry`` covers
``error`` (dstack's event for that reason), the run is submitted again and finishes on another host."""

from __future__ import annotations

from typing import Any

import httpx
from ssh_harness import apply_fleet, fleet_settled, run_get, run_logs, run_status, ssh_fleet, submit

from fakehosts import FakeHosts
from server_harness import RunningServer, wait_for


async def test_run_retried_on_another_host_when_its_host_is_lost(server: RunningServer, hosts: FakeHosts) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "pair", [hosts.ip("cpu1"), hosts.ip("cpu2")]))
        await wait_for(lambda: fleet_settled(c, "pair", 2), timeout=30)
        await submit(
            c,
            "resilient",
            ["echo started on $(hostname)", "sleep 4", "echo finished on $(hostname)"],
            retry={"on_events": ["error"], "duration": "1h"},
        )
        run = await run_status(c, "resilient", "running")
        await wait_for(lambda: _logs_contain(c, "resilient", "started"))
        first_ip = run["latest_job_submission"]["job_provisioning_data"]["internal_ip"]
        first = next(n for n in ("cpu1", "cpu2") if hosts.ip(n) == first_ip)
        other = "cpu2" if first == "cpu1" else "cpu1"
        hosts.kill(first)  # power cut mid-job

        async def resubmitted() -> dict[str, Any] | None:
            got = await run_get(c, "resilient")
            return got if len(got["jobs"][0]["job_submissions"]) == 2 else None

        run = await wait_for(resubmitted, timeout=30)
        assert run["status"] in ("submitted", "provisioning", "running"), run
        run = await run_status(c, "resilient", "done", "failed", timeout=30)
        assert run["status"] == "done" and run["termination_reason"] == "all_jobs_done", run
        subs = run["jobs"][0]["job_submissions"]
        assert [s["submission_num"] for s in subs] == [0, 1]
        assert subs[0]["status"] == "failed" and subs[0]["termination_reason"] == "instance_unreachable", subs[0]
        assert subs[1]["job_provisioning_data"]["internal_ip"] == hosts.ip(other)
        assert (await run_logs(c, run)).splitlines() == [f"started on {other}", f"finished on {other}"]


async def test_run_fails_when_its_retry_does_not_cover_the_event(server: RunningServer, hosts: FakeHosts) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "pair", [hosts.ip("cpu1"), hosts.ip("cpu2")]))
        await wait_for(lambda: fleet_settled(c, "pair", 2), timeout=30)
        await submit(c, "fragile", ["echo started", "sleep 600"], retry={"on_events": ["no-capacity"]})
        run = await run_status(c, "fragile", "running")
        await wait_for(lambda: _logs_contain(c, "fragile", "started"))
        first_ip = run["latest_job_submission"]["job_provisioning_data"]["internal_ip"]
        hosts.kill(next(n for n in ("cpu1", "cpu2") if hosts.ip(n) == first_ip))
        run = await run_status(c, "fragile", "failed", timeout=30)
        assert run["termination_reason"] == "job_failed"
        assert len(run["jobs"][0]["job_submissions"]) == 1


async def _logs_contain(c: httpx.AsyncClient, name: str, text: str) -> bool:
    return text in await run_logs(c, await run_get(c, name))


async def test_job_placed_on_a_host_that_just_died_fails_and_is_retried(
    server: RunningServer, hosts: FakeHosts
) -> None:
    """The host dies between placement and its agent taking the job: the job must not stay
    ``provisioning`` for ever; it fails ``instance_unreachable`` and its retry places it elsewhere."""
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "pair", [hosts.ip("cpu1"), hosts.ip("cpu2")]))
        await wait_for(lambda: fleet_settled(c, "pair", 2), timeout=30)
        await submit(c, "blocker", ["sleep 600"], instances=[{"hostname": "cpu2"}])
        await run_status(c, "blocker", "running")
        hosts.kill("cpu1")  # not yet noticed by the health checks: the scheduler may still pick it
        await submit(c, "late", ["hostname"], retry={"on_events": ["error", "no-capacity"], "duration": "1h"})

        async def first_failed() -> dict[str, Any] | None:
            run = await run_get(c, "late")
            first = run["jobs"][0]["job_submissions"][0]
            return run if first["status"] == "failed" or run["status"] == "done" else None

        run = await wait_for(first_failed, timeout=30)
        first = run["jobs"][0]["job_submissions"][0]
        if first["status"] == "failed":  # it went to the dead host (the usual case)
            assert first["termination_reason"] == "instance_unreachable", first
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["blocker"], "abort": True})
        run = await run_status(c, "late", "done", "failed", timeout=30)
        assert run["status"] == "done", [
            (s["status"], s["termination_reason"], s["termination_reason_message"])
            for s in run["jobs"][0]["job_submissions"]
        ]
        assert (await run_logs(c, run)).strip() == "cpu2"
