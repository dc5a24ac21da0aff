"""Sandboxed jobs of two projects on one host, through the server (local backend, agents as root): each
job has a PID and an IPC namespace of its own. A job whose command line and environment hold a secret,
and which holds SysV and POSIX IPC objects, is neither seen nor reached by another project's job: not in
its ``/proc``, not by ``ps``, not by ``kill``, not by ``shmget``/``msgget``/``semget``/``mq_open``. An SSH
session into the first job joins its namespaces: it sees the job's processes (and its IPC objects), and
nothing of the host's."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import asyncssh

from server_harness import finished_run, fleet_body, get_run, make_settings, running_server, task_body, wait_for
from skip_policy import needs_root

pytestmark = needs_root("the sandbox needs root (CI runs as root)")

#: Written at run time from pieces, so that no probe's own command line holds it.
SECRET = "pidns-" + "hunter2-token"
KEY = 0x5EC7  # the SysV key of the victim's segment, queue and semaphore set
MQ = "/corral-victim-queue"

# The victim: SysV shared memory, a message queue and a semaphore set, and a POSIX message queue, held
# while it sleeps; the secret in its argv (as `tool --token $HF_TOKEN` puts it there) and in its env.
VICTIM = f"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.mq_open
except AttributeError:
    libc = ctypes.CDLL("librt.so.1", use_errno=True)
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
ids = [libc.shmget({KEY}, 4096, 0o1666), libc.msgget({KEY}, 0o1666), libc.semget({KEY}, 1, 0o1666)]
mq = libc.mq_open({MQ!r}.encode(), os.O_CREAT | os.O_RDWR, 0o666, None)
print("victim", sys.argv[2] == os.environ["VICTIM_TOKEN"], min(ids) >= 0, mq >= 0, flush=True)
time.sleep(600)
"""

# The thief: every process its /proc shows, what `ps` lists, `kill` of the victim's processes (their
# pids on the host, as this test found them), and the victim's IPC objects by their key and name.
THIEF = f"""
import ctypes, os, signal, subprocess, sys
secret = "pidns-" + "hunter2-token"
pids = [p for p in os.listdir("/proc") if p.isdigit()]
seen = 0
for p in pids:
    for f in ("cmdline", "environ"):
        try:
            seen += secret.encode() in open(f"/proc/{{p}}/{{f}}", "rb").read()
        except OSError:
            pass
ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
print("procs", len(pids), "secret-in-proc", seen, "secret-in-ps", secret in ps, "ps-lines", len(ps.splitlines()))
for pid in map(int, sys.argv[1:]):
    try:
        os.kill(pid, signal.SIGKILL)
        print("killed", pid)
    except OSError as e:
        print("kill", pid, e.errno == 3)  # ESRCH: no such process here
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.mq_open
except AttributeError:
    libc = ctypes.CDLL("librt.so.1", use_errno=True)
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
got = [libc.shmget({KEY}, 0, 0), libc.msgget({KEY}, 0), libc.semget({KEY}, 0, 0)]
got.append(libc.mq_open({MQ!r}.encode(), os.O_RDONLY, 0, None))
print("ipc", got)
ipcs = subprocess.run(["ipcs"], capture_output=True, text=True).stdout
print("ipcs-key", "{KEY:#010x}" in ipcs)
"""


def _py(source: str, *args: str) -> str:
    """A shell command running ``source`` (base64: no quoting) with ``args``."""
    b64 = base64.b64encode(source.encode()).decode()
    return f'exec python3 -c "$(echo {b64} | base64 -d)" ' + " ".join(args)


def _host_pids_with(secret: str) -> list[int]:
    """The host's pids of the processes whose command line holds ``secret`` (this test runs as root)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if secret.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                continue
    return found


async def _connect(jpd: dict[str, Any], key: Any, user: str) -> tuple[Any, Any]:
    outer = await asyncssh.connect(
        jpd["hostname"], jpd["ssh_port"], username=jpd["username"], client_keys=[key], known_hosts=None
    )
    inner = await asyncssh.connect("localhost", 10022, tunnel=outer, username=user, client_keys=[key], known_hosts=None)
    return outer, inner


async def test_another_projects_job_sees_and_reaches_nothing_of_a_job(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    async with running_server(make_settings(tmp_path, sandbox="on")) as s, s.client() as c:
        assert (await c.post("/api/projects/create", json={"project_name": "team-b"})).status_code == 200
        r = await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..2"))
        assert r.status_code == 200, r.text
        # the host's local fleet, exported to the second project: its jobs run beside the first's
        share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["fl"]}
        assert (await c.post("/api/project/main/exports/create", json=share)).status_code == 200
        victim = task_body([_py(VICTIM, "--token", "$VICTIM_TOKEN")], name="victim", env={"VICTIM_TOKEN": SECRET})
        victim["plan"]["run_spec"]["ssh_key_pub"] = key.export_public_key().decode()
        assert (await c.post("/api/project/main/runs/apply", json=victim)).status_code == 200

        async def victim_ready() -> dict[str, Any] | None:
            run = await get_run(c, "victim")
            assert run["status"] not in ("failed", "done", "terminated"), run["latest_job_submission"]
            return run if run["status"] == "running" and _host_pids_with(SECRET) else None

        run = await wait_for(victim_ready, timeout=60)
        pids = _host_pids_with(SECRET)
        # the host (root) reads the secret in the victim's argv and env: the thief's refusals are the sandbox's
        assert any(SECRET.encode() in Path(f"/proc/{p}/environ").read_bytes() for p in pids)

        thief = task_body([_py(THIEF, *map(str, pids))], name="thief")
        assert (await c.post("/api/project/team-b/runs/apply", json=thief)).status_code == 200
        done = await finished_run(c, "thief", "team-b")
        logs = await _logs(c, "team-b", "thief", done["latest_job_submission"]["id"])
        sub = done["latest_job_submission"]
        assert done["status"] == "done", (sub["termination_reason_message"], sub["status_message"], logs)
        words = logs.split()
        procs = int(words[words.index("procs") + 1])
        assert procs <= 4, f"the thief's /proc lists only its own processes: {logs}"
        assert words[words.index("secret-in-proc") + 1] == "0", logs
        assert words[words.index("secret-in-ps") + 1] == "False", logs
        assert int(words[words.index("ps-lines") + 1]) <= 4, logs
        for pid in pids:
            assert f"kill {pid} True" in logs, f"no process {pid} in the thief's namespace: {logs}"
        assert "ipc [-1, -1, -1, -1]" in logs, f"the victim's IPC objects are out of reach: {logs}"
        assert "ipcs-key False" in logs, logs
        assert (await get_run(c, "victim"))["status"] == "running"
        assert _host_pids_with(SECRET) == pids, "the victim's processes live on"

        # an SSH session into the victim joins its namespaces: its processes and IPC objects, not the host's
        sub = run["latest_job_submission"]
        jpd, user = sub["job_provisioning_data"], sub["job_runtime_data"]["username"]
        outer, inner = await _connect(jpd, key, user)
        try:
            got = await inner.run(
                f"ps -eo args= | grep -c -- '--tok[e]n'; ls /proc | grep -c '^[0-9]'; ipcs -m | grep -c {KEY:#010x}",
                check=False,
            )
        finally:
            inner.close()
            outer.close()
        lines = str(got.stdout).split()
        assert got.exit_status == 0 and lines[0] == "1", (got.stdout, got.stderr)
        assert int(lines[1]) <= 8, f"the session sees the job's processes, not the host's: {got.stdout}"
        assert lines[2] == "1", f"the session sees the job's IPC objects: {got.stdout}"
        await c.post("/api/project/main/runs/stop", json={"runs_names": ["victim"], "abort": True})
        stopped = await finished_run(c, "victim")
        logs = await _logs(c, "main", "victim", stopped["latest_job_submission"]["id"])
        assert "victim True True True" in logs, f"the victim held its secret and IPC objects: {logs}"
        assert _host_pids_with(SECRET) == []


async def _logs(c: Any, project: str, run_name: str, submission_id: str) -> str:
    r = await c.post(
        f"/api/project/{project}/logs/poll",
        json={"run_name": run_name, "job_submission_id": submission_id, "limit": 1000},
    )
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()
