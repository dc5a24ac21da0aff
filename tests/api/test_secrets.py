"""Projects' secrets: dstack's routes and answers, who may manage them (with and without the server's
``allow_managers_manage_secrets``), ``${{ secrets.NAME }}`` seen by a running job while the API and a copy
of the database hold only the reference, masked in stored logs, refused at apply when missing, and a job
whose secret is deleted while it waits ended by the server as dstack ends it."""

from __future__ import annotations

import asyncio
import base64
import shutil
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from corral.store.tables import secrets
from corral.workers.scheduling import Scheduling
from server_harness import (
    RunningServer,
    finished_run,
    fleet_body,
    get_run,
    make_settings,
    running_server,
    task_body,
    wait_for,
)

P = "/api/project/main"
VALUE = "hf_Zq81-secret-VALUE-7d2e"


async def test_round_trip_with_dstacks_answers(server: RunningServer) -> None:
    async with server.client() as c:
        created = await c.post(f"{P}/secrets/create_or_update", json={"name": "hf-token", "value": VALUE})
        assert created.status_code == 200, created.text
        assert created.json()["name"] == "hf-token" and created.json()["value"] == VALUE
        await c.post(f"{P}/secrets/create_or_update", json={"name": "second", "value": "x"})
        listed = (await c.post(f"{P}/secrets/list")).json()
        assert [(s["name"], s["value"]) for s in listed] == [("second", None), ("hf-token", None)]  # newest first
        got = (await c.post(f"{P}/secrets/get", json={"name": "hf-token"})).json()
        assert got == {"id": created.json()["id"], "name": "hf-token", "value": VALUE}
        # an update keeps the secret (its id); concurrent ones leave one row
        results = await asyncio.gather(
            *(c.post(f"{P}/secrets/create_or_update", json={"name": "hf-token", "value": f"v{n}"}) for n in range(5))
        )
        assert {r.status_code for r in results} == {200} and {r.json()["id"] for r in results} == {got["id"]}
        async with server.ctx.db.read() as conn:
            rows = (await conn.execute(sa.select(secrets.c.name, secrets.c.value))).all()
        assert sorted(r.name for r in rows) == ["hf-token", "second"]
        assert all(r.value.startswith("enc:v1:") for r in rows)
        # dstack's refusals
        r = await c.post(f"{P}/secrets/create_or_update", json={"name": "bad name", "value": "x"})
        assert r.status_code == 400 and r.json()["detail"][0]["msg"] == (
            "Secret name should match regex '^[A-Za-z0-9-_]{1,200}$"
        )
        r = await c.post(f"{P}/secrets/create_or_update", json={"name": "big", "value": "x" * 5001})
        assert r.status_code == 400 and r.json()["detail"][0]["msg"] == "Secret value length must not exceed 5000"
        r = await c.post(f"{P}/secrets/create_or_update", json={"name": "x"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "value"]
        r = await c.post(f"{P}/secrets/get", json={"name": "nope"})
        assert r.status_code == 400 and r.json()["detail"][0]["code"] == "resource_not_exists"
        r = await c.post(f"{P}/secrets/delete", json={"secrets_names": ["second", "nope", "gone"]})
        assert r.status_code == 400 and r.json()["detail"][0]["msg"] == "Secrets not found: gone, nope"
        assert len((await c.post(f"{P}/secrets/list")).json()) == 2  # all or nothing
        r = await c.post(f"{P}/secrets/delete", json={"secrets_names": ["second"]})
        assert r.status_code == 200 and r.json() is None
        assert [s["name"] for s in (await c.post(f"{P}/secrets/list")).json()] == ["hf-token"]
        # a deleted project's secrets go with it
        await c.post("/api/projects/create", json={"project_name": "brief"})
        await c.post("/api/project/brief/secrets/create_or_update", json={"name": "k", "value": "v"})
        assert (await c.post("/api/projects/delete", json={"projects_names": ["brief"]})).status_code == 200
        async with server.ctx.db.read() as conn:
            assert sorted((await conn.execute(sa.select(secrets.c.name))).scalars()) == ["hf-token"]


async def _user(admin: httpx.AsyncClient, name: str, role: str | None) -> str:
    await admin.post("/api/users/create", json={"username": name, "global_role": "user"})
    token = (await admin.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"]
    if role:
        r = await admin.post(
            "/api/projects/main/add_members", json={"members": [{"username": name, "project_role": role}]}
        )
        assert r.status_code == 200, r.text
    return str(token)


async def _answers(s: RunningServer, tokens: dict[str, str]) -> dict[str, int]:
    out = {}
    for who, token in tokens.items():
        async with s.client(token) as c:
            out[who] = (await c.post(f"{P}/secrets/create_or_update", json={"name": who, "value": "v"})).status_code
    return out


async def _can_manage(c: httpx.AsyncClient) -> dict[str, bool]:
    project = (await c.post("/api/projects/main/get")).json()
    return {m["user"]["username"]: m["permissions"]["can_manage_secrets"] for m in project["members"]}


async def test_who_may_manage_secrets_follows_the_servers_config(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with running_server(settings) as s, s.client() as admin:
        tokens = {
            "padmin": await _user(admin, "padmin", "admin"),
            "mgr": await _user(admin, "mgr", "manager"),
            "dev": await _user(admin, "dev", "user"),
            "stranger": await _user(admin, "stranger", None),
        }
        assert await _answers(s, tokens) == {"padmin": 200, "mgr": 403, "dev": 403, "stranger": 403}
        async with s.client(tokens["mgr"]) as mgr:
            r = await mgr.post(f"{P}/secrets/list")
            assert (r.status_code, r.json()) == (403, {"msg": "Access denied", "code": None})  # the service's check
        async with s.client(tokens["dev"]) as dev:
            r = await dev.post(f"{P}/secrets/list")
            assert (r.status_code, r.json()) == (403, {"detail": {"msg": "Access denied", "code": None}})  # the route's
        assert await _can_manage(admin) == {"admin": True, "padmin": True, "mgr": False, "dev": False}
    (settings.server_dir / "config.yml").write_text("default_permissions:\n  allow_managers_manage_secrets: true\n")
    async with running_server(settings) as s, s.client() as admin:
        assert await _answers(s, tokens) == {"padmin": 200, "mgr": 200, "dev": 403, "stranger": 403}
        assert await _can_manage(admin) == {"admin": True, "padmin": True, "mgr": True, "dev": False}


def _logs(entries: list[dict[str, Any]]) -> str:
    return "".join(base64.b64decode(e["message"]).decode() for e in entries)


def _db_bytes(s: RunningServer, dest: Path) -> bytes:
    src = Path(s.settings.database_url.split("///", 1)[1])
    data = b""
    for suffix in ("", "-wal", "-shm"):
        path = src.with_name(src.name + suffix)
        if path.exists():
            shutil.copyfile(path, dest / path.name)
            data += (dest / path.name).read_bytes()
    return data


async def test_a_job_gets_its_secrets_and_nothing_stores_them(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with running_server(settings) as s, s.client() as c:
        assert (await c.post(f"{P}/fleets/apply", json=fleet_body(nodes="0..1"))).status_code == 200
        await c.post(f"{P}/secrets/create_or_update", json={"name": "hf", "value": VALUE})
        await c.post(f"{P}/secrets/create_or_update", json={"name": "pw", "value": "pull-pass-1234"})
        env = {"HF": "Bearer ${{ secrets.hf }}", "PLAIN": "$${{ not.a.ref }}"}
        script = (
            'echo "$HF" | rev; echo "got: $HF"; echo "plain: $PLAIN"; '
            # the value split across the agent's entries: half of it, a pause (a partial line is flushed), the rest
            'printf "split: %s" "${HF:0:14}"; sleep 1.2; printf "%s\\n" "${HF:14}"; '
            'printf "%s" "$HF" >&2; '
            # output that ends with what could be the start of a secret: held back, stored when the job ends
            'printf "end: hf_Zq"'
        )
        body = task_body([script], name="uses-secrets", env=env)
        r = await c.post(f"{P}/runs/apply", json=body)
        assert r.status_code == 200, r.text
        run = await finished_run(c, "uses-secrets")
        assert run["status"] == "done", run["latest_job_submission"]
        # the stored spec and every answer keep the reference
        for answer in (r.json(), run, (await c.post("/api/runs/list", json={})).json()[0]):
            assert answer["run_spec"]["configuration"]["env"]["HF"] == "Bearer ${{ secrets.hf }}"
            assert answer["jobs"][0]["job_spec"]["env"]["HF"] == "Bearer ${{ secrets.hf }}"
        poll = {"run_name": "uses-secrets", "job_submission_id": run["latest_job_submission"]["id"], "limit": 1000}
        entries = (await c.post(f"{P}/logs/poll", json=poll)).json()["logs"]
        text = _logs(entries)
        assert ("Bearer " + VALUE)[::-1] in text  # the job saw the value ...
        stdout = _logs([e for e in entries if e["log_source"] == "stdout"])  # stderr may come between the halves
        assert "got: Bearer ******\n" in stdout and "split: Bearer ******\n" in stdout  # ... its output did not keep it
        assert "plain: ${{ not.a.ref }}" in text  # $$ escapes a reference, as in dstack
        assert VALUE not in text and VALUE[:12] not in text
        assert stdout.endswith("\nend: hf_Zq")
        (tmp_path / "copy").mkdir()
        data = _db_bytes(s, tmp_path / "copy")
        assert b"${{ secrets.hf }}" in data
        assert VALUE.encode() not in data and VALUE[::-1].encode() in data  # only the job's own rewrite of it


async def test_references_are_checked_at_apply_and_a_deleted_secret_ends_the_waiting_job(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        await c.post(f"{P}/secrets/create_or_update", json={"name": "tok", "value": "tok-value-9"})
        for env, auth, message in (
            (
                {"A": "${{ secrets.missing }}"},
                None,
                "`env.A`: Failed to interpolate due to missing vars: ['secrets.missing']",
            ),
            ({"A": "${{ secrets.my-tok }}"}, None, "`env.A`: Illegal reference name: secrets.my-tok"),
            ({"A": "${{ env.B }}", "B": "b"}, None, "`env.A`: Failed to interpolate due to missing vars: ['env.B']"),
            ({"A": "${{ run.args }}"}, None, "`env.A`: Failed to interpolate due to missing vars: ['run.args']"),
            (
                {},
                {"username": "u", "password": "${{ secrets.nope }}"},
                "`registry_auth.password`: Failed to interpolate",
            ),
        ):
            conf: dict[str, Any] = (
                {"env": env, "image": "x"} if auth is None else {"env": env, "registry_auth": auth, "image": "x"}
            )
            body = task_body(["true"], name="refused", **conf)
            for path, payload in (("runs/get_plan", {"run_spec": body["plan"]["run_spec"]}), ("runs/apply", body)):
                r = await c.post(f"{P}/{path}", json=payload)
                assert r.status_code == 400, (path, r.text)
                assert r.json()["detail"][0]["msg"].startswith(message), r.json()
        assert (await c.post("/api/runs/list", json={})).json() == []  # nothing written
        # A job waits for the only instance; its secret is deleted meanwhile: the server ends it, as dstack does.
        assert (await c.post(f"{P}/fleets/apply", json=fleet_body(nodes="0..1"))).status_code == 200
        assert (await c.post(f"{P}/runs/apply", json=task_body(["sleep 60"], name="holder"))).status_code == 200
        await wait_for(lambda: _status(c, "holder", "running"), timeout=30)
        waiting = task_body(["echo never"], name="waiting", env={"T": "${{ secrets.tok }}"})
        assert (await c.post(f"{P}/runs/apply", json=waiting)).status_code == 200
        await Scheduling(s.ctx).pass_once()  # a scheduling pass, run here: the job waits for the instance
        assert (await get_run(c, "waiting"))["status"] == "submitted"
        assert (await c.post(f"{P}/secrets/delete", json={"secrets_names": ["tok"]})).status_code == 200
        await c.post(f"{P}/runs/stop", json={"runs_names": ["holder"], "abort": True})
        run = await finished_run(c, "waiting")
        sub = run["latest_job_submission"]
        assert (run["status"], sub["status"], sub["termination_reason"]) == (
            "terminated",
            "terminated",
            "terminated_by_server",
        )
        assert sub["termination_reason_message"] == (
            "Secrets interpolation error: Failed to interpolate due to missing vars: ['secrets.tok']"
        )


async def _status(c: httpx.AsyncClient, name: str, status: str) -> bool:
    return bool((await get_run(c, name))["status"] == status)
