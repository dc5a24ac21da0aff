"""SSH fleets without hosts: the systemd unit and start script corral writes, blocks and internal IPs,
in-place update rules, the scheduler's view of hosts being set up, and the API's 400s for bad
``ssh_config``s (the server runs without workers here, so it never tries to reach these addresses)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from corral.agent.protocol import HostInfo
from corral.backends.ssh import internal_ip, split_blocks
from corral.backends.ssh_bootstrap import UNIT_PATH, HostFacts, env_file, sandbox_flags, start_script, unit_file
from corral.domain.resources import Gpu, InstanceResources, Range, Requirements
from corral.scheduler.schedule import schedule
from corral.scheduler.types import FleetSlot, InstanceSlot, QueuedJob, Snapshot, Wait, WaitPolicy
from corral.services.ssh_fleets import update_problem
from server_harness import make_settings, running_server

ROOT = HostFacts(
    python="/usr/bin/python3",
    python_version=(3, 11),
    home="/root",
    uid=0,
    systemd=True,
    unit_dir=True,
    agent_hash=None,
)
KEY = {"public": "", "private": asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()}


def test_unit_file_restarts_the_agent_with_the_host() -> None:
    unit = unit_file(ROOT, "root")
    assert (
        "ExecStart=/usr/bin/python3 -I /root/.corral-agent/agent.pyz serve --work-dir /root/.corral-agent/work" in unit
    )
    assert "--token-file /root/.corral-agent/agent.token" in unit
    assert "Restart=always" in unit and "WantedBy=multi-user.target" in unit
    assert "User=root" in unit and "EnvironmentFile=-/root/.corral-agent/agent.env" in unit
    assert "KillMode=process" in unit  # jobs are not killed when the agent restarts


def test_start_script_uses_systemd_where_it_runs_and_setsid_elsewhere() -> None:
    with_systemd = start_script(ROOT, "root", "tok123", {}, 10)
    assert f"base64 -d > {UNIT_PATH}" in with_systemd
    assert "systemctl restart corral-agent" in with_systemd and "setsid nohup" not in with_systemd
    no_systemd = start_script(HostFacts(**{**ROOT.__dict__, "systemd": False}), "root", "tok123", {}, 10)
    assert f"base64 -d > {UNIT_PATH}" in no_systemd  # written anyway: systemd uses it after a reboot
    assert "setsid nohup" in no_systemd and "systemctl" not in no_systemd
    user = start_script(HostFacts(**{**ROOT.__dict__, "uid": 1000, "home": "/home/u"}), "u", "tok123", {}, 10)
    assert UNIT_PATH not in user and "setsid nohup" in user
    assert "tok123" in with_systemd and "<<'CORRAL_TOKEN'" in with_systemd  # from stdin, never in argv


def test_the_agent_gets_the_servers_sandbox_settings_and_is_restarted_when_they_change() -> None:
    flags = sandbox_flags("on", "300000-300099")
    assert flags == ("--sandbox", "on", "--uid-range", "300000-300099")
    assert sandbox_flags("auto", None) == ("--sandbox", "auto")
    assert "--token-file /root/.corral-agent/agent.token --sandbox on --uid-range 300000-300099\n" in unit_file(
        ROOT, "root", flags
    )
    script = start_script(HostFacts(**{**ROOT.__dict__, "systemd": False}), "root", "tok123", {}, 10, flags)
    assert "agent.token --sandbox on --uid-range 300000-300099' >> agent.log" in script
    # an agent running with the same token but other flags is not adopted: it is started again
    assert "cmp -s agent.flags.new agent.flags" in script
    for mode, uids in (("maybe", None), ("on", "1-2; rm -rf /")):
        with pytest.raises(ValueError):
            sandbox_flags(mode, uids)


def test_env_file_is_quoted_for_sh_and_systemd() -> None:
    assert env_file({"B": "two words", "A": "1"}) == "A=1\nB='two words'\n"


def _res(cpus: int, gpus: int) -> InstanceResources:
    return InstanceResources(cpus=cpus, memory_mib=8192, gpus=(Gpu("A100", 81920),) * gpus, disk_size_mib=1)


def test_split_blocks() -> None:
    assert split_blocks("auto", _res(8, 2)) == 2
    assert split_blocks("auto", _res(4, 0)) == 4
    assert split_blocks(1, _res(3, 1)) == 1
    with pytest.raises(ValueError, match="cannot split the host into 3 blocks"):
        split_blocks(3, _res(4, 2))


def test_internal_ip() -> None:
    info = HostInfo(
        hostname="h",
        cpus=1,
        memory_mib=1,
        disk_size_mib=1,
        cpu_arch="x86",
        gpus=[],
        addresses=["10.0.0.5", "192.168.1.5"],
    )
    assert internal_ip({"host": "10.0.0.5"}, info) == "10.0.0.5"
    assert internal_ip({"host": "h.example", "network": "192.168.1.0/24"}, info) == "192.168.1.5"
    assert internal_ip({"host": "h.example", "internal_ip": "10.0.0.5"}, info) == "10.0.0.5"
    with pytest.raises(ValueError, match="not an address of the host"):
        internal_ip({"host": "h", "internal_ip": "10.9.9.9"}, info)
    with pytest.raises(ValueError, match="no address of the host is in network"):
        internal_ip({"host": "h", "network": "172.16.0.0/16"}, info)


def _spec(hosts: list[Any], **conf: Any) -> dict[str, Any]:
    ssh = {"user": "root", "identity_file": None, "ssh_key": None, "hosts": hosts, "network": None}
    return {"configuration": {"type": "fleet", "name": "fl", "blocks": 1, "ssh_config": ssh, **conf}}


def test_update_in_place_only_adds_or_removes_hosts() -> None:
    current = _spec(["10.0.0.1", {"hostname": "10.0.0.2", "identity_file": "a"}])
    assert (
        update_problem(current, _spec(["10.0.0.1", {"hostname": "10.0.0.2", "identity_file": "b"}, "10.0.0.3"])) is None
    )
    assert update_problem(current, _spec(["10.0.0.1"])) is None
    assert "Hosts configuration changed" in str(
        update_problem(current, _spec(["10.0.0.1", {"hostname": "10.0.0.2", "port": 2}]))
    )
    assert "placement" in str(update_problem(current, _spec(["10.0.0.1"], placement="cluster")))
    cloud = {"configuration": {"type": "fleet", "name": "fl", "nodes": {"min": 1, "max": 1}}}
    assert "Fleet type changed" in str(update_problem(current, cloud))


def test_a_host_being_set_up_makes_jobs_wait_not_fail() -> None:
    setting_up = InstanceSlot(
        id="i0",
        fleet_id="fl",
        name="fl-0",
        instance_num=0,
        status="pending",
        resources=None,
        total_blocks=1,
        busy_blocks=0,
    )
    fleet = FleetSlot(
        id="fl",
        project_id="p",
        name="fl",
        nodes_min=1,
        nodes_max=1,
        blocks=1,
        placement="any",
        offers=(),
        instances=(setting_up,),
    )
    job = QueuedJob(
        id="j",
        run_id="r",
        project_id="p",
        run_name="r",
        job_num=0,
        priority=0,
        submitted_at=0.0,
        requirements=Requirements(cpu_count=Range(1, None)),
        fleet_names=None,
        creation_policy="reuse-or-create",
        wait=WaitPolicy(True),
    )
    plan = schedule(Snapshot(fleets=(fleet,), queue=(job,)), now=1.0)
    assert [type(d) for g in plan.gangs for d in g.decisions] == [Wait]


# ---- the API, without workers --------------------------------------------------------------------


def _fleet(hosts: list[Any], **conf: Any) -> dict[str, Any]:
    ssh = {"user": "root", "ssh_key": KEY, "hosts": hosts, **conf.pop("ssh_config", {})}
    return {"type": "fleet", "name": conf.pop("name", "fl"), "ssh_config": ssh, **conf}


async def test_bad_ssh_configs_are_clear_400s(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (_fleet(["10.0.0.1"], nodes=2), "SSH fleet configuration does not support the following fields: ['nodes']"),
        (_fleet(["10.0.0.1"], resources={"gpu": 1}, idle_duration="1h"), "['resources', 'idle_duration']"),
        (
            _fleet(["10.0.0.1"], ssh_config={"ssh_key": None, "identity_file": "~/.ssh/id"}),
            "No SSH key for host 10.0.0.1",
        ),
        (_fleet(["10.0.0.1"], ssh_config={"user": None}), "No SSH user for host 10.0.0.1"),
        (_fleet(["10.0.0.1"], ssh_config={"ssh_key": {"public": "", "private": "not a key"}}), "Unsupported SSH key"),
        (_fleet(["10.0.0.1", {"hostname": "10.0.0.1", "port": 22}]), "Host 10.0.0.1:22 is listed twice"),
        (
            _fleet(["10.0.0.1", {"hostname": "10.0.0.2", "internal_ip": "10.1.0.2"}]),
            "internal_ip must be specified for all",
        ),
        (
            _fleet([{"hostname": "10.0.0.2", "internal_ip": "10.1.0.2"}], ssh_config={"network": "10.1.0.0/16"}),
            "mutually exclusive",
        ),
        (_fleet(["10.0.0.1"], env=["NOVALUE"]), "`env` variable NOVALUE of the fleet has no value"),
    ]
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as c:
        for conf, message in cases:
            for path, body in (
                ("get_plan", {"spec": {"configuration": conf, "profile": {}}}),
                ("apply", {"force": True, "plan": {"spec": {"configuration": conf, "profile": {}}}}),
            ):
                r = await c.post(f"/api/project/main/fleets/{path}", json=body)
                assert r.status_code == 400, (path, conf, r.text)
                assert message in r.json()["detail"][0]["msg"], (path, r.text)
        assert (await c.post("/api/project/main/fleets/list", json={})).json() == []  # nothing half-written


async def test_keys_stay_on_the_server_and_hosts_belong_to_one_fleet(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, background_processing=False)) as s, s.client() as c:
        conf = _fleet(["10.0.0.1", {"hostname": "10.0.0.2", "ssh_key": KEY}], name="one")
        plan = await c.post("/api/project/main/fleets/get_plan", json={"spec": {"configuration": conf, "profile": {}}})
        assert plan.status_code == 200, plan.text
        assert plan.json()["offers"] == [] and plan.json()["action"] == "create"
        assert "PRIVATE KEY" not in str(plan.json()["effective_spec"])
        body = {"force": False, "plan": {"spec": {"configuration": conf, "profile": {}}}}
        fleet = (await c.post("/api/project/main/fleets/apply", json=body)).json()
        assert [i["status"] for i in fleet["instances"]] == ["pending", "pending"]
        assert [i["hostname"] for i in fleet["instances"]] == ["10.0.0.1", "10.0.0.2"]
        assert {i["backend"] for i in fleet["instances"]} == {"remote"}
        for path, payload in (
            ("/api/project/main/fleets/get", {"name": "one"}),
            ("/api/project/main/fleets/list", {}),
            ("/api/instances/list", {}),
        ):
            text = (await c.post(path, json=payload)).text
            assert "PRIVATE KEY" not in text and KEY["private"][40:80] not in text, path
        other = _fleet(["10.0.0.3", "10.0.0.2"], name="two")
        r = await c.post(
            "/api/project/main/fleets/apply",
            json={"force": False, "plan": {"spec": {"configuration": other, "profile": {}}}},
        )
        assert r.status_code == 400 and "Instances [10.0.0.2:22] are already assigned to a fleet." in r.text


def test_private_key_problems(tmp_path: Path) -> None:
    from corral.backends.ssh_conn import private_key_problem

    assert private_key_problem(KEY["private"]) is None
    assert "cannot be read" in str(private_key_problem("nope"))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pw", "-f", str(tmp_path / "k")], check=True)
    assert "passphrase" in str(private_key_problem((tmp_path / "k").read_text()))


def test_the_example_ssh_fleet_parses() -> None:
    import yaml

    from corral.config import parse_fleet_configuration

    path = Path(__file__).resolve().parents[2] / "examples" / "ssh-fleet.dstack.yml"
    conf = parse_fleet_configuration(yaml.safe_load(path.read_text()))
    assert conf.ssh_config is not None and len(conf.ssh_config.hosts) == 2
