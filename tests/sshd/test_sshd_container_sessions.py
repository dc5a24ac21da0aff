"""SSH sessions into a job that runs in a container (``image``), through the server's SSH endpoint in
dstack's ``dockerized`` layout, as the official CLI and OpenSSH reach it: the outer hop as the job's id,
the inner one through it at ``localhost:10022``. The session runs inside the container, as ``docker exec``
would: its files (not the host's), its user (a name from the image's ``/etc/passwd``), its environment,
working dir, PID namespace and cgroup; its exit status comes back; a forwarded port reaches the
container's own port; and a session into an image without ``sftp-server`` says so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from docker_harness import UBUNTU, DockerEngine
from server_harness import RunningServer, fleet_body, get_run, make_settings, running_server, wait_for

HTTP_PORT = 8089


@pytest.fixture
async def server(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path, docker_host=docker_engine.host)) as s:
        yield s


async def _connect(jpd: dict[str, Any], key: Any, user: str) -> tuple[Any, Any]:
    outer = await asyncssh.connect(
        jpd["hostname"], jpd["ssh_port"], username=jpd["username"], client_keys=[key], known_hosts=None
    )
    inner = await asyncssh.connect("localhost", 10022, tunnel=outer, username=user, client_keys=[key], known_hosts=None)
    return outer, inner


async def test_a_session_runs_inside_the_jobs_container(server: RunningServer) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    conf = {
        "type": "task",
        "name": "boxed",
        "image": UBUNTU,
        "user": "alice",
        "env": {"FROM_ENV": "env-value"},
        "commands": [
            "mkdir -p /tmp/www && echo served-from-the-container > /tmp/www/index.html",
            "echo only-in-the-container > /tmp/marker && pwd > /tmp/job_pwd",
            f"httpd -f -p {HTTP_PORT} -h /tmp/www",
        ],
        "resources": {"cpu": "1..", "memory": "0.1GB.."},
    }
    spec = {"configuration": conf, "ssh_key_pub": key.export_public_key().decode()}
    body = {"force": False, "plan": {"run_spec": spec}}
    async with server.client() as c:
        fleet = fleet_body(name="boxes", nodes={"min": 0, "max": 1})
        assert (await c.post("/api/project/main/fleets/apply", json=fleet)).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text

        async def running() -> dict[str, Any] | None:
            run = await get_run(c, "boxed")
            assert run["status"] not in ("failed", "done", "terminated"), run["latest_job_submission"]
            return run if run["status"] == "running" else None

        run = await wait_for(running, timeout=60)
        sub = run["latest_job_submission"]
        jpd, user = sub["job_provisioning_data"], sub["job_runtime_data"]["username"]
        outer, inner = await _connect(jpd, key, user)
        try:
            script = (
                'cat /tmp/marker; id -u; echo $FROM_ENV; test "$(pwd)" = "$(cat /tmp/job_pwd)" && echo same-dir;'
                " test -e /etc/debian_version || echo not-the-host; ls /proc | grep -c '^[0-9]'; exit 7"
            )
            got = await inner.run(script, check=False)
            lines = str(got.stdout).split()
            assert got.exit_status == 7, (got.stdout, got.stderr)
            assert lines[:5] == ["only-in-the-container", "1000", "env-value", "same-dir", "not-the-host"], lines
            assert int(lines[5]) < 20, "the session sees the container's processes, not the host's"
            # a forwarded connection reaches the container's own port
            reader, writer = await inner.open_connection("localhost", HTTP_PORT)
            writer.write(b"GET /index.html HTTP/1.0\r\n\r\n")
            reply = await reader.read()
            writer.close()
            assert b"served-from-the-container" in reply, reply
            # the busybox image has no sftp-server: the session says so
            sftp = await inner.create_process(subsystem="sftp", encoding=None)
            said = await sftp.stderr.read()
            await sftp.wait()
            assert sftp.exit_status == 255 and b"the job's image has no sftp-server" in said, said
        finally:
            inner.close()
            outer.close()
        r = await c.post("/api/project/main/runs/stop", json={"runs_names": ["boxed"], "abort": True})
        assert r.status_code == 200, r.text
