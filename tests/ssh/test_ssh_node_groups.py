"""A heterogeneous multi-node task (``groups``) on two fake SSH hosts: the CPU group's node and the GPU
group's node are placed together on the hosts that fit each, see each other's addresses (dstack's
``DSTACK_*`` variables and ``${{ groups[i].nodes[j].IP_ADDRESS }}`` in their commands), and ``corral ps``
shows the groups."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
from ssh_harness import apply_fleet, corral_cli, fleet_settled, run_status, ssh_fleet

from fakehosts import FakeHosts
from server_harness import RunningServer, wait_for

SMALL = {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."}
SAY = (
    'echo "$(hostname) rank=$DSTACK_NODE_RANK nodes=$DSTACK_NODES_NUM master=$DSTACK_MASTER_NODE_IP '
    'gpus=$DSTACK_GPUS_NUM worker=${{ groups[1].nodes[0].IP_ADDRESS }} ips=$(echo $DSTACK_NODES_IPS)"'
)


async def _job_logs(c: httpx.AsyncClient, run: dict[str, Any], job_num: int) -> str:
    job = next(j for j in run["jobs"] if j["job_spec"]["job_num"] == job_num)
    body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": job["job_submissions"][-1]["id"]}
    r = await c.post("/api/project/main/logs/poll", json={**body, "limit": 1000})
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode().strip()


async def test_two_groups_see_each_other(server: RunningServer, hosts: FakeHosts, tmp_path: Path) -> None:
    gpu, cpu = hosts.ip("gpu"), hosts.ip("cpu1")
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "pair", [gpu, cpu], placement="cluster"))
        await wait_for(lambda: fleet_settled(c, "pair", 2), timeout=30)
        configuration = {
            "type": "task",
            "name": "ray-like",
            "fleets": ["pair"],
            "groups": [
                {"name": "head", "nodes": 1, "resources": SMALL, "commands": [SAY]},
                {"name": "workers", "nodes": 1, "resources": {**SMALL, "gpu": "1.."}, "commands": [SAY]},
            ],
        }
        body = {"force": False, "plan": {"run_spec": {"configuration": configuration}}}
        applied = await c.post("/api/project/main/runs/apply", json=body)
        assert applied.status_code == 200, applied.text
        run = await run_status(c, "ray-like", "done", "failed", timeout=40)
        assert run["status"] == "done", run["status_message"]
        specs = sorted((j["job_spec"] for j in run["jobs"]), key=lambda s: s["job_num"])
        assert [(s["node_group_name"], s["node_group_index"], s["jobs_per_replica"]) for s in specs] == [
            ("head", 0, 2),
            ("workers", 1, 2),
        ]
        placed = [j["job_submissions"][-1]["job_provisioning_data"]["internal_ip"] for j in run["jobs"]]
        assert sorted(placed) == sorted([cpu, gpu])
        head, worker = await _job_logs(c, run, 0), await _job_logs(c, run, 1)
        # the head (no GPU asked) left the GPU host to the group that needs it
        expected = f"rank={{}} nodes=2 master={cpu} gpus=2 worker={gpu} ips={cpu} {gpu}"
        assert head == f"cpu1 {expected.format(0)}", head
        assert worker == f"gpu {expected.format(1)}", worker

        code, out = await corral_cli(server, tmp_path, "ps", "-a")
        assert code == 0, out
        assert "group=head job=0" in out and "group=workers job=1" in out, out
