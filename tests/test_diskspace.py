"""The free-space setting and what corral recognises as "no space left"."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from corral.diskspace import is_disk_full
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
