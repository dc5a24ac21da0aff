"""A full disk under a real Postgres database: the test cluster's database lives in a tablespace on a small tmpfs
(no injected errors), filled to the last byte. Every write answers 200 or 507, never 500; the 507 quotes
Postgres's ``53100 disk_full``; reads keep working; and once space is freed, writes and the workers resume
without a restart: a new run is placed, run and recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pg_harness import cluster
from server_harness import finished_run, fleet_body, make_settings, running_server, task_body
from skip_policy import needs_root
from tmpfs_mount import MiB, fill, tmpfs

pytestmark = needs_root("mounting a tmpfs needs root (CI runs as root)")

#: The tablespace's disk: room for a new database (a copy of template1, about 8 MB) and a little more.
DISK = 24 * MiB
SMALL = {"cpu": "1..", "memory": "0.1GB..", "disk": "0.01GB.."}


async def _refused_at_last(c: Any) -> Any:
    """Users created one after another until one does not fit: every answer before it is a 200."""
    for i in range(2000):
        r = await c.post("/api/users/create", json={"username": f"user-{i}", "global_role": "user"})
        if r.status_code != 200:
            return r
    raise AssertionError("2000 users fitted on a full disk")


async def test_a_full_postgres_disk_answers_507_serves_reads_and_heals_without_a_restart(tmp_path: Path) -> None:
    pg = cluster()
    with tmpfs(pg.dir / f"space-{tmp_path.name}", DISK) as disk:  # where the server's user can reach it
        space = pg.create_tablespace(disk / "ts")  # a directory of the tmpfs: the filler stays out of Postgres's
        url = pg.create_database(tablespace=space)
        try:
            async with running_server(make_settings(tmp_path, database_url=url)) as s, s.client() as c:
                assert (
                    await c.post("/api/project/main/fleets/apply", json=fleet_body(resources=SMALL))
                ).status_code == 200
                r = await c.post("/api/project/main/runs/apply", json=task_body(["echo before"], name="before"))
                assert r.status_code == 200, r.text
                assert (await finished_run(c, "before"))["status"] == "done"

                filler = fill(disk)  # to the last byte
                r = await _refused_at_last(c)
                assert r.status_code == 507, (r.status_code, r.text)
                msg = str(r.json()["detail"][0]["msg"])
                assert "53100 disk_full" in msg and "No space left on device" in msg, msg
                assert str(s.settings.server_dir) not in msg, "the state directory is not the full disk: " + msg
                # reads keep working
                assert (await c.post("/api/project/main/runs/list", json={})).status_code == 200
                assert (await c.post("/api/project/main/runs/get", json={"run_name": "before"})).status_code == 200
                assert (await c.post("/api/users/list", json={})).status_code == 200

                filler.unlink()  # space returns: writes and the workers resume, no restart
                r = await c.post("/api/users/create", json={"username": "after", "global_role": "user"})
                assert r.status_code == 200, r.text
                r = await c.post("/api/project/main/runs/apply", json=task_body(["echo after"], name="after"))
                assert r.status_code == 200, r.text
                assert (await finished_run(c, "after"))["status"] == "done"
        finally:
            name = url.rsplit("/", 1)[1]
            pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            pg.psql(f"DROP TABLESPACE IF EXISTS {space}")
