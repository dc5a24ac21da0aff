"""A sandboxed job's PID and IPC namespaces: the job sees its own processes only (``/proc``, ``ps``), its
init (PID 1) reaps orphans and keeps its memory to itself, the agent's signals to the job's process group
reach the job and its exit status or signal comes back, whatever the job leaves running ends with it (also
when only the launcher is killed), and the agent's bookkeeping from the host (``reap_group``, the process
tree that metrics read) still finds the job's processes. Real sandboxes: needs root (CI runs as root)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent import metrics, procs, sandbox
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


def _launch(sbs: sandbox.Sandboxes, tmp_path: Path, name: str, script: str, **env: str) -> tuple[Any, Any]:
    job_dir = tmp_path / name
    for d in ("workdir/workflow", "workdir/tmp", "root"):
        (job_dir / d).mkdir(parents=True)
    binds = {"/workflow": str(job_dir / "workdir/workflow"), "/tmp": str(job_dir / "workdir/tmp")}
    sb = sbs.open(name, [])
    sandbox.chown_tree(str(job_dir / "workdir"), sb.uid)
    inside = (0, 0) if sb.userns else None
    argv = ["/bin/sh", "-c", script]
    launched = sbs.launcher.launch(
        sb, argv, "/workflow", binds, str(job_dir / "root"), inside, {"PATH": "/usr/bin:/bin", **env}, str(job_dir)
    )
    return launched, sb


def _host_pids(pgid: int) -> list[int]:
    """The host's pids of the live processes in the job's process group (this test runs as root)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(name))
    return found


def test_a_job_sees_its_own_processes_only(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    script = "echo pid=$$; ls /proc | grep -c '^[0-9]'; ps -eo pid=,comm="
    script += "; cat /proc/1/environ >/dev/null || echo no-init-env"
    launched, sb = _launch(sbs, tmp_path, "own", script, JOB_SECRET="hunter2")
    assert launched.proc.wait(10) == 0
    out = launched.proc.stdout.read().decode()
    lines = out.splitlines()
    assert lines[0] == "pid=2", out  # its init is PID 1
    host = sum(1 for p in os.listdir("/proc") if p.isdigit())
    assert int(lines[1]) <= 4 < host, f"the job's /proc lists its own processes, not the host's {host}: {out}"
    listed = [line.split() for line in lines[2:-1]]
    assert listed[0] == ["1", "corral-init"] and listed[1] == ["2", "sh"] and len(listed) <= 4, out
    assert lines[-1] == "no-init-env", "the init's memory (its environment: the agent's) is not the job's to read"
    sbs.close(sb)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_ps_shows_the_init_as_corral_init_and_the_fork_server_keeps_its_command_line(
    sbs: sandbox.Sandboxes, tmp_path: Path
) -> None:
    # `ps -ef` reads each process's command line (/proc/<pid>/cmdline): the init's is its own name, not the
    # fork server's `python3 -I -S -c <source>`; the job's own processes are listed as they are
    script = "cat /proc/1/cmdline >/workflow/init-cmdline; ps -ef; echo ready; sleep 30"
    launched, sb = _launch(sbs, tmp_path, "title", script)
    assert launched.proc.stdout.readline().split()[-1] == b"CMD"
    listed = {}
    while (line := launched.proc.stdout.readline().decode()) != "ready\n":
        assert line, "the job's ps ended its listing"
        fields = line.split(None, 7)
        listed[fields[1]] = fields[7].strip()
    assert (tmp_path / "title/workdir/workflow/init-cmdline").read_bytes() == b"corral-init\0"
    assert listed.pop("1") == "corral-init", listed
    assert set(listed.values()) <= {f"/bin/sh -c {script}", "ps -ef"}, f"the job's processes only: {listed}"
    # from the host too; and the fork server, the init's parent, keeps its own command line
    assert Path(f"/proc/{launched.init_pid}/cmdline").read_bytes() == b"corral-init\0"
    server = Path(f"/proc/{_ppid(launched.init_pid)}/cmdline").read_bytes().split(b"\0")
    assert server[1:4] == [b"-I", b"-S", b"-c"] and server[5] == b"--serve", server[:4]
    launched.proc.kill()
    assert launched.proc.wait(10) == -signal.SIGKILL
    sbs.close(sb)


def test_the_init_reaps_orphans(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    # a grandchild whose parent exits is the init's to reap: no zombie stays in the namespace
    script = "sh -c 'sleep 0.2 & exit 0'; sleep 1; ps -eo stat= | grep -c '^Z' || true"
    launched, sb = _launch(sbs, tmp_path, "orphans", script)
    assert launched.proc.wait(10) == 0
    assert launched.proc.stdout.read().decode().split() == ["0"]
    sbs.close(sb)


def test_the_agents_signals_reach_the_job_and_its_status_comes_back(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    launched, sb = _launch(sbs, tmp_path, "trap", "trap 'echo got-term; exit 9' TERM; echo ready; sleep 30 & wait")
    assert launched.proc.stdout.readline() == b"ready\n"
    assert procs.signal_group(launched.proc.pid, signal.SIGTERM)  # the agent's stop
    assert launched.proc.wait(10) == 9
    assert launched.proc.stdout.read() == b"got-term\n"
    sbs.close(sb)
    launched, sb = _launch(sbs, tmp_path, "plain", "echo ready; exec sleep 30")
    assert launched.proc.stdout.readline() == b"ready\n"
    assert procs.signal_group(launched.proc.pid, signal.SIGTERM)
    assert launched.proc.wait(10) == -signal.SIGTERM  # killed by the signal, as the job's command was
    sbs.close(sb)


def test_what_a_job_leaves_running_ends_with_it(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    launched, sb = _launch(sbs, tmp_path, "leaves", "setsid sleep 300 & sleep 300 & echo ready; exit 3")
    assert launched.proc.stdout.readline() == b"ready\n"
    assert launched.proc.wait(10) == 3
    deadline = time.monotonic() + 5
    while _host_pids(launched.proc.pid) or os.path.exists(f"/proc/{launched.init_pid}"):
        assert time.monotonic() < deadline, "the job's namespace ends with its command"
        time.sleep(0.05)
    sbs.close(sb)


def test_killing_the_launcher_alone_ends_the_job(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    launched, sb = _launch(sbs, tmp_path, "orphaned", "echo ready; sleep 300")
    assert launched.proc.stdout.readline() == b"ready\n"
    launched.proc.kill()  # SIGKILL to the launcher's pid only: its init dies with it, and the namespace
    assert launched.proc.wait(10) == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while _host_pids(launched.proc.pid):
        assert time.monotonic() < deadline, "nothing of the job outlives its launcher"
        time.sleep(0.05)
    sbs.close(sb)


def test_the_agents_bookkeeping_from_the_host_finds_the_jobs_processes(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    launched, sb = _launch(sbs, tmp_path, "busy", "echo ready; while :; do :; done")
    assert launched.proc.stdout.readline() == b"ready\n"
    time.sleep(0.5)
    table = metrics.ProcTable()
    members = _host_pids(launched.proc.pid)
    assert launched.init_pid in members and set(members) <= set(table.tree(launched.proc.pid))
    usage = table.usage(launched.proc.pid, (launched.proc.pid, launched.init_pid))
    assert usage is not None and usage[0] > 0, "the job's CPU, from the host's /proc"
    job_pages = sum(table.rss[p] for p in members if p not in (launched.proc.pid, launched.init_pid))
    assert usage[1] == job_pages * os.sysconf("SC_PAGE_SIZE"), "its memory: the job's processes', not its init's"
    assert procs.reap_group(launched.proc.pid, time.time() - 60) >= 2  # its init and its shell
    assert launched.proc.wait(10) == -signal.SIGKILL
    sbs.close(sb)


def _segments() -> set[tuple[str, str]]:
    """The (key, shmid) of every System V segment this namespace holds: other processes of the machine may attach
    to theirs meanwhile, which changes the other columns but never this set."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {(f[0], f[1]) for f in (line.split() for line in lines) if len(f) > 1}


def test_a_jobs_ipc_objects_are_its_own(sbs: sandbox.Sandboxes, tmp_path: Path) -> None:
    before = _segments()  # the host's segments (this test's IPC namespace)
    script = "ipcmk -M 4096 >/dev/null && ipcs -m | grep -c '^0x'; echo ready; sleep 30"
    launched, sb = _launch(sbs, tmp_path, "ipc", script)
    assert launched.proc.stdout.readline() == b"1\n", "the job sees the segment it made, and only it"
    assert launched.proc.stdout.readline() == b"ready\n"
    assert _segments() == before, "the host sees none of the job's segments"
    launched.proc.kill()
    assert launched.proc.wait(10) == -signal.SIGKILL
    sbs.close(sb)
