"""``scripts/gpu_check.py`` as a process, against the fake ``nvidia-smi`` of captured H100 output
(``tests/nvidia_smi_fake.py``) and with no torch: every server-side item passes (the plan's offer as the
capture reports the GPU and A100's no-offer, the load run's logs and metrics, the Prometheus series, the
queue, the utilization policy), the torch and matmul items say ``STAND-IN`` and never ``PASS``, the report
says the GPU was fake, and the raw ``nvidia-smi`` output it read is kept beside the report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_smi_fake import H100, LOAD_MARKER, install

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def fake_bin() -> Iterator[Path]:
    """The fake outside /tmp: a sandboxed job has a /tmp of its own, and must find the fake on its PATH."""
    d = Path(tempfile.mkdtemp(prefix="corral-fake-smi-", dir="/var/tmp"))
    d.chmod(0o755)
    install(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_check_against_captured_h100_output(tmp_path: Path, fake_bin: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PATH"] = f"{fake_bin}:{SYSTEM_PATH}"  # a python3 every uid can run, as a sandboxed job's
    args = ["--fake-bin", str(fake_bin), "--load-seconds", "6", "--policy-window", "3", "--budget", "120"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    status = {i["name"]: i["status"] for i in report["items"]}
    assert status.pop("import torch sees the GPU") == "STAND-IN"
    assert status.pop("bf16 matmul on the GPU") == "STAND-IN"
    assert set(status.values()) == {"PASS"} and len(status) == 8, report["items"]
    details = {i["name"]: i["detail"] for i in report["items"]}
    assert "[('H100', 81559)]" in details["plan offers the GPU"]
    assert "A100" in details["plan of gpu: A100"]
    assert "terminated_due_to_utilization_policy" in details["idle GPU ended by utilization_policy"]
    assert "max GPU utilisation 100 %" in details["metrics/job during the load"]  # the busy capture
    text = (out / "report.txt").read_text()
    assert text.startswith("corral GPU check (FAKE nvidia-smi") and text in done.stdout
    assert "8 PASS, 0 FAIL, 2 STAND-IN" in text
    raw = {p.name: p.read_text() for p in (out / "nvidia-smi").iterdir()}
    assert (H100 / "list-gpus.txt").read_text() in raw["02-list-gpus.txt"]
    assert any("during-load" in name for name in raw)
    assert "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-" in (out / "load-run.log").read_text()
    # what the sandbox reported for the GPU task (the agent's own log of the job), whichever it was here
    assert report["facts"]["load's sandbox"].startswith(("Sandbox opened", "Runs without a sandbox"))


def test_without_fake_bin_a_missing_torch_fails(tmp_path: Path, fake_bin: Path) -> None:
    """Run as on a real GPU (no ``--fake-bin``; the fake is only found on PATH): no torch is a failure, and the
    CPU stand-in is no matmul result; the check exits 1."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PATH"] = f"{fake_bin}:{SYSTEM_PATH}"
    args = ["--load-seconds", "2", "--policy-window", "2", "--budget", "90"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 1, done.stdout + done.stderr
    status = {i["name"]: i["status"] for i in json.loads((out / "report.json").read_text())["items"]}
    assert status["import torch sees the GPU"] == "FAIL" and status["bf16 matmul on the GPU"] == "FAIL"
    assert (out / "report.txt").read_text().startswith("corral GPU check (real nvidia-smi)")


def _load_processes() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and LOAD_MARKER.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_sigterm_stops_the_server_and_the_load_and_still_reports(tmp_path: Path, fake_bin: Path) -> None:
    """``gpu_check.sh``'s time limit (SIGTERM) mid-load: the server, its agents and the load are stopped (none
    left behind on the GPU), and the report so far is written, failing."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PATH"] = f"{fake_bin}:{SYSTEM_PATH}"
    args = ["--fake-bin", str(fake_bin), "--load-seconds", "120", "--policy-window", "3", "--budget", "150"]
    with subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        deadline = time.monotonic() + 90
        while not list((out / "nvidia-smi").glob("*during-load*")):  # the load runs and is sampled
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        assert _load_processes()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 1
    assert "FAIL     check ran to the end: Interrupted: SIGTERM" in (out / "report.txt").read_text()
    assert _load_processes() == []
