"""SSH fleets' private keys at rest: sealed in every database row (fleet specs, host connections), opened
only to log in, shown in no API answer or CLI output; rows written in clear before still work and are
sealed at the next start. The database is read raw, with SQLAlchemy, as an attacker with a copy would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import asyncssh
import orjson
import pytest
import sqlalchemy as sa
from ssh_harness import (
    SSH_SETTINGS,
    apply_fleet,
    by_host,
    corral_cli,
    fleet_settled,
    plan_fleet,
    run_logs,
    run_status,
    ssh_fleet,
    ssh_key,
    submit,
)

from corral.backends import ssh_bootstrap
from corral.backends.ssh_conn import HostLink, SshError, SshTarget
from corral.backends.ssh_secrets import SEALED_PREFIX, KeyOpener, KeyUnreadable, is_sealed
from corral.domain.ssh_keys import connection_private_keys, map_connection_keys, map_spec_keys, spec_private_keys
from corral.settings import Settings
from corral.store.encryption import Cipher, cipher_for
from fakehosts import FakeHosts
from server_harness import RunningServer, make_settings, running_server, wait_for


def _new_key() -> dict[str, str]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return {"public": key.export_public_key().decode().strip(), "private": key.export_private_key().decode()}


def _fragments(private: str) -> list[str]:
    """Lines of a private key that only it has (not the format's header every OpenSSH key starts with,
    not the short padding line): any of them in a row or an answer is a leak."""
    body = [line for line in private.splitlines() if line and "-----" not in line]
    return [line for line in body[1:] if len(line) >= 40]


def _rows(settings: Settings) -> dict[str, str]:
    """Every table's rows as text, read straight from the database file."""
    engine = sa.create_engine(settings.database_url.replace("sqlite+aiosqlite", "sqlite"))
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            return {
                t.name: "\n".join(" ".join(str(v) for v in row) for row in conn.execute(sa.select(t)))
                for t in meta.sorted_tables
            }
    finally:
        engine.dispose()


def _assert_sealed_at_rest(settings: Settings, keys: list[str]) -> None:
    rows = _rows(settings)
    for table in ("fleets", "instances"):
        assert "PRIVATE KEY" not in rows[table], table
    for table, text in rows.items():
        for key in keys:
            assert not any(f in text for f in _fragments(key)), f"a private key in clear in table {table}"
    engine = sa.create_engine(settings.database_url.replace("sqlite+aiosqlite", "sqlite"))
    try:
        with engine.connect() as conn:
            specs = [orjson.loads(r[0]) for r in conn.execute(sa.text("SELECT spec FROM fleets"))]
            agents = [orjson.loads(r[0]) for r in conn.execute(sa.text("SELECT agent FROM instances"))]
    finally:
        engine.dispose()
    stored = [k for s in specs for k in spec_private_keys(s)]
    stored += [k for a in agents for k in connection_private_keys(a.get("connection") or {})]
    assert stored and all(k.startswith(SEALED_PREFIX) for k in stored), stored


def _assert_shows_no_key(text: str, keys: list[str], where: str) -> None:
    assert all(_fragments(key) for key in keys)
    assert "PRIVATE KEY" not in text, where
    for key in keys:
        assert not any(f in text for f in _fragments(key)), where


# ---- the opener ----------------------------------------------------------------------------------


def test_sealed_keys_are_the_ciphers_values_and_open_only_with_its_key() -> None:
    key = _new_key()["private"]
    mine, other = Cipher(os.urandom(32)), Cipher(os.urandom(32))
    sealed = mine.encrypt(key)
    assert is_sealed(sealed) and sealed.startswith(SEALED_PREFIX) and not is_sealed(key)
    assert KeyOpener(lambda: mine)(sealed) == key
    assert KeyOpener(lambda: mine)(key) == key  # a row from before: in clear, used as it is
    assert KeyOpener()(key) == key
    with pytest.raises(KeyUnreadable, match=r"another server key.*CORRAL_SERVER_ENCRYPTION_KEY"):
        KeyOpener(lambda: other)(sealed)
    with pytest.raises(KeyUnreadable, match="no key to open it"):
        KeyOpener()(sealed)


async def test_a_key_this_server_cannot_open_is_a_permanent_error_naming_the_host() -> None:
    sealed = Cipher(os.urandom(32)).encrypt(_new_key()["private"])
    other = Cipher(os.urandom(32))
    link = HostLink(
        SshTarget("192.0.2.1", 22, "root", sealed), 1.0, ssh_bootstrap.read_agent_port, KeyOpener(lambda: other)
    )
    try:
        with pytest.raises(SshError) as e:
            await link.connection()  # fails before any packet is sent
        assert e.value.permanent and "root@192.0.2.1:22" in str(e.value) and "another server key" in str(e.value)
    finally:
        await link.close()


# ---- the API, without workers --------------------------------------------------------------------


async def test_every_key_of_a_spec_is_sealed_in_its_rows_and_shown_nowhere(tmp_path: Path) -> None:
    """Keys at all four places (``ssh_config``, its proxy jump, a host, the host's proxy jump)."""
    keys = {name: _new_key() for name in ("global", "jump", "host", "host-jump")}
    jump = {"hostname": "10.0.0.9", "user": "root", "identity_file": "~/.ssh/j", "ssh_key": keys["jump"]}
    host_jump = {"hostname": "10.0.0.8", "user": "root", "identity_file": "~/.ssh/hj", "ssh_key": keys["host-jump"]}
    ssh: dict[str, Any] = {
        "user": "root",
        "identity_file": "~/.ssh/g",
        "ssh_key": keys["global"],
        "proxy_jump": jump,
        "hosts": ["10.0.0.1", {"hostname": "10.0.0.2", "ssh_key": keys["host"], "proxy_jump": host_jump}],
    }
    conf: dict[str, Any] = {"type": "fleet", "name": "keys", "ssh_config": ssh}
    privates = [k["private"] for k in keys.values()]
    settings = make_settings(tmp_path, background_processing=False)
    async with running_server(settings) as s, s.client() as c:
        plan = await plan_fleet(c, conf)
        assert plan["spec"]["configuration"]["ssh_config"]["ssh_key"] == keys["global"]  # the request, echoed
        _assert_shows_no_key(str({k: v for k, v in plan.items() if k != "spec"}), privates, "fleets/get_plan")
        fleet = await apply_fleet(c, conf)
        _assert_shows_no_key(str(fleet), privates, "fleets/apply")
        _assert_sealed_at_rest(settings, privates)

        # Applying the same configuration again is no change (sealed keys compare as the same keys).
        plan = await plan_fleet(c, conf)
        assert plan["action"] == "update", plan
        again = await apply_fleet(c, conf)
        assert [i["id"] for i in again["instances"]] == [i["id"] for i in fleet["instances"]]
        for path, payload in (
            ("/api/project/main/fleets/get", {"name": "keys"}),
            ("/api/project/main/fleets/list", {}),
            ("/api/instances/list", {}),
        ):
            _assert_shows_no_key((await c.post(path, json=payload)).text, privates, path)
        _assert_shows_no_key(str({k: v for k, v in plan.items() if k != "spec"}), privates, "fleets/get_plan")
        # Another key for the host is a change that cannot be made in place, as in dstack.
        ssh["hosts"][1]["ssh_key"] = _new_key()
        assert (await plan_fleet(c, conf))["action"] == "create"


# ---- with hosts ----------------------------------------------------------------------------------


async def test_bootstrapped_hosts_log_in_with_sealed_keys_and_no_answer_shows_one(
    server: RunningServer, hosts: FakeHosts, tmp_path: Path
) -> None:
    """A plain host and one behind a proxy jump (its own key and the jump's): provisioned, running work."""
    key = hosts.key.read_text()
    jump = {"hostname": hosts.ip("gpu"), "user": "root", "identity_file": str(hosts.key), "ssh_key": ssh_key(hosts)}
    hidden = {
        "hostname": hosts.ip("hidden"),
        "identity_file": str(hosts.key),
        "ssh_key": ssh_key(hosts),
        "proxy_jump": jump,
    }
    conf = ssh_fleet(hosts, "sealed", [hosts.ip("cpu1"), hidden])
    async with server.client() as c:
        await apply_fleet(c, conf)
        fleet = await wait_for(lambda: fleet_settled(c, "sealed", 2), timeout=30)
        assert {i["status"] for i in fleet["instances"]} == {"idle"}, fleet
        await submit(c, "behind", ["hostname"], instances=[{"hostname": hosts.ip("hidden")}])
        run = await run_status(c, "behind", "done", "failed")
        assert (await run_logs(c, run)).strip() == "hidden", run["latest_job_submission"]
        _assert_sealed_at_rest(server.settings, [key])  # after the instances worker wrote what it found

        plan = await plan_fleet(c, conf)
        assert plan["action"] == "update"
        _assert_shows_no_key(str({k: v for k, v in plan.items() if k != "spec"}), [key], "fleets/get_plan")
        for path, payload in (
            ("/api/project/main/fleets/get", {"name": "sealed"}),
            ("/api/project/main/fleets/list", {}),
            ("/api/instances/list", {}),
            ("/api/runs/list", {}),
        ):
            _assert_shows_no_key((await c.post(path, json=payload)).text, [key], path)
        for args in (("fleet",), ("fleet", "--verbose")):
            code, out = await corral_cli(server, tmp_path, *args)
            assert code == 0 and "sealed" in out, out
            _assert_shows_no_key(out, [key], f"corral {' '.join(args)}")


def _write_in_clear(settings: Settings) -> None:
    """Rewrite the rows as a server from before keys were sealed wrote them."""
    cipher = cipher_for(settings)
    engine = sa.create_engine(settings.database_url.replace("sqlite+aiosqlite", "sqlite"))
    try:
        with engine.begin() as conn:
            for row_id, spec in conn.execute(sa.text("SELECT id, spec FROM fleets")).all():
                plain = map_spec_keys(orjson.loads(spec), cipher.decrypt)
                conn.execute(
                    sa.text("UPDATE fleets SET spec = :s WHERE id = :i"),
                    {"s": orjson.dumps(plain).decode(), "i": row_id},
                )
            for row_id, agent in conn.execute(sa.text("SELECT id, agent FROM instances")).all():
                data = orjson.loads(agent)
                data["connection"] = map_connection_keys(data["connection"], cipher.decrypt)
                conn.execute(
                    sa.text("UPDATE instances SET agent = :a WHERE id = :i"),
                    {"a": orjson.dumps(data).decode(), "i": row_id},
                )
    finally:
        engine.dispose()


async def test_rows_written_in_clear_before_still_work_and_are_sealed_at_the_next_start(
    hosts: FakeHosts, tmp_path: Path
) -> None:
    key = hosts.key.read_text()
    settings = make_settings(tmp_path, **SSH_SETTINGS)
    async with running_server(settings) as s, s.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "old", [hosts.ip("cpu2")]))
        await wait_for(lambda: fleet_settled(c, "old", 1), timeout=30)
    _write_in_clear(settings)
    rows = _rows(settings)
    assert all(_fragments(key)[0] in rows[t] for t in ("fleets", "instances"))
    # The agent on the host outlives the server; the new server must log in with the key to reach it.
    async with running_server(settings) as s, s.client() as c:
        _assert_sealed_at_rest(settings, [key])  # sealed at start-up, before any worker ran
        await submit(c, "after", ["hostname"])
        run = await run_status(c, "after", "done", "failed", timeout=30)
        assert (await run_logs(c, run)).strip() == "cpu2", run["latest_job_submission"]
        inst = by_host(await wait_for(lambda: fleet_settled(c, "old", 1)))[hosts.ip("cpu2")]
        assert inst["status"] == "idle" and not inst["unreachable"]
        await c.post("/api/project/main/fleets/delete", json={"names": ["old"]})

        async def gone() -> bool:
            return not (await c.post("/api/project/main/fleets/list", json={})).json()

        await wait_for(gone, timeout=30)
