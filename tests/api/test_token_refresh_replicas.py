"""Replicas on one Postgres: ``users/refresh_token`` on one invalidates the old token on every other within
1 s (each with its access cache warm with the old token); a replica given another encryption key than
the one the database's values are sealed with does not start."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest

from corral.config.server_config import ServerConfigError
from corral.server import prepare
from pg_harness import new_database_url
from server_harness import make_settings, running_server


async def test_refresh_token_invalidates_the_old_token_on_every_replica_within_a_second(tmp_path: Path) -> None:
    url, key = new_database_url(), base64.b64encode(os.urandom(32)).decode()
    first = make_settings(tmp_path / "a", database_url=url, encryption_key=key)
    second = make_settings(tmp_path / "b", database_url=url, encryption_key=key)
    async with running_server(first) as a, running_server(second) as b:
        async with a.client() as c:
            created = await c.post("/api/users/create", json={"username": "dana", "global_role": "user"})
            assert created.status_code == 200, created.text
            old = (await c.post("/api/users/get_user", json={"username": "dana"})).json()["creds"]["token"]
        async with a.client(token=old) as on_a, b.client(token=old) as on_b:
            # Both replicas have just authenticated the old token (their caches hold it).
            assert (await on_a.post("/api/users/get_my_user")).status_code == 200
            assert (await on_b.post("/api/users/get_my_user")).status_code == 200
            refreshed = await on_a.post("/api/users/refresh_token", json={"username": "dana"})
            assert refreshed.status_code == 200, refreshed.text
            done = time.monotonic()
            new = refreshed.json()["creds"]["token"]
            assert new != old
            while (await on_b.post("/api/users/get_my_user")).status_code == 200:
                assert time.monotonic() - done < 1.0, "the old token still works on the other replica after 1 s"
            took = time.monotonic() - done
            assert took < 0.5, f"{took:.2f} s: the other replica waited for its cache to expire, not for the NOTIFY"
            assert (await on_b.post("/api/users/get_my_user")).status_code == 403
            assert (await on_a.post("/api/users/get_my_user")).status_code == 403
        print(f"old token refused by the other replica {took * 1000:.0f} ms after refresh_token")
        async with b.client(token=new) as c:
            me = (await c.post("/api/users/get_my_user")).json()
            assert me["username"] == "dana" and me["creds"]["token"] == new


async def test_a_replica_given_another_encryption_key_does_not_start(tmp_path: Path) -> None:
    """It could open no agent's token, private key or credential the others sealed: a clear start-up error."""
    url = new_database_url()
    first = make_settings(tmp_path / "a", database_url=url, background_processing=False)
    async with running_server(first):
        pass
    other = make_settings(tmp_path / "b", database_url=url, encryption_key=base64.b64encode(os.urandom(32)).decode())
    with pytest.raises(ServerConfigError, match=r"encrypted with another key .* give every server of this database"):
        await prepare(other)
