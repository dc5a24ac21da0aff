"""The launcher's fork server: sandboxed jobs are forks of one launcher process per agent (not a fresh
interpreter each), which is their parent and reports their ends; a job's exit code, a signal's death, the
signals' defaults, the server's own death and the fallback when it cannot start. Real sandboxes: needs root
(CI runs as root)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent import launcher_server, sandbox
from skip_policy import needs_root

pytestmark = needs_root("the sandbox needs root (CI runs as root)")


@pytest.fixture
def sbs(tmp_path: Path) -> Iterator[sandbox.Sandboxes]:
    (tmp_path / "agent").mkdir()  # an agent's work dir that is gone would have its slots reaped by others
    s = sandbox.Sandboxes(str(tmp_path / "agent"), sandbox.SandboxConfig(mode="on"))
    assert s.available, s.reason
    yield s
    s.launcher.close()
    s.cancel_bridge_check()
    s.reap(set())


def _launch(sbs: sandbox.Sandboxes, tmp_path: Path, name: str, script: str) -> tuple[Any, sandbox.JobSandbox]:
    job_dir = tmp_path / name
    for d in ("workdir/workflow", "workdir/tmp", "root"):
        (job_dir / d).mkdir(parents=True)
    binds = {"/workflow": str(job_dir / "workdir/workflow"), "/tmp": str(job_dir / "workdir/tmp")}
    sb = sbs.open(name, [])
    sandbox.chown_tree(str(job_dir / "workdir"), sb.uid)
    inside = (0, 0) if sb.userns else None
    env = {"PATH": "/usr/bin:/bin"}
    argv = ["/bin/sh", "-c", script]
    launched = sbs.launcher.launch(sb, argv, "/workflow", binds, str(job_dir / "root"), inside, env, str(job_dir))
    return launched.proc, sb


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_jobs_are_forks_of_one_server_that_reports_their_exit_codes(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    parents = set()
    for i, code in enumerate((0, 3, 7)):
        proc, sb = _launch(sbs, tmp_path, f"job{i}", f"sleep 0.3; exit {code}")
        assert isinstance(proc, launcher_server.Child)
        parents.add(_ppid(proc.pid))
        assert proc.wait(10) == code
        assert proc.stdout is not None and proc.stdout.read() == b""
        sbs.close(sb)
    assert len(parents) == 1 and os.getpid() not in parents, "every job is a child of the one fork server"


def test_a_job_killed_by_a_signal_and_the_signals_it_starts_with(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    # Python ignores SIGPIPE for itself; the job must not inherit that (`yes | head` would report EPIPE)
    proc, sb = _launch(sbs, tmp_path, "sigs", "grep SigIgn /proc/self/status; exec sleep 30")
    assert proc.stdout is not None
    ignored = int(proc.stdout.readline().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), f"the job starts with SIGPIPE ignored ({ignored:#x})"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    sbs.close(sb)


def test_a_job_outliving_its_fork_server_ends_lost_and_the_next_job_gets_a_new_server(
    sbs: sandbox.Sandboxes, tmp_path: Path
) -> None:
    proc, sb = _launch(sbs, tmp_path, "orphan", "exec sleep 30")
    server = _ppid(proc.pid)
    os.kill(server, signal.SIGKILL)
    assert proc.wait(10) == launcher_server.LOST
    os.killpg(proc.pid, signal.SIGKILL)
    sbs.close(sb)
    again, sb2 = _launch(sbs, tmp_path, "after", "sleep 0.5; exit 5")
    assert _ppid(again.pid) != server
    assert again.wait(10) == 5
    sbs.close(sb2)


def test_without_a_fork_server_the_launcher_runs_as_a_process_of_its_own(
    sbs: sandbox.Sandboxes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: launcher_server.LauncherServer) -> None:
        raise launcher_server.Unavailable("no fork server here")

    monkeypatch.setattr(launcher_server.LauncherServer, "_start", refuse)
    proc, sb = _launch(sbs, tmp_path, "fallback", "echo from-fallback; exit 4")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(10) == 4
    assert proc.stdout is not None and proc.stdout.read() == b"from-fallback\n"
    sbs.close(sb)
    # its init shows as `corral-init` in the job's `ps -ef`, not as the launcher's command line (which holds the spec)
    proc, sb = _launch(sbs, tmp_path, "fallback-title", "cat /proc/1/cmdline; echo; ps -eo args=")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(10) == 0
    assert proc.stdout is not None
    init, listed = proc.stdout.read().split(b"\n", 1)
    assert init == b"corral-init\0" and listed.splitlines()[0] == b"corral-init", (init, listed)
    sbs.close(sb)


def test_a_job_that_cannot_start_fails_with_the_launchers_words(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    job_dir = tmp_path / "bad"
    (job_dir / "root").mkdir(parents=True)
    sb = sbs.open("bad", [])
    inside = (0, 0) if sb.userns else None
    t0 = time.monotonic()
    with pytest.raises(sandbox.SandboxError, match="no-such-dir"):
        sbs.launcher.launch(sb, ["/bin/true"], "/no-such-dir", {}, str(job_dir / "root"), inside, {}, str(job_dir))
    assert time.monotonic() - t0 < 10
    sbs.close(sb)


def test_a_jobs_command_has_its_own_environment_and_is_found_on_its_own_path(
    sbs: sandbox.Sandboxes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_AGENT_ONLY", "1")  # the agent's (and its fork server's), never a job's
    job_dir = tmp_path / "envjob"
    for d in ("workdir/workflow/bin", "workdir/tmp", "root"):
        (job_dir / d).mkdir(parents=True)
    tool = job_dir / "workdir/workflow/bin/job-only-tool"  # on the job's PATH, not on the agent's
    tool.write_text("#!/bin/sh\nexec env\n")
    tool.chmod(0o755)
    binds = {"/workflow": str(job_dir / "workdir/workflow"), "/tmp": str(job_dir / "workdir/tmp")}
    sb = sbs.open("envjob", [])
    sandbox.chown_tree(str(job_dir / "workdir"), sb.uid)
    env = {"PATH": "/workflow/bin:/usr/bin:/bin", "JOB_ONLY": "yes"}
    inside = (0, 0) if sb.userns else None
    launched = sbs.launcher.launch(
        sb, ["job-only-tool"], "/workflow", binds, str(job_dir / "root"), inside, env, str(job_dir)
    )
    proc = launched.proc
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    assert proc.wait(10) == 0, out
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert seen.get("JOB_ONLY") == "yes" and seen.get("PATH") == env["PATH"]
    assert "CORRAL_TEST_AGENT_ONLY" not in seen, "the agent's environment leaked into the job's"
    sbs.close(sb)
