"""The gaps dstack still has, each as a test: corral's limit is hard in every one of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from corral.store.tables import instances, jobs
from corral.workers.scheduling import Scheduling
from server_harness import RunningServer, fleet_body, make_settings, running_server, task_body, wait_for


async def _run(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    return dict((await c.post("/api/project/main/runs/get", json={"run_name": name})).json())


def _status_is(c: httpx.AsyncClient, name: str, *statuses: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await _run(c, name))["status"] in statuses

    return check


async def _instance_statuses(s: RunningServer) -> list[str]:
    async with s.ctx.db.read() as conn:
        return [r.status for r in (await conn.execute(sa.select(instances.c.status))).all()]


class Sampler:
    """Counts the instances that count against nodes.max, every 20 ms, from the database."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.samples: list[int] = []
        self.ids: set[str] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while not self._stop.is_set():
            async with self.server.ctx.db.read() as conn:
                rows = (await conn.execute(sa.select(instances.c.id, instances.c.status))).all()
            live = [r for r in rows if r.status != "terminated"]
            self.samples.append(len(live))
            self.ids.update(r.id for r in rows)
            await asyncio.sleep(0.02)

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


async def test_terminating_instance_counts_until_backend_confirms(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        compute: Any = s.ctx.computes["local"]
        real = compute.terminate_instance

        async def slow_terminate(instance_id: str, agent: Any) -> None:
            await asyncio.sleep(2.0)
            await real(instance_id, agent)

        compute.terminate_instance = slow_terminate
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="first"))
        await wait_for(_status_is(c, "first", "done"))
        async with Sampler(s) as sampler:
            r = await c.post("/api/project/main/fleets/delete_instances", json={"name": "fl", "instance_nums": [0]})
            assert r.status_code == 200
            await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="second"))
            # A scheduling pass while the old instance's termination is unconfirmed (it takes 2 s) leaves the job
            # waiting: the old one still counts.
            await Scheduling(s.ctx).pass_once()
            assert (await _run(c, "second"))["status"] == "submitted"
            assert await _instance_statuses(s) == ["terminating"], "the pass ran before the backend confirmed"
            await wait_for(_status_is(c, "second", "done"), timeout=30)
        assert max(sampler.samples) <= 1
        assert len(sampler.ids) == 2  # a new instance only after the old one was confirmed gone


async def test_min_equals_max_with_lost_instance_never_exceeds_max(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes=2))

        async def two_idle() -> bool:
            insts = (await c.post("/api/instances/list", json={})).json()
            return bool(sum(i["status"] == "idle" for i in insts) == 2)

        await wait_for(two_idle)
        async with Sampler(s) as sampler:
            # The backend lost one instance (as a reaper would record it) while jobs reserve capacity.
            async with s.ctx.db.write() as conn:
                first = (await conn.execute(sa.select(instances.c.id).limit(1))).scalar_one()
                await conn.execute(sa.update(instances).where(instances.c.id == first).values(status="terminated"))
            s.ctx.wakeups.wake()
            applied = await asyncio.gather(
                *(c.post("/api/project/main/runs/apply", json=task_body(["sleep 0.3"])) for _ in range(6))
            )
            names = [a.json()["run_spec"]["run_name"] for a in applied]
            for name in names:
                await wait_for(_status_is(c, name, "done"), timeout=60)
        assert max(sampler.samples) <= 2


async def test_lowering_nodes_max_in_place_holds(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..3"))
        for i in range(3):
            await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name=f"busy{i}"))
        for i in range(3):
            await wait_for(_status_is(c, f"busy{i}", "running"))
        async with Sampler(s) as sampler:
            plan = (
                await c.post(
                    "/api/project/main/fleets/get_plan",
                    json={
                        "spec": {
                            "configuration": fleet_body(nodes="0..1")["plan"]["spec"]["configuration"],
                            "profile": {},
                        }
                    },
                )
            ).json()
            body = fleet_body(nodes="0..1")
            body["plan"]["current_resource"] = plan["current_resource"]
            assert (await c.post("/api/project/main/fleets/apply", json=body)).status_code == 200
            for i in range(3):
                await c.post("/api/project/main/runs/apply", json=task_body(["true"], name=f"waiting{i}"))
            await asyncio.sleep(1.0)
            for i in range(3):
                assert (await _run(c, f"waiting{i}"))["status"] == "submitted"
            await c.post("/api/project/main/runs/stop", json={"runs_names": ["busy0", "busy1", "busy2"]})
            for i in range(3):
                await wait_for(_status_is(c, f"waiting{i}", "done"), timeout=30)
        # The three existing instances were reused; no new one was ever reserved above the new max.
        assert max(sampler.samples) <= 3
        assert len(sampler.ids) == 3


async def test_fleet_deleted_while_jobs_wait_fails_them(tmp_path: Path) -> None:
    settings = replace(make_settings(tmp_path), local_max_instances=1)
    async with running_server(settings) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(name="busy-fleet"))
        await c.post("/api/project/main/fleets/apply", json=fleet_body(name="empty-fleet"))
        await c.post(
            "/api/project/main/runs/apply", json=task_body(["sleep 600"], name="holder", fleets=["busy-fleet"])
        )
        await wait_for(_status_is(c, "holder", "running"))
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="waiter", fleets=["empty-fleet"]))

        async def waiting() -> bool:
            got = await _run(c, "waiter")
            return bool(got["latest_job_submission"]["corral_waiting"])

        await wait_for(waiting)
        assert (await c.post("/api/project/main/fleets/delete", json={"names": ["empty-fleet"]})).status_code == 200
        await wait_for(_status_is(c, "waiter", "failed"))
        sub = (await _run(c, "waiter"))["latest_job_submission"]
        assert sub["termination_reason"] == "failed_to_start_due_to_no_capacity"
        assert sub["termination_reason_message"] == (
            "Failed to use specified fleets: no fleet named 'empty-fleet' in project 'main' (its fleets: busy-fleet)"
        )
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["holder"], "abort": True})


async def test_retry_rules(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="holder"))
        await wait_for(_status_is(c, "holder", "running"))
        cases: dict[str, tuple[dict[str, Any], str]] = {
            "no-retry-key": ({}, "submitted"),
            "retry-false": ({"retry": False}, "failed"),
            "retry-true": ({"retry": True}, "submitted"),
            "on-error-only": ({"retry": {"on_events": ["error"]}}, "failed"),
            "no-capacity-2s": ({"retry": {"on_events": ["no-capacity"], "duration": "2s"}}, "submitted"),
        }
        for name, (extra, _) in cases.items():
            await c.post("/api/project/main/runs/apply", json=task_body(["true"], name=name, **extra))
        submitted = time.monotonic()
        await Scheduling(s.ctx).pass_once()  # the pass that decides each one, run here before asserting
        for name, (_, expected) in cases.items():
            if expected == "failed":
                await wait_for(_status_is(c, name, "failed"))
                sub = (await _run(c, name))["latest_job_submission"]
                assert sub["termination_reason_message"].startswith("Fleet is at capacity: "), name
            else:
                assert (await _run(c, name))["status"] == "submitted", name
        # The bounded wait runs out (a safety-net pass notices; the test's interval is 60 s, so run one).
        await asyncio.sleep(max(0.0, submitted + 2.2 - time.monotonic()))
        await Scheduling(s.ctx).pass_once()
        await wait_for(_status_is(c, "no-capacity-2s", "failed"))
        msg = (await _run(c, "no-capacity-2s"))["latest_job_submission"]["termination_reason_message"]
        assert "retry duration" in msg
        await c.post("/api/project/main/runs/stop", json={"runs_names": [*cases, "holder"], "abort": True})


async def test_waiting_writes_nothing(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="holder"))
        await wait_for(_status_is(c, "holder", "running"))
        await c.post("/api/project/main/runs/apply", json=task_body(["true"], name="waiter"))

        async def waiting() -> bool:
            return bool((await _run(c, "waiter"))["latest_job_submission"]["corral_waiting"])

        await wait_for(waiting)

        async def snapshot() -> list[Any]:
            async with s.ctx.db.read() as conn:
                return [tuple(r) for r in (await conn.execute(sa.select(jobs).order_by(jobs.c.id))).all()]

        before = await snapshot()
        sched = Scheduling(s.ctx)
        for _ in range(5):
            result = await sched.pass_once()
            assert not result.changed
        assert await snapshot() == before
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["holder", "waiter"], "abort": True})
