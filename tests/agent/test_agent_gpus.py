"""An agent restricted to some of the host's GPUs (``serve --gpus``) reports, and gives its jobs, only
those (a fake ``nvidia-smi`` reporting three GPUs); the server picks each carve's GPUs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from corral.agent.gpus import parse_gpus, visible_devices_env
from corral.agent.protocol import JobSubmission
from corral.agent.protocol_containers import ContainerSpec
from corral.agent.server import Agent
from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.blocks import carved_offers, pick_host_gpus


@pytest.fixture
def three_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\nfor n in 0 1 2; do echo "NVIDIA A100-SXM4-80GB, 8100$n, 550.54.15"; done\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")


def test_a_restricted_agent_reports_and_hands_out_only_its_gpus(tmp_path: Path, three_gpus: None) -> None:
    agent = Agent(str(tmp_path / "w"), "t", gpus=(2, 0))
    try:
        assert [g.memory_mib for g in agent.info().gpus] == [81002, 81000]
        assert agent.nvidia_gpu_ids() == ["2", "0"]  # what containers' device requests pick from
        host = agent.admit(JobSubmission("j", "r", ["true"], env={"CUDA_VISIBLE_DEVICES": "1"}))
        assert (host.env["CUDA_VISIBLE_DEVICES"], host.env["NVIDIA_VISIBLE_DEVICES"]) == ("2,0", "2,0")
        assert host.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # numbered as nvidia-smi numbers them
        whole = agent.admit(JobSubmission("k", "r", ["true"], image="ubuntu", container=ContainerSpec(gpus=-1)))
        assert whole.container is not None and whole.container.gpus == 2  # "all" is all of the agent's
        assert "CUDA_VISIBLE_DEVICES" not in whole.env  # the container runtime does it
    finally:
        agent.httpd.server_close()
    unrestricted = Agent(str(tmp_path / "u"), "t")
    try:
        assert unrestricted.nvidia_gpu_ids() == ["0", "1", "2"]
        assert unrestricted.admit(JobSubmission("j", "r", ["true"])).env == {}
    finally:
        unrestricted.httpd.server_close()
    none = Agent(str(tmp_path / "n"), "t", gpus=())
    try:
        assert none.info().gpus == [] and none.info().gpu_driver is None
        env = none.admit(JobSubmission("j", "r", ["true"])).env
        assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"], env["ROCR_VISIBLE_DEVICES"]) == (
            "",
            "void",
            "",
        )
    finally:
        none.httpd.server_close()


def test_the_gpus_flag_is_checked(tmp_path: Path) -> None:
    assert parse_gpus("1, 3") == (1, 3) and parse_gpus("none") == () and parse_gpus("") == ()
    for bad, says in (("0,x", "expected GPU indexes"), ("1,1", "GPU 1 is given twice"), ("-1", "expected")):
        with pytest.raises(ValueError, match=says):
            parse_gpus(bad)
    (tmp_path / "tok").write_text("t")
    argv = ["serve", "--work-dir", str(tmp_path / "w"), "--token-file", str(tmp_path / "tok"), "--gpus", "a"]
    proc = subprocess.run([sys.executable, "-m", "corral.agent", *argv], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "--gpus 'a': expected GPU indexes" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert visible_devices_env([1], ["amd"])["ROCR_VISIBLE_DEVICES"] == "1"


def test_each_carve_gets_gpus_no_live_carve_holds() -> None:
    host = InstanceResources(cpus=8, memory_mib=8192, gpus=tuple(Gpu("A100", 81920) for _ in range(4)))
    one, two, _three, four = carved_offers("local", host, 4)
    assert pick_host_gpus(one, set()) == (0,)
    assert pick_host_gpus(one, {0, 2}) == (1,)
    assert pick_host_gpus(two, {1}) == (0, 2)
    assert pick_host_gpus(four, {3}) is None  # not enough free
    assert pick_host_gpus(four, set()) == (0, 1, 2, 3)
    # more blocks than GPUs: a share has none, the whole machine has them all
    share, whole = carved_offers("local", replace(host, gpus=host.gpus[:2]), 4)[1::2]
    assert (pick_host_gpus(share, set()), pick_host_gpus(whole, set())) == ((), (0, 1))
    cpus_only = carved_offers("local", InstanceResources(cpus=2, memory_mib=1024, gpus=()), 2)[0]
    assert pick_host_gpus(cpus_only, {0}) == ()
