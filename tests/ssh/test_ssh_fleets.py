"""SSH fleets end to end against fake hosts (network namespaces with their own sshd, hostname, processes
and copy-on-write root): bootstrap, resources, placement, blocks, a host lost and back, in-place host
changes, proxy jump, and delete cleanup. The server runs in-process; everything else is real."""

from __future__ import annotations

import time
from pathlib import Path

from ssh_harness import (
    apply_fleet,
    by_host,
    corral_cli,
    fleet_settled,
    get_fleet,
    host_run,
    plan_fleet,
    run_get,
    run_logs,
    run_status,
    ssh_fleet,
    submit,
)

from corral.workers.scheduling import Scheduling
from fakehosts import FakeHosts
from server_harness import RunningServer, wait_for

AGENT_PS = "ps -eo args= | grep -c '[a]gent.pyz serve' || true"


async def _agent_processes(fh: FakeHosts, host: str) -> int:
    return int((await host_run(fh, host, AGENT_PS)).stdout.strip() or 0)


async def test_three_hosts_bootstrap_gpu_placement_spread_and_delete(
    server: RunningServer, hosts: FakeHosts, tmp_path: Path
) -> None:
    names = ("gpu", "cpu1", "cpu2")
    async with server.client() as c:
        started = time.monotonic()
        await apply_fleet(c, ssh_fleet(hosts, "trio", [hosts.ip(n) for n in names]))
        fleet = await wait_for(lambda: fleet_settled(c, "trio"), timeout=30)
        bootstrap_s = time.monotonic() - started
        insts = by_host(fleet)
        assert {i["status"] for i in insts.values()} == {"idle"}, fleet
        for name in names:
            inst = insts[hosts.ip(name)]
            assert inst["backend"] == "remote" and inst["corral_backend"] == "ssh"
            res = inst["instance_type"]["resources"]
            assert res["cpus"] >= 1 and res["memory_mib"] > 0 and res["disk"]["size_mib"] > 0
        gpus = insts[hosts.ip("gpu")]["instance_type"]["resources"]["gpus"]
        assert [(g["name"], g["memory_mib"], g["vendor"]) for g in gpus] == [("A100", 81920, "nvidia")] * 2
        assert insts[hosts.ip("cpu1")]["instance_type"]["resources"]["gpus"] == []

        # On each host: one agent, under ~/.corral-agent, listening on loopback only, and its systemd unit.
        for name in names:
            assert await _agent_processes(hosts, name) == 1
            port = (await host_run(hosts, name, "cat ~/.corral-agent/work/agent.port")).stdout.strip()
            probe = (
                "python3 -c 'import socket,sys; a=sys.argv[1]; p=int(sys.argv[2]);"
                '\ntry:\n socket.create_connection((a,p),2); print("open")\nexcept OSError: print("closed")\''
            )
            assert (await host_run(hosts, name, f"{probe} 127.0.0.1 {port}")).stdout.strip() == "open"
            assert (await host_run(hosts, name, f"{probe} {hosts.ip(name)} {port}")).stdout.strip() == "closed"
            unit = (await host_run(hosts, name, "cat /etc/systemd/system/corral-agent.service")).stdout
            assert "ExecStart=" in unit and "agent.pyz serve" in unit and "Restart=always" in unit

        # `corral fleet` shows the hosts with their resources and GPUs.
        code, out = await corral_cli(server, tmp_path, "fleet")
        assert code == 0, out
        assert "trio" in out and "A100" in out and out.count("idle") == 3, out

        # A task asking for a GPU lands on the host that has them (`gpu: 1` would need blocks: dstack's
        # count is exact, so it asks for "1 or more").
        await submit(c, "wants-gpu", ["hostname", "echo gpus=$DSTACK_GPUS_NUM"], resources={"gpu": "1.."})
        run = await run_status(c, "wants-gpu", "done", "failed")
        assert run["status"] == "done", str(run["latest_job_submission"])
        assert run["latest_job_submission"]["job_provisioning_data"]["internal_ip"] == hosts.ip("gpu")
        assert (await run_logs(c, run)).split() == ["gpu", "gpus=2"]

        # Three tasks at once spread over the three hosts (one whole host each).
        for i in range(3):
            await submit(c, f"spread-{i}", ["hostname", "sleep 2"])
        runs = [await run_status(c, f"spread-{i}", "done", "failed") for i in range(3)]
        assert all(r["status"] == "done" for r in runs), runs
        placed = {r["latest_job_submission"]["job_provisioning_data"]["internal_ip"] for r in runs}
        assert placed == {hosts.ip(n) for n in names}
        assert {(await run_logs(c, r)).split()[0] for r in runs} == set(names)

        # `instances` selectors by hostname: the address in the fleet, or the name the host gives itself.
        await submit(c, "by-address", ["hostname"], instances=[{"hostname": hosts.ip("cpu2")}])
        await submit(c, "by-name", ["hostname"], instances=[{"hostname": "cpu1"}])
        for name, host in (("by-address", "cpu2"), ("by-name", "cpu1")):
            run = await run_status(c, name, "done", "failed")
            assert (await run_logs(c, run)).strip() == host, run["latest_job_submission"]

        # Delete: the agents stop and what corral put on the hosts is gone.
        r = await c.post("/api/project/main/fleets/delete", json={"names": ["trio"]})
        assert r.status_code == 200, r.text

        async def gone() -> bool:
            return not (await c.post("/api/project/main/fleets/list", json={})).json()

        await wait_for(gone, timeout=30)
        for name in names:
            assert await _agent_processes(hosts, name) == 0
            left = await host_run(hosts, name, "ls -d ~/.corral-agent /etc/systemd/system/corral-agent.service")
            assert left.exit_status != 0 and not left.stdout, left.stdout
    print(f"bootstrap of 3 hosts: {bootstrap_s:.2f}s")


async def test_amd_gpus_found_by_amd_smi(server: RunningServer, hosts: FakeHosts) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "red", [hosts.ip("amd")]))
        fleet = await wait_for(lambda: fleet_settled(c, "red", 1), timeout=30)
        gpus = fleet["instances"][0]["instance_type"]["resources"]["gpus"]
        assert [(g["name"], g["memory_mib"], g["vendor"]) for g in gpus] == [("MI300X", 196592, "amd")] * 2
        await submit(c, "on-amd", ["hostname"], resources={"gpu": "MI300X:1.."})
        run = await run_status(c, "on-amd", "done", "failed")
        assert (await run_logs(c, run)).strip() == "amd"


async def test_blocks(server: RunningServer, hosts: FakeHosts) -> None:
    """``blocks: auto`` on the GPU host (one block per GPU) and fleet-level ``blocks: 2`` on a CPU host;
    two one-GPU tasks share the GPU host at once."""
    async with server.client() as c:
        conf = ssh_fleet(hosts, "blocky", [{"hostname": hosts.ip("gpu"), "blocks": "auto"}, hosts.ip("cpu1")], blocks=2)
        await apply_fleet(c, conf)
        fleet = await wait_for(lambda: fleet_settled(c, "blocky"), timeout=30)
        insts = by_host(fleet)
        assert insts[hosts.ip("gpu")]["total_blocks"] == 2 and insts[hosts.ip("cpu1")]["total_blocks"] == 2
        for i in range(2):
            await submit(c, f"half-{i}", ["hostname", "sleep 3"], resources={"gpu": 1})
        for i in range(2):
            await run_status(c, f"half-{i}", "running")
        busy = by_host(await get_fleet(c, "blocky"))[hosts.ip("gpu")]
        assert busy["busy_blocks"] == 2, busy
        for i in range(2):
            run = await run_status(c, f"half-{i}", "done", "failed")
            assert run["status"] == "done" and (await run_logs(c, run)).strip() == "gpu", run
            assert run["latest_job_submission"]["job_provisioning_data"]["internal_ip"] == hosts.ip("gpu")


async def test_host_lost_mid_job_then_back(server: RunningServer, hosts: FakeHosts, tmp_path: Path) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "solo", [hosts.ip("cpu1")]))
        await wait_for(lambda: fleet_settled(c, "solo", 1), timeout=30)
        await submit(c, "long", ["echo started", "sleep 600"])
        await run_status(c, "long", "running")
        await wait_for(lambda: _logs_contain(c, "long", "started"))

        hosts.kill("cpu1")  # power cut: every process of the host dies
        run = await run_status(c, "long", "failed", timeout=30)
        job = run["latest_job_submission"]
        assert job["termination_reason"] == "instance_unreachable", job

        async def flagged() -> dict[str, object] | None:
            inst = (await get_fleet(c, "solo"))["instances"][0]
            return inst if inst["unreachable"] else None

        inst = await wait_for(flagged, timeout=15)
        assert inst["status"] in ("idle", "busy")  # a flag beside the status: never terminated
        listed = (await c.post("/api/instances/list", json={})).json()
        assert [i["unreachable"] for i in listed] == [True]
        _code, out = await corral_cli(server, tmp_path, "fleet")
        assert "unreachable" in out, out
        # A new task waits instead of going to the lost host.
        await submit(c, "after", ["hostname"])
        await Scheduling(server.ctx).pass_once()  # a scheduling pass, run here: it does not place the job
        assert (await run_get(c, "after"))["status"] == "submitted"

        hosts.revive("cpu1")  # a reboot without systemd: corral starts the agent again and uses the host
        run = await run_status(c, "after", "done", "failed", timeout=30)
        assert run["status"] == "done" and (await run_logs(c, run)).strip() == "cpu1", run
        inst = (await get_fleet(c, "solo"))["instances"][0]
        assert inst["unreachable"] is False and inst["status"] == "idle"


async def _logs_contain(c: object, name: str, text: str) -> bool:
    run = await run_get(c, name)  # type: ignore[arg-type]
    return text in await run_logs(c, run)  # type: ignore[arg-type]


async def test_hosts_added_and_removed_in_place(server: RunningServer, hosts: FakeHosts) -> None:
    async with server.client() as c:
        await apply_fleet(c, ssh_fleet(hosts, "moving", [hosts.ip("cpu1")]))
        first = (await wait_for(lambda: fleet_settled(c, "moving", 1), timeout=30))["instances"][0]
        await submit(c, "holder", ["sleep 600"])
        await run_status(c, "holder", "running")

        # Replace cpu1 by cpu2 while cpu1 is busy: an in-place update.
        conf = ssh_fleet(hosts, "moving", [hosts.ip("cpu2")])
        plan = await plan_fleet(c, conf)
        assert plan["action"] == "update"
        fleet = await apply_fleet(c, conf)
        assert fleet["id"] == plan["current_resource"]["id"]
        settled = await wait_for(lambda: fleet_settled(c, "moving", 2), timeout=30)
        insts = by_host(settled)
        old = insts[hosts.ip("cpu1")]
        assert old["id"] == first["id"] and old["status"] == "busy"  # busy: stays until its job ends
        assert "once its jobs finish" in (old["termination_reason_message"] or "")
        assert insts[hosts.ip("cpu2")]["status"] == "idle"
        # New work goes to the new host only.
        await submit(c, "newcomer", ["hostname"])
        run = await run_status(c, "newcomer", "done", "failed")
        assert (await run_logs(c, run)).strip() == "cpu2"

        # Once free, the removed host leaves and corral's files leave it.
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["holder"], "abort": True})
        after = await wait_for(lambda: fleet_settled(c, "moving", 1), timeout=30)
        assert [i["hostname"] for i in after["instances"]] == [hosts.ip("cpu2")]
        left = await host_run(hosts, "cpu1", "ls -d ~/.corral-agent")
        assert left.exit_status != 0
        assert await _agent_processes(hosts, "cpu1") == 0

        # Changing a kept host's parameters is not an in-place update.
        changed = ssh_fleet(hosts, "moving", [{"hostname": hosts.ip("cpu2"), "port": 22, "blocks": 2}])
        plan = await plan_fleet(c, changed)
        assert plan["action"] == "create"
        spec = {"configuration": changed, "profile": {}}
        body = {"force": False, "plan": {"spec": spec, "current_resource": plan["current_resource"]}}
        r = await c.post("/api/project/main/fleets/apply", json=body)
        assert r.status_code == 400 and "Hosts configuration changed" in r.text, r.text


async def test_proxy_jump(server: RunningServer, hosts: FakeHosts) -> None:
    """``hidden`` lets root in only from ``gpu``'s address: corral reaches it through ``gpu``."""
    import asyncssh

    try:
        await asyncssh.connect(
            hosts.ip("hidden"), username="root", client_keys=[str(hosts.key)], known_hosts=None, config=None
        )
        raise AssertionError("the hidden host must refuse direct logins")
    except asyncssh.PermissionDenied:
        pass
    async with server.client() as c:
        jump = {"hostname": hosts.ip("gpu"), "user": "root", "identity_file": str(hosts.key)}
        jump["ssh_key"] = ssh_fleet(hosts, "x", [])["ssh_config"]["ssh_key"]
        await apply_fleet(c, ssh_fleet(hosts, "behind", [hosts.ip("hidden")], ssh_config={"proxy_jump": jump}))
        fleet = await wait_for(lambda: fleet_settled(c, "behind", 1), timeout=30)
        assert fleet["instances"][0]["status"] == "idle", fleet
        await submit(c, "through", ["hostname"])
        run = await run_status(c, "through", "done", "failed")
        assert (await run_logs(c, run)).strip() == "hidden"
        assert await _agent_processes(hosts, "gpu") == 0  # the jump host only forwards
