"""The job sandbox through a real agent running as root: network namespaces on corral's bridge, port
relays, the job's paths at their absolute places over a read-only host, a uid per job, and nothing left
behind -- also after ``kill -9`` of the agent. The non-root fallback runs the agent as ``nobody``."""

from __future__ import annotations

import hashlib
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
from typing import Any

import httpx
import pytest
from agent_harness import AgentProc, cleanup, start_agent

from corral.agent import procs, sandbox, sandbox_net
from corral.agent.zipapp import build_zipapp
from skip_policy import needs_root

pytestmark = needs_root("the sandbox needs root (CI runs as root)")

BRIDGE = "corral0"


def _job_command(pgid: int) -> int:
    """The host's pid of the job's command: PID 2 of its namespace (its init is PID 1), in the job's group."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                status = Path(f"/proc/{name}/status").read_text().splitlines()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            nspid = next((line.split()[1:] for line in status if line.startswith("NSpid:")), [])
            if int(fields[2]) == pgid and nspid == [name, "2"]:  # its pid on the host, then in its namespace
                return int(name)
    raise AssertionError(f"no command in the job's process group {pgid}")


def _put(agent: AgentProc, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    assert agent.http.put(f"/blobs/{digest}", content=data).status_code == 200
    return digest


def _sandbox_netns() -> list[str]:
    return (
        [n for n in os.listdir(sandbox_net.NETNS_DIR) if n.startswith("corral-s")]
        if os.path.isdir("/run/netns")
        else []
    )


def _slot_records() -> dict[int, str]:
    """The host's sandbox slots and the work dir of the agent holding each."""
    slots, out = Path(sandbox.DEFAULT_STATE_DIR) / "slots", {}
    for f in slots.glob("*.json") if slots.is_dir() else []:
        try:
            out[int(f.stem)] = str(json.loads(f.read_text()).get("work_dir", ""))
        except (OSError, ValueError):
            continue
    return out


def _left_over(root: Path) -> list[str]:
    """What the agents under ``root`` left on the host. The bridge, its NAT rules and the slots are shared by
    every agent of the host, so they count only once no other agent (a test beside this one) holds a slot."""
    netns, veths = set(_sandbox_netns()), {n for n in os.listdir("/sys/class/net") if n.startswith("crv")}
    records = _slot_records()
    mine = sorted(n for n, wd in records.items() if wd.startswith(str(root)))
    others = {n for n in records if n not in mine}
    left = [f"slot {n}" for n in mine]
    left += sorted(netns - {sandbox_net.netns_name(n) for n in others})
    left += sorted(veths - {sandbox_net.veth_name(n) for n in others})
    if not others:
        if os.path.exists(f"/sys/class/net/{BRIDGE}"):
            left.append(f"the bridge {BRIDGE} (it outlived the last job)")
        if "corral-sandbox" in subprocess.run(["iptables-save"], capture_output=True, text=True).stdout:
            left.append("the corral-sandbox NAT rules")
    return left


def _own_netns(root: Path) -> list[str]:
    netns = set(_sandbox_netns())
    return [sandbox_net.netns_name(n) for n, wd in _slot_records().items() if wd.startswith(str(root))
            if sandbox_net.netns_name(n) in netns]  # fmt: skip


def _nothing_left(root: Path) -> None:
    deadline = time.monotonic() + 5
    while (left := _left_over(root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


@pytest.fixture
def sandboxed(tmp_path: Path) -> Iterator[Any]:
    started: list[AgentProc] = []

    def factory(name: str = "agent", **kw: Any) -> AgentProc:
        a = start_agent(tmp_path / name, sandbox="on", extra=["--hide", str(tmp_path / "server")], **kw)
        started.append(a)
        return a

    yield factory
    # A job's end releases its sandbox, and the host's last sandbox the bridge, once the job is seen finished:
    # the agents stay up until that is done (or 5 s), then are killed, and nothing may be left either way.
    for a in started:
        _stop_jobs(a)
    deadline = time.monotonic() + 5
    while _left_over(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    for a in started:
        cleanup(a)
    _nothing_left(tmp_path)


def _stop_jobs(agent: AgentProc) -> None:
    """Abort the agent's unfinished jobs and wait (5 s at most) until each is finished."""
    try:
        for st in agent.http.get("/jobs", timeout=2).json():
            if not st.get("finished_at") and st["state"] in ("pending", "running"):
                agent.http.post(f"/jobs/{st['job_id']}/stop", json={"abort": True}, timeout=2)
                agent.wait_finished(st["job_id"], timeout=5)
    except Exception:  # a dead or wedged agent: cleanup() deals with it
        pass


def test_two_jobs_on_one_port_each_reached_through_the_agent(sandboxed: Any) -> None:
    agent = sandboxed()
    states = {}
    for name in ("one", "two"):
        states[name] = agent.submit(
            name, [f"echo {name} > index.html", "exec python3 -m http.server 8000"], ports=[8000]
        )
    for name, st in states.items():
        info = st["sandbox"]
        assert info["address"].startswith("10.247.") and info["uid"] >= 200000, info
        port = info["ports"]["8000"]
        deadline = time.monotonic() + 30  # the job starting its server on a loaded machine
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/index.html", timeout=2).text == f"{name}\n"
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert states["one"]["sandbox"]["address"] != states["two"]["sandbox"]["address"]
    assert states["one"]["sandbox"]["uid"] != states["two"]["sandbox"]["uid"]
    for name in states:
        agent.http.post(f"/jobs/{name}/stop", json={})
        agent.wait_finished(name)
        assert agent.http.delete(f"/jobs/{name}").status_code == 200


def _get_until(url: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return httpx.get(url, timeout=2).text
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _mac_at(address: str) -> str | None:
    """The MAC of the sandbox namespace's ``eth0`` that holds ``address``."""
    for ns in _sandbox_netns():
        out = subprocess.run(["ip", "-n", ns, "-o", "addr", "show", "eth0"], capture_output=True, text=True).stdout
        if f" {address}/" in out:
            link = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "eth0"], capture_output=True, text=True)
            return link.stdout.split("link/ether ")[1].split()[0]
    return None


def test_the_next_job_at_a_reused_address_is_reached_at_once(sandboxed: Any) -> None:
    """A slot's address goes to the next job. The host's neighbour entry for it outlives the previous
    job's veth; the next job's MAC is fixed by the address, so its port answers as soon as it listens
    (with a new random MAC it stayed unreachable until the entry expired, about 30 s)."""
    agent = sandboxed()
    addresses = []
    for name in ("first", "second"):
        st = agent.submit(name, [f"echo {name} > index.html", "exec python3 -m http.server 8000"], ports=[8000])
        info = st["sandbox"]
        addresses.append(info["address"])
        assert _mac_at(info["address"]) == sandbox_net.job_mac(info["address"])
        # 30 s for the first (a loaded machine starting Python); the second must answer well before the
        # neighbour entry of the first would have expired.
        text = _get_until(f"http://127.0.0.1:{info['ports']['8000']}/index.html", 30 if name == "first" else 8)
        assert text == f"{name}\n"
        agent.http.post(f"/jobs/{name}/stop", json={})
        agent.wait_finished(name)
        assert agent.http.delete(f"/jobs/{name}").status_code == 200
    assert sandbox_net.job_mac("10.247.0.2") == "02:cc:0a:f7:00:02"


#: Listens on 127.0.0.1:7000, takes one connection of its own and closes it first: the port is left in
#: TIME_WAIT in the job's namespace after the job has ended.
_LEAVES_TIME_WAIT = (
    'python3 -c \'import socket; s = socket.socket(); s.bind(("127.0.0.1", 7000)); s.listen(); '
    'c = socket.create_connection(("127.0.0.1", 7000)); a, _ = s.accept(); a.close(); c.recv(1); c.close()\''
)


def test_a_jobs_network_serves_the_next_job_only_when_the_job_left_no_socket_in_it(sandboxed: Any) -> None:
    """A job that left its namespace quiet hands it to the agent's next job (no namespace made or removed: the
    kernel's cleanup of one is most of a short job's cost); one that left a port in TIME_WAIT does not: the
    next job gets a fresh namespace, where it binds that port at once."""
    agent = sandboxed()

    def netns_of(job_id: str, commands: list[str]) -> str:
        agent.submit(job_id, [*commands, "readlink /proc/self/ns/net"])
        st = agent.wait_finished(job_id, timeout=30)
        assert st["state"] == "done", (st, agent.output(job_id))
        out = agent.output(job_id).decode().split()
        assert agent.http.delete(f"/jobs/{job_id}").status_code == 200
        return str(out[-1])

    first = netns_of("quiet-1", ["true"])
    second = netns_of("quiet-2", ["true"])
    assert first.startswith("net:[") and second == first, "a job that left no socket hands its namespace on"
    third = netns_of("time-wait", [_LEAVES_TIME_WAIT])
    assert third == first, "the namespace is the one handed on"
    # the port is free for the next job (its bind, without SO_REUSEADDR, fails in a namespace with the port
    # in TIME_WAIT: the job would fail)
    netns_of("after-time-wait", ["python3 -c 'import socket; socket.socket().bind((\"127.0.0.1\", 7000))'"])


def test_paths_at_their_absolute_places_over_a_read_only_host(sandboxed: Any, tmp_path: Path) -> None:
    from corral.cli.repo_code import file_archive

    agent = sandboxed()
    (tmp_path / "data.txt").write_text("payload\n")
    blob = _put(agent, file_archive(tmp_path / "data.txt"))
    agent.submit(
        "paths",
        [
            "pwd",
            'echo "$HOME $DSTACK_WORKING_DIR $DSTACK_REPO_DIR"',
            "cat /tmp/x/data.txt",
            "cat /opt/corral-test/data.txt",
            "id -u",
            "touch /usr/corral-test 2>&1 || true",
            "echo w > /workflow/out.txt && echo w > ~/home.txt && echo t > /tmp/t.txt && echo ok-writes",
            "ls /tmp",
        ],
        file_archives=[{"hash": blob, "path": "/tmp/x/data.txt"}, {"hash": blob, "path": "/opt/corral-test/data.txt"}],
    )
    st = agent.wait_finished("paths")
    out = agent.output("paths").decode()
    assert st["state"] == "done", (st, out)
    lines = out.splitlines()
    assert lines[0] == "/workflow"
    assert lines[1] == "/root /workflow /workflow"
    assert lines[2] == lines[3] == "payload"
    assert lines[4] == "0"  # root in its user namespace, as in a container; its uid of its own outside
    assert "Read-only file system" in lines[5]
    assert "ok-writes" in out
    assert lines[-2:] == ["t.txt", "x"]  # the job's own /tmp
    assert not Path("/opt/corral-test").exists() and not Path("/usr/corral-test").exists()
    out_file = agent.job_dir("paths") / "workdir" / "workflow" / "out.txt"
    assert out_file.read_text() == "w\n" and out_file.stat().st_uid == st["sandbox"]["uid"]


def test_instance_volumes_are_bind_mounted(sandboxed: Any, tmp_path: Path) -> None:
    agent = sandboxed()
    shared = tmp_path / "shared-volume"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "in.txt").write_text("from the host\n")
    missing = tmp_path / "created-volume"
    volumes = [
        {"instance_path": str(shared), "path": "/data"},
        {"instance_path": str(missing), "path": "/workflow/cache"},
        {"instance_path": str(tmp_path / "absent"), "path": "/opt/absent", "optional": True},
    ]
    agent.submit("vol", ["cat /data/in.txt", "echo out > /data/out.txt", "ls -d /workflow/cache"], volumes=volumes)
    st = agent.wait_finished("vol")
    assert st["state"] == "done", (st, agent.output("vol"))
    assert agent.output("vol") == b"from the host\n/workflow/cache\n"
    assert (shared / "out.txt").read_text() == "out\n" and missing.is_dir()
    assert not (tmp_path / "absent").exists()


def test_a_sandboxed_job_reads_its_deadline_in_its_tmp(sandboxed: Any) -> None:
    agent = sandboxed()
    trap = 'trap \'echo "$CORRAL_PREEMPTION_FILE"; cat "$CORRAL_PREEMPTION_FILE"; exit 0\' TERM'
    agent.submit("preempt", [trap, "echo ready", "while true; do sleep 0.1; done"])
    agent.http.get("/jobs/preempt/logs", params={"wait": 5, "offset": agent.started_offset("preempt")})
    agent.http.post("/jobs/preempt/stop", json={"deadline": 2_000_000_000, "message": "Preempted by run high"})
    agent.wait_finished("preempt")
    # (bash may print "Terminated" for its foreground sleep, killed by the same SIGTERM, between the lines)
    lines = [x for x in agent.output("preempt").decode().splitlines() if x != "Terminated"]
    assert lines[1:] == [
        "/tmp/corral-preemption",
        "CORRAL_PREEMPTION_DEADLINE=2000000000",
        "CORRAL_PREEMPTION_MESSAGE='Preempted by run high'",
    ], lines


def test_user_maps_inside_the_namespace(sandboxed: Any) -> None:
    agent = sandboxed()
    agent.submit("as-nobody", ["id -un", "id -u", "cat /proc/self/uid_map"], user="nobody")
    agent.submit("no-such-user", ["true"], user="no-such-user-xyz")
    st = agent.wait_finished("as-nobody")
    out = agent.output("as-nobody").decode().split()
    assert st["state"] == "done" and out[:2] == ["nobody", "65534"], (st, out)
    assert out[2:] == ["65534", str(st["sandbox"]["uid"]), "1"]  # nobody inside, the job's own uid outside
    bad = agent.wait_finished("no-such-user")
    assert bad["state"] == "failed" and "there is no user 'no-such-user-xyz' on this host" in bad["message"]


def test_secrets_of_the_server_the_agent_and_other_jobs_are_refused(sandboxed: Any, tmp_path: Path) -> None:
    server = tmp_path / "server"
    server.mkdir()
    (server / "corral.db").write_text("users and tokens")
    (server / "corral.db").chmod(0o644)
    agent = sandboxed()
    token_copy = agent.work_dir / "agent.token"  # where the local backend keeps it
    token_copy.write_text("s3cret-token\n")
    agent.submit("victim", ["echo private > /workflow/mine.txt", "sleep 60"], env={"VICTIM_SECRET": "hunter2"})
    victim = agent.wait_running("victim")
    deadline = time.monotonic() + 5
    while not (agent.job_dir("victim") / "workdir" / "workflow" / "mine.txt").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    victim_file = agent.job_dir("victim") / "workdir" / "workflow" / "mine.txt"
    command = _job_command(victim["pid"])
    probes = {
        "db": server / "corral.db",
        "token": token_copy,
        "harness-token": agent.work_dir.parent / f"{agent.work_dir.name}.token",
        "environ": Path(f"/proc/{command}/environ"),
        "files": victim_file,
    }
    agent.submit("thief", [f"cat {p} >/dev/null 2>&1 && echo {k}=READ || echo {k}=refused" for k, p in probes.items()])
    st = agent.wait_finished("thief")
    out = agent.output("thief").decode()
    assert st["state"] == "done", (st, out)
    for k in probes:
        assert f"{k}=refused" in out, out
    assert "hunter2" not in out
    # the same reads as root on the host work: the refusals come from the sandbox
    assert b"VICTIM_SECRET=hunter2" in Path(f"/proc/{command}/environ").read_bytes()
    agent.http.post("/jobs/victim/stop", json={"abort": True})
    agent.wait_finished("victim")


@pytest.fixture
def outside_network() -> Iterator[str]:
    """A network namespace of the test's own (10.214.77.0/24) with an HTTP server at 10.214.77.2:8080."""
    ns, host_if = "corral-test-out", "ctout0"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    for cmd in (
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "addr", "add", "10.214.77.1/24", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "-n", ns, "addr", "add", "10.214.77.2/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    www = tempfile.mkdtemp()
    Path(www, "hello.txt").write_text("from outside\n")
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "8080", "--bind", "10.214.77.2"],
        cwd=www,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield "http://10.214.77.2:8080/hello.txt"
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        shutil.rmtree(www, ignore_errors=True)


def test_outbound_traffic_leaves_through_nat(sandboxed: Any, outside_network: str) -> None:
    agent = sandboxed()
    script = (
        "import urllib.request, time\n"
        "for _ in range(50):\n"
        "    try:\n"
        f"        print(urllib.request.urlopen({outside_network!r}, timeout=2).read().decode(), end='')\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
    )
    agent.submit("out", [f"python3 -c {_quote(script)}"])
    st = agent.wait_finished("out", timeout=30)
    assert (st["state"], agent.output("out")) == ("done", b"from outside\n"), agent.output("out")


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def test_reserved_addresses_and_multi_node_neighbours(sandboxed: Any) -> None:
    a, b = sandboxed("node-a"), sandboxed("node-b")
    addr_a = a.http.post("/jobs/n0/address", json={}).json()["address"]
    addr_b = b.http.post("/jobs/n1/address", json={}).json()["address"]
    assert addr_a != addr_b and a.http.post("/jobs/n0/address", json={}).json()["address"] == addr_a
    a.submit("n0", ["exec python3 -m http.server 7000 --bind 0.0.0.0"])
    st = b.submit("n1", [f"python3 -c {_quote(_fetch(f'http://{addr_a}:7000/'))}"])
    assert st["sandbox"]["address"] == addr_b
    done = b.wait_finished("n1", timeout=30)
    assert done["state"] == "done", b.output("n1")
    a.http.post("/jobs/n0/stop", json={"abort": True})
    a.wait_finished("n0")


def _fetch(url: str) -> str:
    return (
        "import urllib.request, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        f"        urllib.request.urlopen({url!r}, timeout=2).read(); break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "else:\n"
        "    raise SystemExit(1)\n"
    )


def test_a_clean_shutdown_releases_running_jobs_and_unused_reservations(tmp_path: Path) -> None:
    agent = start_agent(tmp_path / "clean", sandbox="on")
    try:
        agent.submit("running", ["sleep 300"], ports=[9000], stop_duration=1)
        agent.wait_running("running")
        assert agent.http.post("/jobs/never-submitted/address", json={}).json()["address"]
        assert len(_own_netns(tmp_path)) == 1
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(15) == 0
    finally:
        cleanup(agent)
    _nothing_left(tmp_path)


def test_kill_9_of_the_agent_then_the_next_start_reaps(tmp_path: Path) -> None:
    agent = start_agent(tmp_path / "crash", sandbox="on")
    try:
        agent.submit("left", ["sleep 300 & sleep 300"], ports=[9000])
        st = agent.wait_running("left")
        time.sleep(0.3)
        assert _sandbox_netns() and os.path.exists(f"/sys/class/net/{BRIDGE}")
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(5)
        assert os.path.exists(f"/proc/{st['pid']}"), "the job outlives its killed agent"
    finally:
        agent.close()
    again = start_agent(tmp_path / "crash", sandbox="on")
    try:
        assert again.state("left")["termination_reason"] == "agent_restarted"
        _nothing_left(tmp_path)
        uid = st["sandbox"]["uid"]
        deadline = time.monotonic() + 3
        while _alive_of(uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive_of(uid) == []
    finally:
        cleanup(again)


def _alive_of(uid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid and procs.is_alive(int(p))]


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_without_root_the_agent_says_so_and_runs_jobs_as_before() -> None:
    base = Path(tempfile.mkdtemp(prefix="corral-nonroot-"))
    try:
        base.chmod(0o755)
        pyz = build_zipapp(base / "agent.pyz")
        work = base / "work"
        work.mkdir()
        nobody = 65534
        os.chown(work, nobody, nobody)
        os.chown(base, nobody, nobody)
        python = shutil.which("python3", path="/usr/bin:/bin") or "python3"
        agent = start_agent(
            work,
            argv=[python, "-I", str(pyz)],
            sandbox="auto",
            preexec=["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups", "--"],
        )
        try:
            agent.submit("plain", ["id -u", "pwd"])
            st = agent.wait_finished("plain")
            out = agent.output("plain").decode().split()
            assert st["state"] == "done" and out[0] == str(nobody), (st, out)
            assert out[1] == str(agent.job_dir("plain") / "workdir")  # the layout of a plain host process
            assert "does not run as root" in st["sandbox"]["message"]
            assert st["sandbox"]["address"] is None
            assert "WITHOUT a sandbox" in agent.log_path.read_text()
        finally:
            cleanup(agent)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_missing_tool_degrades_clearly(tmp_path: Path, agent_factory: Any) -> None:
    bare = tmp_path / "bare-path"  # a host without iproute2 or iptables on the agent's PATH
    bare.mkdir()
    agent = agent_factory("no-tools", env={"PATH": str(bare)}, sandbox="auto")
    agent.submit("plain", ["echo ran"])
    st = agent.wait_finished("plain")
    assert st["state"] == "done" and agent.output("plain") == b"ran\n", st
    assert st["sandbox"]["message"].startswith("Runs without a sandbox: missing on this host: ip (iproute2)")
    assert "WITHOUT a sandbox" in agent.log_path.read_text()
    work = tmp_path / "required"
    work.mkdir()
    (tmp_path / "required.token").write_text("t\n")
    proc = subprocess.run(
        [sys.executable, "-m", "corral.agent", "serve", "--work-dir", str(work), "--token-file",
         str(tmp_path / "required.token"), "--sandbox", "on"],
        env={**os.environ, "PATH": str(bare)}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2 and "--sandbox on, but jobs cannot get a sandbox here: missing" in proc.stderr
