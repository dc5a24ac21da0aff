"""Sandboxed host-process jobs through the server (local backend, agents as root): the ports a job
listens on in ``job_runtime_data.ports``, a multi-node task whose nodes learn each other's sandbox
addresses from ``DSTACK_NODES_IPS``/``DSTACK_MASTER_NODE_IP`` and meet there, and the local backend
without a sandbox admitting only global admins' runs."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx

from server_harness import (
    RunningServer,
    finished_run,
    fleet_body,
    get_run,
    make_settings,
    running_server,
    task_body,
    wait_for,
)
from skip_policy import needs_root

pytestmark = needs_root("the sandbox needs root (CI runs as root)")


async def _logs(c: httpx.AsyncClient, run_name: str, submission_id: str) -> str:
    r = await c.post(
        "/api/project/main/logs/poll",
        json={"run_name": run_name, "job_submission_id": submission_id, "limit": 1000},
    )
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


async def test_ports_of_a_sandboxed_job_and_its_status(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, sandbox="on")) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
        body = task_body(["echo hello > index.html", "exec python3 -m http.server 8000"], name="web", ports=[8000])
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def ports() -> dict[str, Any] | None:
            sub = (await get_run(c, "web"))["latest_job_submission"]
            data = sub.get("job_runtime_data") or {}
            return data if sub["status"] == "running" and data.get("ports") else None

        data = await wait_for(ports, timeout=30)
        assert data["network_mode"] == "bridge" and set(data["ports"]) == {"8000"}, data
        host_port = data["ports"]["8000"]
        assert host_port != 8000

        async def served() -> str | None:
            try:
                async with httpx.AsyncClient() as h:
                    return (await h.get(f"http://127.0.0.1:{host_port}/index.html")).text
            except httpx.HTTPError:
                return None

        assert await wait_for(served, timeout=20) == "hello\n"
        assert (await get_run(c, "web"))["latest_job_submission"]["status_message"] == "running"
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["web"], "abort": True})
        await finished_run(c, "web")


async def test_multi_node_nodes_meet_at_their_sandbox_addresses(tmp_path: Path) -> None:
    script = (
        'echo "ips=$(echo $DSTACK_NODES_IPS | tr "\\n" " ") master=$DSTACK_MASTER_NODE_IP '
        'own=$(ip -4 -o addr show eth0 | awk "{print \\$4}" | cut -d/ -f1)"; '
        'if [ "$DSTACK_NODE_RANK" = 0 ]; then timeout 20 python3 -m http.server 7000 >/dev/null 2>&1 || true; '
        "else python3 -c 'import os, time, urllib.request\n"
        "for _ in range(150):\n"
        "    try:\n"
        '        urllib.request.urlopen("http://%s:7000/" % os.environ["DSTACK_MASTER_NODE_IP"], timeout=2)\n'
        '        print("reached the master"); break\n'
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "'; fi"
    )
    async with running_server(make_settings(tmp_path, sandbox="on")) as s, s.client() as c:
        await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2", placement="cluster"))
        body = task_body([script], name="pair", nodes=2)
        assert (await c.post("/api/project/main/runs/apply", json=body)).status_code == 200

        async def reached() -> str | None:
            run = await get_run(c, "pair")
            sub = run["jobs"][1]["job_submissions"][-1]
            out = await _logs(c, "pair", sub["id"])
            last.append((sub["status"], sub.get("termination_reason_message"), out))
            return out if "reached the master" in out else None

        last: list[Any] = []

        try:
            worker_out = await wait_for(reached, timeout=60)
        except AssertionError:
            master = (await get_run(c, "pair"))["jobs"][0]["job_submissions"][-1]
            seen = {k: master.get(k) for k in ("status", "termination_reason", "termination_reason_message")}
            seen["output"] = await _logs(c, "pair", master["id"])
            raise AssertionError({"worker": last[-3:], "master": seen}) from None
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["pair"], "abort": True})
        run = await finished_run(c, "pair")
        master_out = await _logs(c, "pair", run["jobs"][0]["job_submissions"][-1]["id"])
    lines = [" ".join(out.splitlines()[0].split()) for out in (master_out, worker_out)]
    own = [line.rsplit("own=", 1)[1] for line in lines]
    assert own[0] != own[1] and all(a.startswith("10.247.") for a in own), lines
    for line in lines:
        assert line.startswith(f"ips={own[0]} {own[1]} master={own[0]} "), lines


async def _user(s: RunningServer, name: str) -> str:
    async with s.client() as admin:
        await admin.post("/api/users/create", json={"username": name, "global_role": "user"})
        await admin.post(
            "/api/projects/main/add_members", json={"members": [{"username": name, "project_role": "user"}]}
        )
        return str((await admin.post("/api/users/get_user", json={"username": name})).json()["creds"]["token"])


async def test_without_a_sandbox_the_local_backend_admits_only_global_admins(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, sandbox="off")) as s:
        token = await _user(s, "bob")
        async with s.client() as admin, s.client(token=token) as bob:
            await admin.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))
            refused = await bob.post("/api/project/main/runs/apply", json=task_body(["true"], name="bobs"))
            assert refused.status_code == 400, refused.text
            assert "without a sandbox" in refused.text and "global admins" in refused.text
            ok = await admin.post("/api/project/main/runs/apply", json=task_body(["sleep 30"], name="admins"))
            assert ok.status_code == 200, ok.text

            async def running() -> str | None:
                sub = (await get_run(admin, "admins"))["latest_job_submission"]
                return sub["status_message"] if sub["status"] == "running" else None

            message = await wait_for(running, timeout=30)
            assert message.startswith("Runs without a sandbox: the sandbox is turned off"), message
            await admin.post("/api/project/main/runs/stop", json={"runs_names": ["admins"], "abort": True})
            run = await finished_run(admin, "admins")
            assert run["latest_job_submission"]["status_message"] == "aborted", run
            assert (await bob.post("/api/project/main/runs/get", json={"run_name": "bobs"})).status_code == 400
