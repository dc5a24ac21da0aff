"""Events: a scripted session (a fleet, a run that runs and is stopped, a run that cannot fit, a member
change) records exactly the expected events in order; filters and keyset pages walk them without
duplicates; readers see only their projects' events; a rolled-back change leaves none; dstack's 422s."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from corral.domain.events import job_target, user_target
from corral.store import events as event_store
from corral.store import runs as run_store
from corral.store.tables import events
from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, task_body, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path_factory.mktemp("events"))) as s:
        yield s


async def _all(c: Any, **body: Any) -> list[dict[str, Any]]:
    """Every event the filters select, oldest first, walked in pages of 3 (ascending keyset paging)."""
    out: list[dict[str, Any]] = []
    prev: dict[str, Any] = {}
    while True:
        r = await c.post("/api/events/list", json={**body, **prev, "limit": 3, "ascending": True})
        assert r.status_code == 200, r.text
        page = r.json()
        out += page
        if len(page) < 3:
            return out
        prev = {"prev_recorded_at": page[-1]["recorded_at"], "prev_id": page[-1]["id"]}


def _lines(found: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(e["actor_user"] or "-", *(f"{t['type']} {t['name']}" for t in e["targets"]), e["message"]) for e in found]


async def _project_id(c: Any) -> str:
    return str((await c.post("/api/projects/main/get")).json()["project_id"])


async def test_a_scripted_session_records_exactly_its_events_in_order(server: RunningServer) -> None:
    async with server.client() as c:
        main = await _project_id(c)
        since = (await c.post("/api/events/list", json={"limit": 1})).json()[0]
        fleet = await c.post("/api/project/main/fleets/apply", json=fleet_body(name="evf", nodes=1))
        assert fleet.status_code == 200, fleet.text

        async def idle() -> bool:
            got = (await c.post("/api/project/main/fleets/get", json={"name": "evf"})).json()
            return [i["status"] for i in got["instances"]] == ["idle"]

        await wait_for(idle, timeout=60)
        r = await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="ev-run", fleets=["evf"]))
        assert r.status_code == 200, r.text

        async def running() -> bool:
            got = await get_run(c, "ev-run")
            return bool(got["status"] == "running" and got["jobs"][0]["job_submissions"][-1]["status"] == "running")

        await wait_for(running, timeout=60)
        big = task_body(["true"], name="ev-big", fleets=["evf"], retry=False, resources={"cpu": "512.."})
        assert (await c.post("/api/project/main/runs/apply", json=big)).status_code == 200
        assert (await c.post("/api/project/main/runs/stop", json={"runs_names": ["ev-run"], "abort": False})).is_success
        for name in ("ev-run", "ev-big"):
            await wait_for(lambda n=name: _finished(c, n), timeout=60)
        user = await c.post("/api/users/create", json={"username": "ev-user", "global_role": "user"})
        assert user.status_code == 200, user.text
        added = await c.post(
            "/api/projects/main/add_members", json={"members": [{"username": "ev-user", "project_role": "user"}]}
        )
        assert added.is_success, added.text
        await wait_for(lambda: _quiet(c, main), timeout=20)
        found = await _all(c, within_projects=[main], prev_recorded_at=since["recorded_at"], prev_id=since["id"])
        seen = {e["id"] for e in found}  # the member event is in both: it targets the project and the user
        found += [e for e in await _all(c, target_users=[user.json()["id"]]) if e["id"] not in seen]
    found.sort(key=lambda e: e["recorded_at"])
    got = _lines(found)
    # the runs worker derives the run's status as it finds its job: placed (PROVISIONING on the way) or already
    # running; those events interleave with the job's and are checked apart
    to_running = [e for e in got if e[1] == "run ev-run" and e[2].startswith("Run status changed SUBMITTED")]
    to_running += [e for e in got if e[1] == "run ev-run" and e[2] == "Run status changed PROVISIONING -> RUNNING"]
    assert [e[2] for e in to_running] in (
        ["Run status changed SUBMITTED -> PROVISIONING", "Run status changed PROVISIONING -> RUNNING"],
        ["Run status changed SUBMITTED -> RUNNING"],
    ), got
    got = [e for e in got if e not in to_running]
    expected = [
        ("admin", "fleet evf", "Fleet created. Status: ACTIVE"),
        ("-", "instance evf-0", "Instance created to meet target fleet node count. Status: PENDING"),
        ("-", "instance evf-0", "Instance status changed PENDING -> IDLE"),
        ("admin", "run ev-run", "Run submitted. Status: SUBMITTED"),
        ("-", "job ev-run-0-0", "Job created on run submission. Status: SUBMITTED"),
        ("-", "job ev-run-0-0", "Job status changed SUBMITTED -> PROVISIONING"),
        ("-", "instance evf-0", "Instance status changed IDLE -> BUSY"),
        ("-", "job ev-run-0-0", "instance evf-0", "Job assigned to instance. Instance blocks: 1/1 busy"),
        ("-", "job ev-run-0-0", "Job status changed PROVISIONING -> RUNNING"),
        ("admin", "run ev-big", "Run submitted. Status: SUBMITTED"),
        ("-", "job ev-big-0-0", "Job created on run submission. Status: SUBMITTED"),
    ]
    assert got[: len(expected)] == expected, got
    rest = got[len(expected) :]
    # the stop and the run that cannot fit proceed side by side: each entity's events in its own order
    stop = [
        ("admin", "run ev-run", "Run status changed RUNNING -> TERMINATING. Termination reason: STOPPED_BY_USER"),
        (
            "-",
            "job ev-run-0-0",
            "Job status changed RUNNING -> TERMINATED. Termination reason: TERMINATED_BY_USER (stopped by request)",
        ),
        ("-", "instance evf-0", "Instance status changed BUSY -> IDLE"),
        ("-", "run ev-run", "Run status changed TERMINATING -> TERMINATED"),
    ]
    no_fit = [e for e in rest if "ev-big" in e[1]]
    assert [e for e in rest if e not in no_fit][: len(stop)] == stop, rest
    assert no_fit[0][:2] == ("-", "job ev-big-0-0") and no_fit[0][2].startswith(
        "Job status changed SUBMITTED -> FAILED. Termination reason: FAILED_TO_START_DUE_TO_NO_CAPACITY ("
    ), no_fit
    assert [e[2] for e in no_fit[1:]] == ["Run status changed SUBMITTED -> FAILED. Termination reason: JOB_FAILED"]
    assert rest[len(stop) + len(no_fit) :] == [
        ("admin", "user ev-user", "User created"),
        ("admin", "project main", "user ev-user", "Project member added. Role: USER"),
    ], rest
    # the wire shape: dstack's Event
    e = found[0]
    assert set(e) == {"id", "message", "recorded_at", "actor_user_id", "actor_user", "is_actor_user_deleted", "targets"}
    assert e["targets"][0] == {
        "type": "fleet",
        "project_id": main,
        "project_name": "main",
        "is_project_deleted": False,
        "id": fleet.json()["id"],
        "name": "evf",
    }


async def _finished(c: Any, name: str) -> bool:
    return (await get_run(c, name))["status"] in ("terminated", "failed", "done")


async def _quiet(c: Any, main: str) -> bool:
    """The session's last events are in (the stopped run's instance idle again, the run ended)."""
    msgs = [e["message"] for e in (await c.post("/api/events/list", json={"within_projects": [main]})).json()]
    return "Run status changed TERMINATING -> TERMINATED" in msgs and "Instance status changed BUSY -> IDLE" in msgs


async def test_filters_and_pages_walk_the_events_without_duplicates(server: RunningServer) -> None:
    async with server.client() as c:
        main = await _project_id(c)
        for i in range(3):
            r = await c.post("/api/users/create", json={"username": f"pager-{i}", "global_role": "user"})
            assert r.status_code == 200
        everything = await _all(c)
        ids = [e["id"] for e in everything]
        assert len(ids) == len(set(ids)) >= 3
        # descending pages are the same events, newest first
        down: list[dict[str, Any]] = []
        prev: dict[str, Any] = {}
        while True:
            page = (await c.post("/api/events/list", json={**prev, "limit": 4})).json()
            down += page
            if len(page) < 4:
                break
            prev = {"prev_recorded_at": page[-1]["recorded_at"], "prev_id": page[-1]["id"]}
        assert [e["id"] for e in down] == ids[::-1]
        run = await get_run(c, "ev-run")
        job_id = run["jobs"][0]["job_submissions"][-1]["id"]
        within_run = await _all(c, within_runs=[run["id"]])
        assert {t["type"] for e in within_run for t in e["targets"]} >= {"run", "job"}
        assert all(any(t["id"] in (run["id"], job_id) for t in e["targets"]) for e in within_run)
        only_jobs = await _all(c, within_runs=[run["id"]], include_target_types=["job"])
        assert only_jobs and all(any(t["type"] == "job" for t in e["targets"]) for e in only_jobs)
        assert [e["id"] for e in await _all(c, target_jobs=[job_id])] == [e["id"] for e in only_jobs]
        target_run = await _all(c, target_runs=[run["id"]])
        assert target_run and all(any(t["type"] == "run" for t in e["targets"]) for e in target_run)
        system = await _all(c, within_projects=[main], actors=[None])
        assert system and all(e["actor_user_id"] is None for e in system)
        admin_id = (await c.post("/api/users/get_my_user")).json()["id"]
        by_admin = await _all(c, actors=[admin_id])
        assert by_admin and all(e["actor_user"] == "admin" for e in by_admin)
        fleet_id = (await c.post("/api/project/main/fleets/get", json={"name": "evf"})).json()["id"]
        in_fleet = await _all(c, within_fleets=[fleet_id])
        assert {t["type"] for e in in_fleet for t in e["targets"]} >= {"fleet", "instance"}


async def test_readers_see_their_projects_events_and_their_own_only(server: RunningServer) -> None:
    async with server.client() as c:
        main = await _project_id(c)
        made = await c.post("/api/users/create", json={"username": "outsider", "global_role": "user"})
        outsider = made.json()
        token = (await c.post("/api/users/get_user", json={"username": "outsider"})).json()["creds"]["token"]
        member = (await c.post("/api/users/get_user", json={"username": "ev-user"})).json()["creds"]["token"]
        everything = await _all(c)
    async with server.client(token=token) as c:
        seen = await _all(c)
        assert [e["message"] for e in seen] == ["User created"]
        assert seen[0]["targets"][0]["id"] == outsider["id"]
        assert await _all(c, within_projects=[main]) == []
    async with server.client(token=member) as c:
        seen = await _all(c)
        assert seen and all(any(t["project_id"] == main or t["name"] == "ev-user" for t in e["targets"]) for e in seen)
        assert not any(t["name"] == "outsider" for e in seen for t in e["targets"])
        assert len(seen) < len(everything)


async def test_a_rolled_back_change_leaves_no_event(server: RunningServer) -> None:
    db = server.ctx.db
    async with db.read() as conn:
        before = (await conn.execute(sa.select(sa.func.count()).select_from(events))).scalar_one()
        job = (await run_store.list_jobs(conn, ("terminated",)))[0]
    with pytest.raises(RuntimeError):
        async with db.write() as conn:
            # (a finished job's status never changes: ``domain/statuses.py``)
            assert await run_store.update_job(conn, job.id, {"termination_reason_message": "rewritten"})
            await event_store.emit(
                conn, "Job updated", None, [job_target(job.project_id, job.id, job.job_name, job.run_id)]
            )
            await event_store.emit(conn, "User updated", None, [user_target(str(uuid.uuid4()), "ghost")])
            raise RuntimeError("the change fails after its events were written")
    async with db.read() as conn:
        after = (await conn.execute(sa.select(sa.func.count()).select_from(events))).scalar_one()
        got = await run_store.get_job(conn, job.id)
        assert got is not None and got.termination_reason_message != "rewritten"
    assert after == before


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"target_runs": [str(uuid.uuid4())], "target_jobs": [str(uuid.uuid4())]}, None, "At most one target_*"),
        ({"within_runs": [str(uuid.uuid4())], "within_fleets": [str(uuid.uuid4())]}, None, "At most one within_*"),
        ({"target_runs": []}, "target_runs", "at least 1"),
        ({"within_projects": [str(uuid.uuid4()) for _ in range(17)]}, "within_projects", "at most 16"),
        ({"include_target_types": ["repo"]}, "include_target_types", "'gateway-replica'"),
        ({"prev_recorded_at": "yesterday"}, "prev_recorded_at", "datetime"),
        ({"limit": 101}, "limit", "less than or equal to 100"),
        ({"target_runs": ["not-a-uuid"]}, "target_runs", "UUID"),
    ],
)
async def test_bad_filters_are_422s_naming_the_field(
    server: RunningServer, body: dict[str, Any], field: str | None, fragment: str
) -> None:
    async with server.client() as c:
        r = await c.post("/api/events/list", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(fragment in d["msg"] for d in detail), detail
    if field is not None:
        assert any(field in d["loc"] for d in detail), detail


async def test_expired_events_are_deleted_and_a_ttl_of_zero_stores_none(tmp_path: Path) -> None:
    off = make_settings(tmp_path, events_ttl=0.0, background_processing=False)
    async with running_server(off) as s, s.client() as c:
        assert (await c.post("/api/users/create", json={"username": "nobody", "global_role": "user"})).is_success
        assert (await c.post("/api/events/list", json={})).json() == []
    async with running_server(make_settings(tmp_path / "b", background_processing=False)) as s:
        async with s.client() as c:
            assert (await c.post("/api/users/create", json={"username": "old", "global_role": "user"})).is_success
            assert len((await c.post("/api/events/list", json={})).json()) == 3  # admin, main, old
        async with s.ctx.db.write() as conn:
            assert await event_store.delete_expired(conn, time.time() + 1, batch=2) == 2
        async with s.client() as c:
            assert [e["message"] for e in (await c.post("/api/events/list", json={})).json()] == ["User created"]


async def test_secret_events_only_when_the_value_changed(server: RunningServer) -> None:
    async with server.client() as c:
        url = "/api/project/main/secrets"
        created = await c.post(f"{url}/create_or_update", json={"name": "ev_token", "value": "one"})
        assert created.status_code == 200, created.text
        secret_id = created.json()["id"]
        for value in ("one", "two", "two"):  # the same value again is no change
            assert (await c.post(f"{url}/create_or_update", json={"name": "ev_token", "value": value})).is_success
        assert (await c.post(f"{url}/delete", json={"secrets_names": ["ev_token"]})).is_success
        found = await _all(c, target_secrets=[secret_id])
    assert [(e["actor_user"], e["message"]) for e in found] == [
        ("admin", "Secret created"),
        ("admin", "Secret updated"),
        ("admin", "Secret deleted"),
    ]
    assert found[0]["targets"][0]["type"] == "secret" and found[0]["targets"][0]["name"] == "ev_token"
    assert "one" not in str(found) and "two" not in str(found)
