"""Nothing usable in a copy of the database: every token, private key, agent token and credential a test
creates is looked for in the raw bytes of the SQLite file, its WAL and its shared memory (copied while
the server runs, as an attacker would), or in every table dumped as text on Postgres; rows an older
corral wrote in clear are sealed at the next start and keep working; the state directory and its files
are this OS user's alone."""

from __future__ import annotations

import base64
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from corral.server import prepare, private_state_dir
from corral.settings import Settings, SettingsError
from corral.store.encryption import SEALED_PREFIX, cipher_for
from corral.store.server_state import get_state
from corral.store.tables import instances, jobs, projects, runs, secrets, server_state, users
from corral.workers.seal_at_rest import seal_stored_secrets
from corral.workers.seal_run_specs import MARKER, seal_run_specs
from server_harness import (
    ADMIN_TOKEN,
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


def _fragments(secret: str) -> list[str]:
    """What of ``secret`` must not appear: a token whole; of a private key, each long line of its body
    (not the header line every OpenSSH key starts with)."""
    if "PRIVATE KEY" not in secret:
        return [secret]
    body = [line for line in secret.splitlines() if line and "-----" not in line]
    return [line for line in body[1:] if len(line) >= 40]


def _sqlite_path(settings: Settings) -> Path:
    return Path(settings.database_url.split("///", 1)[1])


def _copied_sqlite_bytes(settings: Settings, dest: Path) -> bytes:
    """The database file and its -wal and -shm, copied as they are on disk (the server still running)."""
    src = _sqlite_path(settings)
    dest.mkdir(exist_ok=True)
    data = b""
    for suffix in ("", "-wal", "-shm"):
        path = src.with_name(src.name + suffix)
        if path.exists():
            shutil.copyfile(path, dest / path.name)
            data += (dest / path.name).read_bytes()
    assert data, "no database file found"
    return data


async def _postgres_dump(server: RunningServer) -> bytes:
    """Every row of every table as text, read through SQL."""
    async with server.ctx.db.read() as conn:
        names = (
            await conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"))
        ).scalars()
        out = []
        for name in list(names):
            rows = await conn.execute(sa.text(f'SELECT t::text FROM "{name}" AS t'))
            out += [f"{name}: {r[0]}" for r in rows]
    assert any(line.startswith("users:") for line in out)
    return "\n".join(out).encode()


async def _at_rest(server: RunningServer, tmp: Path) -> bytes:
    if server.ctx.db.is_sqlite:
        return _copied_sqlite_bytes(server.settings, tmp / "copy")
    return await _postgres_dump(server)


def _assert_none_in(data: bytes, secrets: dict[str, str]) -> None:
    assert b"PRIVATE KEY" not in data
    for what, secret in secrets.items():
        fragments = _fragments(secret)
        assert fragments, what
        for f in fragments:
            assert f.encode() not in data, f"{what} found in clear in a copy of the database"


async def _local_instance_token(server: RunningServer) -> str:
    async with server.client() as c:
        r = await c.post(f"{P}/fleets/apply", json=fleet_body(name="fl", nodes="1"))
        assert r.status_code == 200, r.text

        async def idle() -> list[Any]:
            insts = (await c.post("/api/instances/list", json={})).json()
            return [i for i in insts if i["status"] == "idle"]

        (inst,) = await wait_for(idle, timeout=30)
    token = (server.settings.instances_dir / inst["id"] / "agent.token").read_text().strip()
    assert len(token) >= 32
    return str(token)


async def _run_with_registry_auth(server: RunningServer) -> str:
    """A run whose configuration has ``registry_auth``: its password is answered in clear, as dstack does,
    in ``runs/apply``, ``runs/get``, ``runs/list`` and ``runs/get_plan``, and applying the same
    configuration again is the same run (the comparison sees the password in clear)."""
    auth = {"username": "puller", "password": "registry-SECRET-5c4b3a"}
    body = task_body(["sleep 60"], name="private", registry_auth=auth)
    async with server.client() as c:
        applied = await c.post(f"{P}/runs/apply", json=body)
        assert applied.status_code == 200, applied.text
        for run in (applied.json(), await get_run(c, "private")):
            assert run["run_spec"]["configuration"]["registry_auth"] == auth
            assert run["jobs"][0]["job_spec"]["registry_auth"] == auth
        listed = (await c.post("/api/runs/list", json={})).json()
        assert [r["run_spec"]["configuration"]["registry_auth"] for r in listed] == [auth]
        plan = await c.post(f"{P}/runs/get_plan", json={"run_spec": body["plan"]["run_spec"]})
        assert plan.status_code == 200, plan.text
        assert plan.json()["current_resource"]["run_spec"]["configuration"]["registry_auth"] == auth
        again = await c.post(f"{P}/runs/apply", json=body)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == applied.json()["id"]
        r = await c.post(f"{P}/runs/stop", json={"runs_names": ["private"], "abort": True})
        assert r.status_code == 200, r.text
    for spec in await _stored(server, runs.c.run_spec):
        stored = orjson.loads(spec)["configuration"]["registry_auth"]
        assert stored["username"] == "puller" and stored["password"].startswith(SEALED_PREFIX)
    for spec in await _stored(server, jobs.c.job_spec):
        assert orjson.loads(spec)["registry_auth"]["password"].startswith(SEALED_PREFIX)
    return auth["password"]


async def _project_secret_used_by_a_run(server: RunningServer) -> dict[str, str]:
    """A project secret, and a registry password that is one, used by a run's ``env`` and ``registry_auth``:
    the job gets them, the run's specs keep the references."""
    values = {"project secret": "secret-VALUE-3e1f0a", "registry password secret": "registry-SECRET-77aa01"}
    async with server.client() as c:
        for name, value in (("tok", values["project secret"]), ("reg", values["registry password secret"])):
            r = await c.post(f"{P}/secrets/create_or_update", json={"name": name, "value": value})
            assert r.status_code == 200, r.text
        body = task_body(["echo $TOK | rev"], name="with-secrets", fleets=["fl"], env={"TOK": "${{ secrets.tok }}"})
        assert (await c.post(f"{P}/runs/apply", json=body)).status_code == 200
        assert (await finished_run(c, "with-secrets"))["status"] == "done"
        auth = {"username": "puller", "password": "${{ secrets.reg }}"}
        body = task_body(["true"], name="with-registry-secret", image="example.invalid/img", registry_auth=auth)
        assert (await c.post(f"{P}/runs/apply", json=body)).status_code == 200, "registry_auth references a secret"
        await c.post(f"{P}/runs/stop", json={"runs_names": ["with-registry-secret"], "abort": True})
    stored = await _stored(server, secrets.c.value)
    assert len(stored) == 2 and all(v.startswith(SEALED_PREFIX) for v in stored)
    return values


async def _stored(server: RunningServer, column: sa.Column[Any]) -> list[Any]:
    async with server.ctx.db.read() as conn:
        return list((await conn.execute(sa.select(column))).scalars())


async def test_a_copy_of_the_database_holds_no_token_key_or_credential_in_clear(
    server: RunningServer, tmp_path: Path
) -> None:
    secrets: dict[str, str] = {"admin token": ADMIN_TOKEN}
    async with server.client() as c:
        r = await c.post("/api/users/create", json={"username": "alice", "global_role": "user"})
        assert r.status_code == 200 and "creds" not in r.json(), r.text
        alice = (await c.post("/api/users/get_user", json={"username": "alice"})).json()
        assert alice["ssh_private_key"] and "PRIVATE KEY" in alice["ssh_private_key"], "ssh-keygen is needed"
        secrets["alice's first token"] = alice["creds"]["token"]
        secrets["alice's private key"] = alice["ssh_private_key"]
        admin = (await c.post("/api/users/get_my_user")).json()
        assert admin["creds"]["token"] == ADMIN_TOKEN and "PRIVATE KEY" in admin["ssh_private_key"]
        secrets["admin's private key"] = admin["ssh_private_key"]
        creds = {"clone_url": "https://git.example/t/p.git", "oauth_token": "oauth-SECRET-9f8e7d", "private_key": None}
        body = {"repo_id": "r", "repo_info": {"repo_type": "remote", "repo_name": "p"}, "repo_creds": creds}
        assert (await c.post(f"{P}/repos/init", json=body)).status_code == 200
        secrets["repo oauth token"] = str(creds["oauth_token"])
    async with server.client(token=alice["creds"]["token"]) as c:
        refreshed = (await c.post("/api/users/refresh_token", json={"username": "alice"})).json()
        new_token = refreshed["creds"]["token"]
        assert new_token != secrets["alice's first token"]
        secrets["alice's refreshed token"] = new_token
    async with server.client(token=new_token) as c:
        me = (await c.post("/api/users/get_my_user")).json()
        assert me["username"] == "alice" and me["creds"]["token"] == new_token  # returned to its owner, as dstack
        assert me["ssh_private_key"] == secrets["alice's private key"]
        r = await c.post("/api/projects/create", json={"project_name": "alices", "is_public": False})
        assert r.status_code == 200, r.text
        rekeyed = (await c.post("/api/users/refresh_ssh_key", json={"username": "alice"})).json()
        assert rekeyed["ssh_private_key"] != secrets["alice's private key"]
        secrets["alice's new private key"] = rekeyed["ssh_private_key"]
        assert (await c.post("/api/users/get_my_user")).json()["ssh_private_key"] == rekeyed["ssh_private_key"]
    secrets["agent token"] = await _local_instance_token(server)
    secrets["registry password"] = await _run_with_registry_auth(server)
    secrets.update(await _project_secret_used_by_a_run(server))
    # projects' generated keys are in no answer: read them back through the server's cipher
    stored_project_keys = [k for k in await _stored(server, projects.c.ssh_private_key) if k]
    assert stored_project_keys and all(k.startswith(SEALED_PREFIX) for k in stored_project_keys)
    for n, k in enumerate(stored_project_keys):
        secrets[f"project key {n}"] = server.ctx.reveal(k)
    assert all(t.startswith(SEALED_PREFIX) for t in await _stored(server, users.c.token))
    agents = [orjson.loads(a) for a in await _stored(server, instances.c.agent) if a]
    assert agents and all(a["token"].startswith(SEALED_PREFIX) for a in agents)

    _assert_none_in(await _at_rest(server, tmp_path), secrets)


# ---- rows written in clear by an older corral --------------------------------------------------------


async def _write_in_clear(server: RunningServer, secrets: dict[str, str]) -> None:
    """What an older corral stored: tokens, keys and agent tokens in clear (the token hash was always there)."""
    reveal = server.ctx.reveal
    async with server.ctx.db.write() as conn:
        for row in (await conn.execute(sa.select(users.c.id, users.c.token, users.c.ssh_private_key))).all():
            key = reveal(row.ssh_private_key) if row.ssh_private_key else None
            await conn.execute(
                sa.update(users).where(users.c.id == row.id).values(token=reveal(row.token), ssh_private_key=key)
            )
        for row in (await conn.execute(sa.select(projects.c.id, projects.c.ssh_private_key))).all():
            if row.ssh_private_key:
                key = reveal(row.ssh_private_key)
                secrets[f"project key {row.id}"] = key
                await conn.execute(sa.update(projects).where(projects.c.id == row.id).values(ssh_private_key=key))
        for row in (await conn.execute(sa.select(instances.c.id, instances.c.agent))).all():
            agent = orjson.loads(row.agent)
            agent["token"] = reveal(agent["token"])
            await conn.execute(
                sa.update(instances).where(instances.c.id == row.id).values(agent=orjson.dumps(agent).decode())
            )


async def test_rows_in_clear_from_before_keep_working_and_are_sealed_at_the_next_start(
    server: RunningServer, tmp_path: Path
) -> None:
    async with server.client() as c:
        await c.post("/api/users/create", json={"username": "bob", "global_role": "user"})
        bob = (await c.post("/api/users/get_user", json={"username": "bob"})).json()
    secrets = {"admin token": ADMIN_TOKEN, "bob's token": bob["creds"]["token"], "bob's key": bob["ssh_private_key"]}
    secrets["agent token"] = await _local_instance_token(server)
    await _write_in_clear(server, secrets)
    if server.ctx.db.is_sqlite:  # the old values are really in the files now
        assert secrets["bob's token"].encode() in _copied_sqlite_bytes(server.settings, tmp_path / "before")
    # Rows in clear work as they are, before any pass.
    async with server.client(token=bob["creds"]["token"]) as c:
        me = (await c.post("/api/users/get_my_user")).json()
        assert me["creds"]["token"] == bob["creds"]["token"] and me["ssh_private_key"] == bob["ssh_private_key"]

    # The next start seals them (here: the start-up pass, as the workers run it) ...
    assert await seal_stored_secrets(server.ctx) == 3  # admin, bob, the instance
    assert all(t.startswith(SEALED_PREFIX) for t in await _stored(server, users.c.token))
    assert all(k.startswith(SEALED_PREFIX) for k in await _stored(server, users.c.ssh_private_key) if k)
    assert all(k.startswith(SEALED_PREFIX) for k in await _stored(server, projects.c.ssh_private_key) if k)
    agents = [orjson.loads(a) for a in await _stored(server, instances.c.agent)]
    assert agents and all(a["token"].startswith(SEALED_PREFIX) for a in agents)
    _assert_none_in(await _at_rest(server, tmp_path), secrets)
    # ... and a start with nothing left in clear rewrites nothing.
    assert await seal_stored_secrets(server.ctx) == 0
    async with server.client(token=bob["creds"]["token"]) as c:
        me = (await c.post("/api/users/get_my_user")).json()
        assert me["creds"]["token"] == bob["creds"]["token"] and me["ssh_private_key"] == bob["ssh_private_key"]
    # The agent is still reached with its (now sealed) token: a job runs on the instance.
    async with server.client() as c:
        conf = {"type": "task", "commands": ["echo sealed-ok"], "fleets": ["fl"], "resources": {"cpu": "1.."}}
        body = {"force": False, "plan": {"run_spec": {"run_name": "after", "configuration": conf}}}
        assert (await c.post(f"{P}/runs/apply", json=body)).status_code == 200

        async def finished() -> dict[str, Any] | None:
            run = (await c.post(f"{P}/runs/get", json={"run_name": "after"})).json()
            return run if run["status"] in ("done", "failed", "terminated") else None

        run = await wait_for(finished, timeout=30)
        assert run["status"] == "done", run["latest_job_submission"]


async def _registry_passwords_in_clear(server: RunningServer) -> None:
    """What a corral from before registry passwords were sealed stored: every run's and job's in clear."""
    reveal = server.ctx.reveal
    async with server.ctx.db.write() as conn:
        for row in (await conn.execute(sa.select(runs.c.id, runs.c.run_spec))).all():
            spec = orjson.loads(row.run_spec)
            auth = spec["configuration"].get("registry_auth")
            if auth:
                auth["password"] = reveal(auth["password"])
                await conn.execute(
                    sa.update(runs).where(runs.c.id == row.id).values(run_spec=orjson.dumps(spec).decode())
                )
        for row in (await conn.execute(sa.select(jobs.c.id, jobs.c.job_spec))).all():
            spec = orjson.loads(row.job_spec)
            if spec.get("registry_auth"):
                spec["registry_auth"]["password"] = reveal(spec["registry_auth"]["password"])
                await conn.execute(
                    sa.update(jobs).where(jobs.c.id == row.id).values(job_spec=orjson.dumps(spec).decode())
                )


async def test_registry_passwords_in_clear_are_sealed_once_per_database(server: RunningServer, tmp_path: Path) -> None:
    async with server.ctx.db.read() as conn:
        assert await get_state(conn, MARKER) == "1"  # the start-up pass ran (nothing to seal on a new database)
    await _local_instance_token(server)  # a fleet for the run to wait on
    password = await _run_with_registry_auth(server)
    await _registry_passwords_in_clear(server)
    # Marked as done: later starts do not look again (the cost of the scan does not grow with every start) ...
    assert await seal_run_specs(server.ctx) is None
    assert all(password in spec for spec in await _stored(server, runs.c.run_spec))
    # ... and a database that has not had the pass gets it once: every row sealed, answers unchanged.
    async with server.ctx.db.write() as conn:
        await conn.execute(sa.delete(server_state).where(server_state.c.key == MARKER))
    assert await seal_stored_secrets(server.ctx) == 2  # the run's spec and its job's
    for spec in await _stored(server, runs.c.run_spec):
        assert orjson.loads(spec)["configuration"]["registry_auth"]["password"].startswith(SEALED_PREFIX)
    for spec in await _stored(server, jobs.c.job_spec):
        assert orjson.loads(spec)["registry_auth"]["password"].startswith(SEALED_PREFIX)
    async with server.ctx.db.read() as conn:
        assert await get_state(conn, MARKER) == "1"
    assert await seal_run_specs(server.ctx) is None
    async with server.client() as c:
        run = await get_run(c, "private")
        assert run["run_spec"]["configuration"]["registry_auth"]["password"] == password
    _assert_none_in(await _at_rest(server, tmp_path), {"registry password": password})


async def test_rows_in_clear_are_sealed_by_a_restarted_server(tmp_path: Path) -> None:
    """The whole start path on SQLite: a server restarted over rows in clear seals them before it serves."""
    settings = make_settings(tmp_path)
    async with running_server(settings) as s:
        async with s.client() as c:
            await c.post("/api/users/create", json={"username": "carol", "global_role": "user"})
            carol = (await c.post("/api/users/get_user", json={"username": "carol"})).json()
        secrets = {"carol's token": carol["creds"]["token"], "carol's key": carol["ssh_private_key"]}
        await _write_in_clear(s, secrets)
    assert carol["creds"]["token"].encode() in _sqlite_path(settings).read_bytes()
    async with running_server(settings) as s:
        _assert_none_in(_copied_sqlite_bytes(settings, tmp_path / "copy"), secrets)
        async with s.client(token=carol["creds"]["token"]) as c:
            assert (await c.post("/api/users/get_my_user")).json()["creds"]["token"] == carol["creds"]["token"]


# ---- files and the key ----------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The umask most installs have (files 0644, directories 0755 unless corral says otherwise)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("usual_umask")
async def test_the_state_directory_is_private_and_the_key_may_live_outside_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with running_server(settings) as s, s.client() as c:
        assert (await c.post("/api/users/get_my_user")).status_code == 200
        db = _sqlite_path(settings)
        assert _mode(settings.server_dir) == 0o700 and _mode(settings.data_dir) == 0o700
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), settings.encryption_key_file):
            assert path.exists() and _mode(path) == 0o600, path
    # An install an older corral made with looser modes is tightened at the next start.
    for path in (settings.server_dir, settings.data_dir):
        path.chmod(0o755)
    for path in (db, settings.encryption_key_file):
        path.chmod(0o644)
    prepared = await prepare(settings)
    await prepared.ctx.db.dispose()
    assert _mode(settings.server_dir) == 0o700 and _mode(settings.data_dir) == 0o700
    assert _mode(db) == 0o600 and _mode(settings.encryption_key_file) == 0o600

    # The key file may be elsewhere (made there on first use, 0600); the state dir then holds none.
    elsewhere = tmp_path / "keys" / "corral.key"
    other = Settings.from_env(
        {"CORRAL_SERVER_DIR": str(tmp_path / "other"), "CORRAL_SERVER_ENCRYPTION_KEY_FILE": str(elsewhere)}
    )
    assert other.encryption_key_file == elsewhere
    prepared = await prepare(replace(other, admin_token="t", background_processing=False))
    await prepared.ctx.db.dispose()
    assert _mode(elsewhere) == 0o600 and not (tmp_path / "other" / "data" / "encryption.key").exists()
    assert cipher_for(other).key_id == cipher_for(replace(settings, encryption_key_path=elsewhere)).key_id
    # ... or be given itself.
    key = base64.b64encode(os.urandom(32)).decode()
    given = Settings.from_env({"CORRAL_SERVER_DIR": str(tmp_path / "third"), "CORRAL_SERVER_ENCRYPTION_KEY": key})
    prepared = await prepare(replace(given, admin_token="t", background_processing=False))
    await prepared.ctx.db.dispose()
    assert not given.encryption_key_file.exists()


@pytest.mark.usefixtures("usual_umask")
def test_private_state_dir_makes_the_directories_0700(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "fresh")
    private_state_dir(settings)
    assert _mode(settings.server_dir) == 0o700 and _mode(settings.data_dir) == 0o700


def test_an_admin_token_too_long_to_store_sealed_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="CORRAL_SERVER_ADMIN_TOKEN is 150 characters long; at most 100"):
        Settings.from_env({"CORRAL_SERVER_ADMIN_TOKEN": "x" * 150})
    assert Settings.from_env({"CORRAL_SERVER_ADMIN_TOKEN": "x" * 100}).admin_token == "x" * 100
