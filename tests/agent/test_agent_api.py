"""The agent's HTTP surface: auth, errors, lifecycle (restart, shutdown, SIGTERM), host info."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path
from typing import Any

import httpx
from agent_harness import AgentProc

from corral.agent import procs
from corral.agent.protocol import HostInfo, JobState


def test_health_needs_no_token_everything_else_does(agent: AgentProc) -> None:
    r = httpx.get(agent.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert agent.http.get("/health").json()["protocol_version"] == 1  # the details only with the token
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
        for method, path in (("GET", "/info"), ("GET", "/jobs"), ("POST", "/jobs"), ("POST", "/shutdown")):
            r = httpx.request(method, agent.url + path, headers=headers)
            assert r.status_code == 403, (method, path, headers)
            assert "error" in r.json()
    assert agent.proc.poll() is None


def test_bad_requests_are_clear_400s(agent: AgentProc) -> None:
    r = agent.http.post("/jobs", content=b"{not json")
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]
    r = agent.http.post("/jobs", json={"job_id": "x", "run_name": "r", "commands": "echo"})
    assert r.status_code == 400 and "JobSubmission.commands" in r.json()["error"]
    r = agent.http.post("/jobs", json={"job_id": "x", "run_name": "r", "commands": ["true"], "stop_duration": -1})
    assert r.status_code == 400 and "stop_duration" in r.json()["error"]
    r = agent.http.post("/jobs", json={"job_id": "../evil", "run_name": "r", "commands": ["true"]})
    assert r.status_code == 400 and "job_id" in r.json()["error"]
    r = agent.http.post("/jobs", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]
    r = agent.http.get("/jobs/nope/logs", params={"offset": "abc"})
    assert r.status_code in (400, 404)
    agent.submit("q", ["true"])
    r = agent.http.get("/jobs/q/logs", params={"offset": "-1"})
    assert r.status_code == 400 and "offset" in r.json()["error"]
    r = agent.http.post("/jobs/q/stop", json={"abort": "yes"})
    assert r.status_code == 400 and "abort" in r.json()["error"]
    assert agent.http.get("/nowhere").status_code == 404
    assert agent.http.get("/jobs/missing").status_code == 404
    assert agent.http.post("/jobs/missing/stop", json={}).status_code == 404
    assert agent.http.put("/jobs").status_code == 405
    for r in (agent.http.get("/nowhere"), agent.http.post("/jobs", content=b"[")):
        assert "Traceback" not in r.text


def test_info(agent: AgentProc) -> None:
    info = HostInfo.from_dict(agent.http.get("/info").json())
    assert info.cpus >= 1 and info.memory_mib > 0 and info.disk_size_mib > 0
    assert info.cpu_arch in ("x86", "arm") and info.agent_version and info.python_version
    total = os.statvfs(agent.work_dir)
    assert info.disk_size_mib == total.f_blocks * total.f_frsize // (1024 * 1024)


def _fake_nvidia_smi(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_fake_nvidia_smi_detected(agent_factory: Any, tmp_path: Path) -> None:
    expected = "--query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits"
    _fake_nvidia_smi(
        tmp_path / "bin",
        f'[ "$*" = "{expected}" ] || {{ echo "bad args: $*" >&2; exit 9; }}\n'
        "echo 'NVIDIA H200, 143771, 550.54.15'\n"
        "echo 'NVIDIA H200, 143771, 550.54.15'\n"
        "echo 'NVIDIA GeForce RTX 4090, 24564, 550.54.15'\n",
    )
    a = agent_factory("gpu", env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    info = HostInfo.from_dict(a.http.get("/info").json())
    assert [(g.name, g.memory_mib, g.vendor) for g in info.gpus] == [
        ("H200", 143771, "nvidia"),
        ("H200", 143771, "nvidia"),
        ("RTX4090", 24564, "nvidia"),
    ]
    assert info.gpu_driver is not None and info.gpu_driver.version == "550.54.15"


def test_agent_restart_reaps_orphaned_jobs(agent_factory: Any) -> None:
    a = agent_factory("restart")
    a.submit("orphan", ["sleep 60 & echo $! > child.pid", "echo started", "sleep 60"])
    a.submit("finished", ["echo kept"])
    a.wait_finished("finished")
    a.http.get("/jobs/orphan/logs", params={"wait": 5, "offset": a.started_offset("orphan")})
    leader = a.state("orphan")["pid"]
    child = int((a.job_dir("orphan") / "workdir" / "child.pid").read_text())
    os.kill(a.proc.pid, signal.SIGKILL)  # the agent only: its jobs live in their own sessions
    a.proc.wait(5)
    assert procs.is_alive(leader) and procs.is_alive(child)
    b = agent_factory("restart")
    st = b.state("orphan")
    assert (st["state"], st["message"], st["termination_reason"]) == (
        "failed",
        "agent restarted",
        "agent_restarted",
    )
    assert not procs.is_alive(leader) and not procs.is_alive(child)
    assert b.output("orphan") == b"started\n"
    assert b.state("finished")["state"] == "done" and b.output("finished") == b"kept\n"


def test_shutdown_stops_jobs_and_exits(agent_factory: Any) -> None:
    a = agent_factory("shutdown")
    pid = a.wait_running(a.submit("s", ["sleep 60"])["job_id"])["pid"]
    t0 = time.monotonic()
    assert a.http.post("/shutdown").status_code == 200
    assert a.proc.wait(10) == 0
    assert time.monotonic() - t0 < 5
    assert not procs.is_alive(pid)
    assert not (a.work_dir / "agent.port").exists() and not (a.work_dir / "agent.pid").exists()
    final = JobState.from_dict(__import__("json").loads((a.job_dir("s") / "state.json").read_text()))
    assert final.state == "terminated"
    # the agent's own shutdown, never told as the server's request
    assert final.termination_reason == "agent_shutdown", final
    assert final.message is not None and final.message.startswith("stopped: its agent was shut down"), final


def test_sigterm_is_a_shutdown(agent_factory: Any) -> None:
    a = agent_factory("sigterm")
    assert int((a.work_dir / "agent.pid").read_text()) == a.proc.pid
    pid = a.wait_running(a.submit("s", ["trap '' TERM", "sleep 60"], stop_duration=0.5)["job_id"])["pid"]
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(10) == 0
    assert not procs.is_alive(pid)
