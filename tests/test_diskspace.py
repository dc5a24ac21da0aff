"""The free-space setting and what corral recognises as "no space left"."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
from pathlib import Path

import pytest

from corral.diskspace import database_label, is_disk_full, refusal_for, space, where_full
from corral.diskspace.episode import Episode, retry_delay
from corral.settings import Settings, SettingsError


def test_the_watermark_setting_is_read_in_mib_and_a_bad_value_names_the_variable() -> None:
    assert Settings.from_env({}).min_free_disk == 128 * 2**20
    assert Settings.from_env({"CORRAL_MIN_FREE_DISK_MB": "8"}).min_free_disk == 8 * 2**20
    assert Settings.from_env({"CORRAL_MIN_FREE_DISK_MB": "0"}).min_free_disk == 0
    with pytest.raises(
        SettingsError, match="CORRAL_MIN_FREE_DISK_MB='8GB' must be a whole number of MiB \\(0: none\\)"
    ):
        Settings.from_env({"CORRAL_MIN_FREE_DISK_MB": "8GB"})
    assert Settings.from_env({}).disk_reserve == 4 * 2**20
    assert Settings.from_env({"CORRAL_DISK_RESERVE_MB": "0"}).disk_reserve == 0
    assert Settings.from_env({}).job_log_limit == 50 * 2**20
    assert Settings.from_env({"CORRAL_JOB_LOG_LIMIT_MB": "1"}).job_log_limit == 2**20


class _AsyncpgLike(Exception):
    """An error carrying a SQLSTATE, as asyncpg's do."""

    sqlstate = "53100"  # disk_full: https://www.postgresql.org/docs/current/errcodes-appendix.html


class _Wrapped(Exception):
    """A driver error wrapped as SQLAlchemy wraps it (``orig``)."""

    def __init__(self, orig: BaseException) -> None:
        super().__init__("wrapped")
        self.orig = orig


def test_a_full_disk_is_told_apart_from_other_errors_through_any_wrapping() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(_Wrapped(sqlite3.OperationalError("database or disk is full")))
    assert is_disk_full(_Wrapped(_AsyncpgLike("could not extend file")))
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as e:
            raise RuntimeError("while storing") from e
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(_Wrapped(sqlite3.OperationalError("database is locked")))
    cyclic = ValueError("a")
    cyclic.__context__ = ValueError("b")
    cyclic.__context__.__context__ = cyclic
    assert not is_disk_full(cyclic)


def test_a_retry_waits_half_a_second_doubling_up_to_five() -> None:
    assert [retry_delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_postgres_database_is_named_without_its_password_and_sqlite_is_not() -> None:
    assert database_label("postgresql+asyncpg://corral:s3cret@db.internal:5433/corral") == "corral on db.internal:5433"
    assert database_label("postgresql+asyncpg://corral@db.internal/corral") == "corral on db.internal"
    assert database_label("sqlite+aiosqlite:////var/lib/corral/data/corral.db") is None


def test_a_full_postgres_disk_is_said_naming_the_database_not_the_state_directory(tmp_path: Path) -> None:
    full = _Wrapped(_AsyncpgLike('could not extend file "base/16384/16420": No space left on device'))
    where = where_full(tmp_path, full, "corral on db.internal:5433")
    assert where.startswith("no space left in the database corral on db.internal:5433: Postgres answered 53100")
    assert str(tmp_path) not in where
    refused = refusal_for(tmp_path, full, "corral on db.internal:5433")
    assert "database corral on db.internal:5433" in refused and "No space left on device" in refused
    assert str(tmp_path) not in refused
    sqlite_full = _Wrapped(sqlite3.OperationalError("database or disk is full"))
    assert where_full(tmp_path, sqlite_full).startswith(f"no space left in the state directory {tmp_path}: ")
    assert str(tmp_path) in refusal_for(tmp_path, sqlite_full)


async def test_an_episode_is_said_once_and_ends_at_the_first_write_that_goes_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.workers")
    full = OSError(errno.ENOSPC, "No space left on device")
    episode = Episode()
    assert [episode.failed("the runs pass", full, tmp_path, None) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert episode.failed("the jobs pass", full, tmp_path, None) == 0.5
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("the runs pass could not write, no space left in the state"), said
    assert not episode.succeeded("the scheduler pass"), "it had not failed: nothing returned"
    waiting = asyncio.create_task(episode.back_off(60))
    await asyncio.sleep(0)
    assert episode.succeeded("the runs pass") and not episode.open
    await asyncio.wait_for(waiting, timeout=5)  # what waited to try again tries now
    assert "space returned: the runs pass went through after 3 failed tries" in caplog.records[-1].getMessage()
    episode.failed("the runs pass", full, tmp_path, None)
    assert len([r for r in caplog.records if "could not write" in r.getMessage()]) == 2, "a new episode is said"
    episode.forget("the runs pass")
    assert not episode.open


def test_the_space_of_a_path_not_made_yet_is_its_nearest_existing_parents(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    for path in (tmp_path, tmp_path / "not" / "yet", tmp_path / "a-file" / "below"):
        s = space(path)
        assert s.path == path and 0 < s.free <= s.total
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert space(tmp_path / "loop" / "x").total == space(tmp_path).total
