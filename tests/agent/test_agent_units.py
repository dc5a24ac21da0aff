"""In-process units: protocol validation, GPU name conversion, nvidia-smi parsing, log splitting."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from corral.agent import resources
from corral.agent.logstore import LogStore, split_lines
from corral.agent.protocol import (
    GpuDriver,
    GpuInfo,
    HostInfo,
    JobState,
    JobSubmission,
    LogEntry,
    LogsReply,
    ProtocolError,
)


def test_round_trips() -> None:
    sub = JobSubmission("j", "r", ["a", "b"], shell="bash", env={"A": "1"}, working_dir="w", max_duration=5)
    assert JobSubmission.from_dict(sub.to_dict()) == sub
    st = JobState("j", "done", exit_status=0, started_at=1.0, finished_at=2.0, pid=7)
    reply = LogsReply([LogEntry(1.5, "stderr", b"\xff\x00bytes")], 1, st)
    assert LogsReply.from_dict(reply.to_dict()) == reply
    info = HostInfo("h", 4, 1024, 2048, "arm", [GpuInfo("H100", 81559, "nvidia")], GpuDriver("nvidia", "550"), "docker")
    assert HostInfo.from_dict(info.to_dict()) == info


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"job_id": "", "run_name": "r", "commands": ["x"]}, "job_id"),
        ({"job_id": "j", "run_name": "r", "commands": []}, "commands"),
        ({"job_id": "j", "run_name": "r", "commands": [1]}, "commands"),
        ({"job_id": "j", "run_name": "r", "commands": ["x"], "env": {"A": 1}}, "env"),
        ({"job_id": "j", "run_name": "r", "commands": ["x"], "stop_duration": "5"}, "stop_duration"),
        ({"job_id": "j", "commands": ["x"]}, "run_name"),
    ],
)
def test_submission_validation_names_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        JobSubmission.from_dict(data)


def test_reply_validation() -> None:
    with pytest.raises(ProtocolError, match=r"JobState\.state"):
        JobState.from_dict({"job_id": "j", "state": "exploded"})
    with pytest.raises(ProtocolError, match="message_b64"):
        LogEntry.from_dict({"timestamp": 1.0, "source": "stdout", "message_b64": "!!"})
    with pytest.raises(ProtocolError, match="cpu_arch"):
        HostInfo.from_dict({**HostInfo("h", 1, 1, 1, "x86").to_dict(), "cpu_arch": "mips"})


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA GeForce RTX 3080 Ti", "RTX3080Ti"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000Ada"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA H100 NVL", "H100NVL"),
    ],
)
def test_nvidia_names(raw: str, short: str) -> None:
    assert resources.convert_nvidia_gpu_name(raw) == short


def test_amd_names() -> None:
    assert resources.convert_amd_gpu_name("AMD Instinct MI300X") == "MI300X"
    assert resources.convert_amd_gpu_name("MI300X-O") == "MI300X"


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def test_nvidia_smi_missing_or_failing_means_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert resources.nvidia_gpus() == ([], None)
    _fake(tmp_path / "bin", "nvidia-smi", "echo 'NVIDIA-SMI has failed' ; exit 9\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert resources.nvidia_gpus() == ([], None)
    _fake(tmp_path / "bin", "nvidia-smi", "echo 'NVIDIA A100-SXM4-40GB, 40960, 535.1'; echo 'garbage'\n")
    gpus, driver = resources.nvidia_gpus()
    assert gpus == [GpuInfo("A100", 40960, "nvidia")] and driver == GpuDriver("nvidia", "535.1")


def test_docker_engine_detection(tmp_path: Path) -> None:
    """A socket nobody listens on, or something that is not a Docker engine, is no container runtime."""
    assert resources.container_runtime(f"unix://{tmp_path}/none.sock") is None
    assert resources.container_runtime("ssh://example") is None  # an endpoint kind the agent cannot use
    path = str(tmp_path / "fake.sock")
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(path)
        srv.listen(1)
        t = threading.Thread(target=_answer_once, args=(srv, b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"))
        t.start()
        assert resources.container_runtime(f"unix://{path}") is None
        t.join()
        body = b'{"Version": "27.0.1", "ApiVersion": "1.46"}'
        reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        t = threading.Thread(target=_answer_once, args=(srv, reply))
        t.start()
        assert resources.container_runtime(path) == "docker"  # a bare socket path works too
        t.join()


def _answer_once(srv: socket.socket, reply: bytes) -> None:
    conn, _ = srv.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(reply)


def test_split_lines() -> None:
    buf = bytearray(b"a\nbb\n\xffpartial")
    assert split_lines(buf) == [b"a\n", b"bb\n"] and buf == b"\xffpartial"
    buf = bytearray(b"x" * 70000 + b"\n")
    assert [len(p) for p in split_lines(buf)] == [65536, 70001 - 65536] and not buf


def test_logstore_offsets_and_reopen(tmp_path: Path) -> None:
    store = LogStore(str(tmp_path))
    store.append("stdout", [b"one\n", b"two\n"], 1.0)
    store.append("stderr", [b"\xfferr\n"], 2.0)
    assert [e.message for e in store.read(1, 10)] == [b"two\n", b"\xfferr\n"]
    assert store.read(3, 10) == [] and store.read(0, 1)[0].source == "stdout"
    store.close()
    with open(os.path.join(tmp_path, "logs.idx"), "ab") as f:
        f.write(b"torn")  # a partial record from a crash is dropped on reopen
    again = LogStore(str(tmp_path))
    assert again.count == 3 and again.read(2, 1)[0] == LogEntry(2.0, "stderr", b"\xfferr\n")
    again.close()


def test_a_jobs_state_is_rewritten_in_place_as_one_page_while_it_fits_one(tmp_path: Path) -> None:
    import json

    from corral.agent.job import STATE_PAGE, Job

    job = Job(str(tmp_path), JobSubmission("j", "r", ["true"]), JobState(job_id="j", state="pending"))
    path = tmp_path / "state.json"
    job.persist()
    inode = path.stat().st_ino
    for state, message in (("running", "a much longer message than the one before it " * 20), ("done", None)):
        job.state.state, job.state.message = state, message
        job.persist()
        assert path.stat().st_ino == inode, "no new file per change"
        assert path.stat().st_size == STATE_PAGE
        assert JobState.from_dict(json.loads(path.read_text())) == job.state, "a shorter state over a longer one"
    job.state.message = "x" * STATE_PAGE  # larger than a page: a new file, renamed over the old one
    job.persist()
    assert path.stat().st_ino != inode and json.loads(path.read_text())["message"] == "x" * STATE_PAGE
    job.state.message = "short again"
    job.persist()
    assert json.loads(path.read_text())["message"] == "short again", "a larger file is never written over in part"
    # a job read back at a start, whose file is larger than a page (written so before): a new file too
    again = Job(str(tmp_path), job.sub, JobState.from_dict(json.loads(path.read_text())))
    path.write_text(json.dumps(job.state.to_dict()) + " " * (2 * STATE_PAGE))
    again.state.state = "failed"
    again.persist()
    assert json.loads(path.read_text())["state"] == "failed"
