"""A throwaway PostgreSQL cluster for ``vs_dstack.py --postgres``: ``initdb`` in a temporary directory,
``pg_ctl`` on a free loopback port, one database per server (dropped and created again for a cold start),
the cluster stopped and removed at the end. As root the cluster runs as the ``postgres`` user.

Durability settings are the same for both servers (``fsync=off``, as in the tests): the comparison is of
the servers, not of the disk.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchlib.servers import BenchError, free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    path = found[-1] if found else shutil.which(name)
    if path is None:
        raise BenchError(f"PostgreSQL's `{name}` is not installed (apt-get install postgresql)")
    return path


class Cluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="corral-bench-pg-"))
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        data = str(self.dir / "data")
        self._run(_bin("initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(_bin("pg_ctl"), "-D", data, "-l", str(self.dir / "log"), "-w", "-o", opts, "start")

    def _run(self, *argv: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *argv] if self._as_postgres else list(argv)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BenchError(f"{' '.join(argv)} failed: {out.stderr.strip()[-500:]}")

    def _sql(self, statement: str) -> None:
        self._run(_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-qc", statement)

    def fresh_database(self, name: str) -> str:
        """An empty database ``name`` (dropped first if it exists); its SQLAlchemy URL (asyncpg)."""
        self._sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self._sql(f"CREATE DATABASE {name}")
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run(_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
