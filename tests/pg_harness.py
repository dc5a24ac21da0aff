"""A throwaway PostgreSQL cluster for the test session: `initdb` into a temp dir, `pg_ctl` on a free
loopback port, a fresh database per test, and the cluster stopped and removed when the session ends.

As root (CI, the dev machines) the server runs as the `postgres` user via `runuser`. A test that needs
Postgres and cannot get it fails: there is no skip.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

_cluster: PgCluster | None = None


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"PostgreSQL's `{name}` is not installed (apt-get install postgresql)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="corral-pg-"))
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir, 0o755)
        self._run(
            [
                _bin("initdb"),
                "-D",
                str(self.dir / "data"),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ]
        )
        opts = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._run(
            [_bin("pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w", "-o", opts, "start"]
        )

    def _run(self, argv: list[str]) -> None:
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}")

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the superuser; its output."""
        argv = [_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database, "-qAtc", sql]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout

    def create_database(self, tablespace: str | None = None) -> str:
        """A fresh database (in ``tablespace`` when given); returns its SQLAlchemy URL (asyncpg)."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE DATABASE {name}" + (f" TABLESPACE {tablespace}" if tablespace else ""))
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{name}"

    def create_tablespace(self, path: Path) -> str:
        """A tablespace at ``path`` (made empty, given to the server's user); returns its name."""
        path.mkdir()
        if self._as_postgres:
            shutil.chown(path, "postgres", "postgres")
        name = f"ts_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE TABLESPACE {name} LOCATION '{path}'")
        return name

    def stop(self) -> None:
        try:
            self._run([_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def cluster() -> PgCluster:
    """The session's cluster, started on first use."""
    global _cluster
    if _cluster is None:
        _cluster = PgCluster()
        atexit.register(_cluster.stop)
    return _cluster


def new_database_url() -> str:
    return cluster().create_database()
