"""An agent started with ``--endpoint-file`` (as in a Slurm allocation): it picks its own token, writes
``{url, token}`` (0600, atomically) once it listens, runs jobs unsandboxed, and on SIGTERM stops them and exits,
removing the file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the agent exited: {proc.stderr.read() if proc.stderr else b''!r}"
        assert time.monotonic() < deadline, "no endpoint file"
        time.sleep(0.05)


def test_endpoint_file_token_and_sigterm(tmp_path: Path) -> None:
    endpoint = tmp_path / "endpoints" / "1234" / "node1.json"
    cmd = [sys.executable, "-m", "corral.agent", "serve", "--work-dir", str(tmp_path / "w"), "--host", "127.0.0.1"]
    cmd += ["--sandbox", "off", "--endpoint-file", str(endpoint)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(endpoint, proc)
        assert endpoint.stat().st_mode & 0o777 == 0o600
        assert not [p for p in endpoint.parent.iterdir() if p.name.endswith(".tmp")]
        data = json.loads(endpoint.read_text())
        assert data["url"].startswith("http://127.0.0.1:") and len(data["token"]) >= 32
        http = httpx.Client(base_url=data["url"], headers={"Authorization": f"Bearer {data['token']}"}, timeout=20)
        assert httpx.get(data["url"] + "/info", timeout=20).status_code in (401, 403)
        body = {"job_id": "j1", "run_name": "r", "commands": ["trap 'echo got-term; exit 0' TERM; echo up; sleep 60"]}
        assert http.post("/jobs", json=body).status_code == 200
        deadline = time.monotonic() + 15
        while http.get("/jobs/j1").json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)  # what Slurm sends when the allocation ends
        assert proc.wait(timeout=30) == 0
        assert not endpoint.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_no_token_and_no_endpoint_file_is_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "corral.agent", "serve", "--work-dir", str(tmp_path / "w")]
    out = subprocess.run(cmd, capture_output=True, timeout=30)
    assert out.returncode == 2 and b"--token-file" in out.stderr
