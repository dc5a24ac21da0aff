"""Harness for the host-agent tests: start real ``python -m corral.agent serve`` processes.

Every agent runs in its own session; :func:`cleanup` aborts its jobs, kills the agent's process
group and then reaps every job's process group recorded under the work dir, so no test leaves a
process behind even when it killed the agent on purpose.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from corral.agent import procs

TOKEN = "s3cret-token"


class AgentProc:
    def __init__(self, proc: subprocess.Popen[bytes], work_dir: Path, port: int, log_path: Path) -> None:
        self.proc = proc
        self.work_dir = work_dir
        self.port = port
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=40)

    # -- helpers --------------------------------------------------------------------------------
    def submit(self, job_id: str, commands: list[str], **fields: Any) -> dict[str, Any]:
        body = {"job_id": job_id, "run_name": "test-run", "commands": commands, **fields}
        r = self.http.post("/jobs", json=body)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def state(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def wait_finished(self, job_id: str, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state(job_id)
            if st["state"] in ("done", "failed", "terminated"):
                return st
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} did not finish: {self.state(job_id)}")

    def wait_running(self, job_id: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state(job_id)
            if st["state"] != "pending":
                return st
            time.sleep(0.02)
        raise AssertionError(f"job {job_id} did not start")

    def output(self, job_id: str, source: str | None = None) -> bytes:
        """All output of a finished job (pages through the log): stdout and stderr, or the one ``source``
        names (``agent``: the agent's own lines about the job)."""
        out = bytearray()
        offset = 0
        while True:
            r = self.http.get(f"/jobs/{job_id}/logs", params={"offset": offset, "limit": 10000})
            assert r.status_code == 200, r.text
            reply = r.json()
            for e in reply["entries"]:
                if e["source"] == source or (source is None and e["source"] != "agent"):
                    out += base64.b64decode(e["message_b64"])
            if not reply["entries"]:
                return bytes(out)
            offset = reply["next_offset"]

    def started_offset(self, job_id: str, timeout: float = 10.0) -> int:
        """The log offset after the agent's own lines about the job's start: where its output begins."""
        deadline = time.monotonic() + timeout
        offset = 0
        while True:
            reply = self.http.get(f"/jobs/{job_id}/logs", params={"offset": offset}).json()
            for e in reply["entries"]:
                offset += 1
                if e["source"] == "agent" and base64.b64decode(e["message_b64"]).startswith(b"Process started"):
                    return offset
            assert time.monotonic() < deadline, f"job {job_id} did not start"
            time.sleep(0.02)

    def job_dir(self, job_id: str) -> Path:
        return self.work_dir / "jobs" / job_id

    def vm_kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)

    def close(self) -> None:
        self.http.close()


def start_agent(
    work_dir: Path,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
    timeout: float = 10.0,
    sandbox: str = "off",
    extra: list[str] | None = None,
    preexec: list[str] | None = None,
) -> AgentProc:
    """An agent on ``work_dir``; ``sandbox`` is its ``--sandbox`` mode (the plain host-process runner by
    default: the sandbox has tests of its own), ``preexec`` a command prefix (e.g. ``setpriv ...``)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    token_file = work_dir.parent / f"{work_dir.name}.token"
    token_file.write_text(TOKEN + "\n")
    port_file = work_dir / "agent.port"
    if port_file.exists():
        port_file.unlink()
    log_path = work_dir.parent / f"{work_dir.name}.agent.log"
    cmd = argv or [sys.executable, "-m", "corral.agent"]
    full_env = dict(os.environ)
    full_env.update(env or {})
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                *(preexec or []),
                *cmd,
                "serve",
                "--work-dir",
                str(work_dir),
                "--token-file",
                str(token_file),
                "--sandbox",
                sandbox,
                *(extra or []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=full_env,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists():
            return AgentProc(proc, work_dir, int(port_file.read_text()), log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"agent did not start: {log_path.read_text()}")


def cleanup(agent: AgentProc) -> None:
    if agent.proc.poll() is None:
        try:
            for st in agent.http.get("/jobs", timeout=2).json():
                if st["state"] == "running":
                    agent.http.post(f"/jobs/{st['job_id']}/stop", json={"abort": True}, timeout=2)
        except (httpx.HTTPError, ValueError):
            pass
    agent.close()
    try:
        os.killpg(agent.proc.pid, signal.SIGKILL)
    except OSError:
        pass
    agent.proc.wait(5)
    for state_file in (agent.work_dir / "jobs").glob("*/state.json"):
        try:
            st = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if st.get("pid"):
            procs.reap_group(st["pid"], st.get("started_at"))
