"""``corral server backup`` and ``corral server restore``, end to end through the command line, and where the
encryption key lives: a backup taken while the server writes opens every sealed value on a fresh machine
that has the key, and is refused (saying which key id it needs) on one that has not."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.settings import Settings
from server_harness import make_settings, running_server, task_body

SECRET = "hf_not-a-real-token-0123456789"


def _cli(server_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    full.update({"CORRAL_SERVER_DIR": str(server_dir), "COLUMNS": "200", **env})
    command = [sys.executable, "-m", "corral.cli.main", "server", *args]
    return subprocess.run(command, env=full, capture_output=True, text=True, timeout=120)


async def _seed_and_back_up(settings: Settings, backup: Path) -> str:
    """A server with a project secret, backed up while a writer keeps applying runs; its key id."""
    async with running_server(settings) as s, s.client() as c:
        r = await c.post("/api/project/main/secrets/create_or_update", json={"name": "hf", "value": SECRET})
        assert r.status_code == 200, r.text

        async def writer() -> None:
            for i in range(30):
                r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], name=f"w{i}"))
                assert r.status_code == 200, r.text

        writing = asyncio.create_task(writer())
        done = await asyncio.to_thread(_cli, settings.server_dir, "backup", str(backup))
        await writing
    assert done.returncode == 0, done.stderr
    assert "The backup holds no encryption key" in done.stdout, done.stdout
    key_id = done.stdout.split("need the key with id ")[1].split(",")[0]
    assert len(key_id) == 8 and str(settings.encryption_key_file) in done.stdout
    return key_id


def _fresh(tmp: Path, name: str) -> Settings:
    return make_settings(tmp / name)


async def _secret_after_restore(settings: Settings, runs: int = 0) -> str:
    """The project secret, read back through the API of a server started on ``settings``' state."""
    async with running_server(settings) as s, s.client() as c:
        r = await c.post("/api/project/main/secrets/get", json={"name": "hf"})
        assert r.status_code == 200, r.text
        listed = await c.post("/api/runs/list", json={"limit": 100})
        assert listed.status_code == 200 and len(listed.json()) >= runs, listed.text
        return str(r.json()["value"])


async def test_a_backup_taken_while_writing_restores_on_a_fresh_machine_with_the_key(tmp_path: Path) -> None:
    old = _fresh(tmp_path, "old")
    backup = tmp_path / "corral.backup"
    key_id = await _seed_and_back_up(old, backup)
    assert old.encryption_key_file == old.server_dir / "encryption.key"  # not in data/
    assert sqlite3.connect(backup).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    key = old.encryption_key_file.read_text().strip()
    assert key.encode() not in backup.read_bytes()

    # a fresh machine without the key: refused, naming the key id; nothing written
    new = _fresh(tmp_path, "new")
    r = _cli(new.server_dir, "restore", str(backup))
    assert r.returncode == 1 and f"sealed with the key id {key_id}" in r.stderr and "Traceback" not in r.stderr
    assert not (new.server_dir / "data" / "corral.db").exists() and not new.encryption_key_file.exists()
    # another key: refused, naming both ids
    other = base64.b64encode(b"\x01" * 32).decode()
    r = _cli(new.server_dir, "restore", str(backup), CORRAL_SERVER_ENCRYPTION_KEY=other)
    assert r.returncode == 1 and key_id in r.stderr and "has the id" in r.stderr, r.stderr
    assert not (new.server_dir / "data" / "corral.db").exists()
    # with the key: restored, every sealed value opened, and the server reads the secret back
    new.server_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(old.encryption_key_file, new.server_dir / "encryption.key")
    r = _cli(new.server_dir, "restore", str(backup))
    assert r.returncode == 0, r.stderr
    assert "Opened all" in r.stdout and "sealed values" in r.stdout
    assert await _secret_after_restore(new, runs=1) == SECRET
    # never over an existing database
    r = _cli(new.server_dir, "restore", str(backup))
    assert r.returncode == 1 and "already exists" in r.stderr


async def test_a_restore_across_one_schema_migration(tmp_path: Path) -> None:
    from alembic import command

    from corral.store.migrate import alembic_config, head_revisions, known_revisions

    old = _fresh(tmp_path, "old")
    backup = tmp_path / "corral.backup"
    await _seed_and_back_up(old, backup)
    (head,) = head_revisions()
    previous = known_revisions()[head]
    assert previous is not None
    engine = sa.create_engine(f"sqlite:///{backup}")
    with engine.begin() as conn:  # the backup as the corral before the last migration wrote it
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, previous)
    engine.dispose()
    assert sqlite3.connect(backup).execute("SELECT version_num FROM alembic_version").fetchone() == (previous,)

    new = _fresh(tmp_path, "new")
    new.server_dir.mkdir(parents=True)
    shutil.copy(old.encryption_key_file, new.server_dir / "encryption.key")
    r = _cli(new.server_dir, "restore", str(backup))
    assert r.returncode == 0 and "the server migrates it when it starts" in r.stdout, (r.stdout, r.stderr)
    assert await _secret_after_restore(new) == SECRET
    db = new.server_dir / "data" / "corral.db"
    assert sqlite3.connect(db).execute("SELECT version_num FROM alembic_version").fetchone() == (head,)


def test_a_backup_from_a_newer_corral_or_not_a_backup_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database" * 100)
    r = _cli(tmp_path / "s", "restore", str(junk))
    assert r.returncode == 1 and "is not a corral backup" in r.stderr
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.execute("INSERT INTO alembic_version VALUES ('9999_from_the_future')")
    r = _cli(tmp_path / "s", "restore", str(newer))
    assert r.returncode == 1 and "made by a newer corral" in r.stderr
    r = _cli(tmp_path / "s", "backup", str(tmp_path / "b"), CORRAL_DATABASE_URL="postgresql+asyncpg://u@127.0.0.1/x")
    assert r.returncode == 1 and "pg_dump" in r.stderr and "Traceback" not in r.stderr


async def test_a_key_an_older_corral_kept_in_data_keeps_working_and_the_server_says_how_to_move_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _fresh(tmp_path, "s")
    legacy = settings.server_dir / "data" / "encryption.key"
    # the layout an older corral made: the key beside the database
    async with running_server(replace(settings, encryption_key_path=legacy)) as s, s.client() as c:
        r = await c.post("/api/project/main/secrets/create_or_update", json={"name": "hf", "value": SECRET})
        assert r.status_code == 200
    assert legacy.exists() and not (settings.server_dir / "encryption.key").exists()
    assert settings.encryption_key_file == legacy
    caplog.set_level("INFO", logger="corral.server")
    assert await _secret_after_restore(settings) == SECRET
    moved = settings.server_dir / "encryption.key"
    warning = [r.getMessage() for r in caplog.records if "in the data directory" in r.getMessage()]
    assert warning and f"mv {legacy} {moved}" in warning[0], caplog.text
    # moved as the warning says: the same key, found where it now is, and no warning
    legacy.rename(moved)
    caplog.clear()
    assert settings.encryption_key_file == moved
    assert await _secret_after_restore(settings) == SECRET
    assert not [r for r in caplog.records if "in the data directory" in r.getMessage()]
    assert any(f"Encryption key: {moved}" in r.getMessage() for r in caplog.records)
