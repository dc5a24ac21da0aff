"""The agent against what a real ``nvidia-smi`` prints (``tests/data/nvidia-smi/``, each capture's source in
its README): an H100 80GB HBM3 is detected as dstack names it (in-process and by an agent process), with the
memory and driver the capture shows, through the fake that answers only the agent's exact command lines;
numbers with units (``81559 MiB``) read as without; a GPU in MIG mode (utilization ``[N/A]``) gives no GPU
values rather than a made-up 0 %."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.agent import metrics, resources
from corral.agent.protocol import GpuDriver, GpuInfo, HostInfo
from nvidia_smi_fake import H100, LOAD_MARKER, install

#: The capture's values, read here from the README's sources (not from the code's constants).
NAME, SHORT, MEMORY_MIB, DRIVER = "NVIDIA H100 80GB HBM3", "H100", 81559, "565.57.01"


def test_the_agents_queries_are_the_captured_command_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert resources.nvidia_gpus() == ([GpuInfo(SHORT, MEMORY_MIB, "nvidia")], GpuDriver("nvidia", DRIVER))
    sample = subprocess.run(metrics.NVIDIA_QUERY, capture_output=True, text=True, check=True).stdout
    assert metrics.parse_nvidia(sample) == {0: (1 * 2**20, 0)}  # idle: 1 MiB used, 0 %
    other = subprocess.run([str(fake), "--query-gpu=name", "--format=csv"], capture_output=True, text=True)
    assert other.returncode == 2 and "no captured output" in other.stderr  # no capture, no made-up answer
    listed = subprocess.run([str(fake), "-L"], capture_output=True, text=True, check=True).stdout
    assert listed.startswith(f"GPU 0: {NAME} (UUID: GPU-")


def test_an_agent_process_reports_the_captured_h100(agent_factory: Any, tmp_path: Path) -> None:
    install(tmp_path / "bin")
    a = agent_factory("gpu", env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    info = HostInfo.from_dict(a.http.get("/info").json())
    assert [(g.name, g.memory_mib, g.vendor) for g in info.gpus] == [(SHORT, MEMORY_MIB, "nvidia")]
    assert info.gpu_driver == GpuDriver("nvidia", DRIVER)


def test_the_busy_capture_while_the_load_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", LOAD_MARKER]) as load:
        try:
            out = subprocess.run(metrics.NVIDIA_QUERY, capture_output=True, text=True, check=True).stdout
        finally:
            load.kill()
    assert metrics.parse_nvidia(out) == {0: (3881 * 2**20, 100)}


def test_memory_with_its_unit_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host query printed with units (``81559 MiB``: without ``nounits``) still gives the GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat {H100 / 'query-name-memory-driver-units.csv'}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert resources.nvidia_gpus() == ([GpuInfo(SHORT, MEMORY_MIB, "nvidia")], GpuDriver("nvidia", DRIVER))
    units = "0, 3881 MiB, 100 %\n"  # the busy capture, as the sampling query prints it without nounits
    assert metrics.parse_nvidia(units) == {0: (3881 * 2**20, 100)}


def test_a_mig_gpu_has_no_utilization_and_gives_no_values() -> None:
    assert metrics.parse_nvidia((H100 / "query-index-memory-util-mig.csv").read_text()) == {}
    assert metrics.parse_nvidia("0, [Not Supported], 5\n1, 10, 20\n") == {1: (10 * 2**20, 20)}
