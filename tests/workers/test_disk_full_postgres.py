"""A full disk under a real Postgres database: the test cluster's database lives in a tablespace on a small tmpfs
(its default tablespace; the WAL stays in the cluster's own directory, on the ordinary disk), filled to the last
byte with no injected errors. Every write answers 200 or 507, never 500; the 507 names the database and quotes
Postgres's ``53100 disk_full`` (not the state directory, which is not the full disk then); reads keep working; a
stop goes through or says why it cannot; and once space is freed, writes and the workers resume without a restart:
the runs accepted meanwhile and the same apply refused before are placed, run and recorded."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pg_harness import cluster
from server_harness import finished_run, fleet_body, get_run, make_settings, running_server, task_body, wait_for
from skip_policy import needs_root
from tmpfs_mount import MiB, fill, tmpfs

pytestmark = needs_root("mounting a tmpfs needs root (CI runs as root)")

#: The tablespace's disk: room for a new database (a copy of template1, about 8 MB) and a little more.
DISK = 24 * MiB
SMALL = {"cpu": "1..", "memory": "0.1GB..", "disk": "0.01GB.."}


async def _refused_at_last(c: Any, path: str, bodies: Iterator[dict[str, Any]]) -> tuple[Any, dict[str, Any], int]:
    """``bodies`` posted to ``path`` one after another until one does not fit (every answer before it is a 200):
    its answer, its body and how many fitted before it."""
    for fitted, body in enumerate(itertools.islice(bodies, 2000)):
        r = await c.post(path, json=body)
        if r.status_code != 200:
            return r, body, fitted
    raise AssertionError(f"2000 writes to {path} fitted on a full disk")


def _refused_naming_the_database(r: Any, database: str, state_dir: Path) -> str:
    assert r.status_code == 507, (r.status_code, r.text)
    msg = str(r.json()["detail"][0]["msg"])
    assert f"No space left in the database {database}:" in msg, msg
    assert "53100 disk_full" in msg and "No space left on device" in msg, msg
    assert str(state_dir) not in msg, "the state directory is not the full disk: " + msg
    return msg


async def test_a_full_postgres_disk_answers_507_serves_reads_and_heals_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pg = cluster()
    with tmpfs(pg.dir / f"space-{tmp_path.name}", DISK) as disk:  # where the server's user can reach it
        space = pg.create_tablespace(disk / "ts")  # a directory of the tmpfs: the filler stays out of Postgres's
        url = pg.create_database(tablespace=space)  # its default tablespace; the WAL stays in the cluster's dir
        database = f"{url.rsplit('/', 1)[1]} on 127.0.0.1:{pg.port}"
        try:
            # a state directory's reserve, which the database's full disk must leave alone (no room there helps)
            settings = make_settings(tmp_path, database_url=url, disk_reserve=MiB, min_free_disk=0)
            async with running_server(settings) as s, s.client() as c:
                state_dir = s.settings.server_dir
                assert (
                    await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))
                ).status_code == 200
                r = await c.post("/api/project/main/runs/apply", json=task_body(["echo before"], name="before"))
                assert r.status_code == 200, r.text
                assert (await finished_run(c, "before"))["status"] == "done"
                r = await c.post("/api/project/main/runs/apply", json=task_body(["sleep 600"], name="held"))
                assert r.status_code == 200, r.text
                await wait_for(lambda: _status_is(c, "held", "running"), timeout=60)

                filler = fill(disk)  # to the last byte
                users = ({"username": f"user-{i}", "global_role": "user"} for i in itertools.count())
                r, _, _ = await _refused_at_last(c, "/api/users/create", users)
                _refused_naming_the_database(r, database, state_dir)
                applies = (task_body(["echo during"], name=f"during-{i}") for i in itertools.count())
                r, refused, fitted = await _refused_at_last(c, "/api/project/main/runs/apply", applies)
                _refused_naming_the_database(r, database, state_dir)
                # reads keep working
                assert (await c.post("/api/project/main/runs/list", json={})).status_code == 200
                assert (await c.post("/api/project/main/runs/get", json={"run_name": "before"})).status_code == 200
                assert (await c.post("/api/users/list", json={})).status_code == 200
                # a stop goes through, or says why it cannot
                r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["held"], "abort": True})
                stopped = r.status_code == 200
                assert (state_dir / "disk-reserve").exists(), "the state directory's reserve is not the database's"
                if not stopped:
                    _refused_naming_the_database(r, database, state_dir)

                filler.unlink()  # space returns: writes and the workers resume, no restart
                if not stopped:
                    r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["held"], "abort": True})
                    assert r.status_code == 200, r.text
                assert (await finished_run(c, "held"))["status"] == "terminated"
                # the runs accepted while the disk was full run, woken by nothing but the workers' retries
                for i in range(fitted):
                    assert (await finished_run(c, f"during-{i}", timeout=30))["status"] == "done"
                r = await c.post("/api/users/create", json={"username": "after", "global_role": "user"})
                assert r.status_code == 200, r.text
                r = await c.post("/api/project/main/runs/apply", json=refused)  # the same apply, refused before
                assert r.status_code == 200, r.text
                assert (await finished_run(c, refused["plan"]["run_spec"]["configuration"]["name"]))["status"] == "done"
            # what the workers said of it names the database too, in one line each episode, without a traceback
            said = [r for r in caplog.records if "could not write" in r.getMessage()]
            for record in said:
                assert f"no space left in the database {database}:" in record.getMessage(), record.getMessage()
                assert str(state_dir) not in record.getMessage() and record.exc_info is None
        finally:
            name = url.rsplit("/", 1)[1]
            pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            pg.psql(f"DROP TABLESPACE IF EXISTS {space}")


async def _status_is(c: Any, name: str, status: str) -> bool:
    return str((await get_run(c, name))["status"]) == status
