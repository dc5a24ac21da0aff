"""Jobs with an ``image`` through a real agent and a real Docker engine (``docker_engine`` fixture).

Covers what runs inside (env, user, working dir, shm, entrypoint, the image's own command, limits),
ports, OOM, pulls (with and without registry auth, progress, the three kinds of failure), stops, cleanup,
an agent restart with a container running, and the GPU device request on a host without NVIDIA's runtime.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from agent_harness import AgentProc, cleanup, start_agent

from corral.agent.containers import LABEL_AGENT
from docker_harness import CMD_IMAGE, REGISTRY_USER, UBUNTU, DockerEngine, Registries, SlowProxy

AgentFactory = Callable[..., AgentProc]


@pytest.fixture
def dagent(docker_engine: DockerEngine, tmp_path: Path) -> Iterator[AgentFactory]:
    """Agents that run containers on the test engine; no container of theirs outlives the test."""
    started: list[AgentProc] = []

    def factory(name: str = "agent", env: dict[str, str] | None = None) -> AgentProc:
        a = start_agent(tmp_path / name, env={"DOCKER_HOST": docker_engine.host, **(env or {})})
        started.append(a)
        return a

    yield factory
    for a in started:
        cleanup(a)
    for a in started:
        for cid in docker_engine.containers(f"{LABEL_AGENT}={a.work_dir}"):
            docker_engine.cli("rm", "-f", cid, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mine(engine: DockerEngine, a: AgentProc) -> list[str]:
    return engine.containers(f"{LABEL_AGENT}={a.work_dir}")


def test_reports_the_engine(dagent: AgentFactory) -> None:
    assert dagent().http.get("/info").json()["container_runtime"] == "docker"


def test_what_the_commands_see_inside(dagent: AgentFactory, docker_engine: DockerEngine) -> None:
    a = dagent()
    script = [
        'echo "env=$FOO|$DSTACK_RUN_NAME|${AGENT_ONLY:-unset}"',
        "echo id=$(id -u):$(id -g)",
        "echo pwd=$(pwd)",
        "echo shm=$(df -k /dev/shm | tail -1 | awk '{print $2}')",
        "echo hostname=$(hostname)",
        "echo pid1=$(cat /proc/1/comm)",
    ]
    st = a.submit(
        "inside",
        script,
        image=UBUNTU,
        env={"FOO": "bar baz", "DSTACK_RUN_NAME": "my-run"},
        user="1000:1000",
        working_dir="/srv/app",
        container={"shm_size_mib": 96},
    )
    assert st["state"] == "pending" and st["pid"] is None
    st = a.wait_finished("inside")
    assert (st["state"], st["exit_status"]) == ("done", 0), st
    out = a.output("inside").decode()
    assert "env=bar baz|my-run|unset\n" in out  # the agent's own environment stays outside
    assert "id=1000:1000\n" in out
    assert "pwd=/srv/app\n" in out
    assert "shm=98304\n" in out
    assert f"hostname={socket.gethostname()}\n" in out  # host networking: the host's name
    assert "pid1=docker-init\n" in out
    assert st["container"]["network_mode"] == "host" and st["container"]["name"] == "corral-inside"
    assert _mine(docker_engine, a) == []  # removed before the job was reported finished


def test_entrypoint_relative_working_dir_and_the_images_own_command(dagent: AgentFactory) -> None:
    a = dagent()
    a.submit("ep", ["hello", "world"], image=UBUNTU, entrypoint=["/bin/echo", "from"], working_dir="sub")
    a.submit("own", [], image=CMD_IMAGE)
    legacy = {"repo_type": "virtual", "repo_dir": "/workflow"}  # what the server sends without `repos`
    a.submit("shell", ["echo $0", "pwd"], image=CMD_IMAGE, shell="sh", working_dir="rel/dir", repo=legacy)
    assert a.wait_finished("ep")["exit_status"] == 0
    assert a.output("ep") == b"from hello world\n"
    assert a.wait_finished("own")["exit_status"] == 0
    assert a.output("own") == b"from the image in /srv\n"
    assert a.wait_finished("shell")["exit_status"] == 0
    assert a.output("shell") == b"/bin/sh\n/workflow/rel/dir\n"  # dstack: relative = under the legacy repo dir


def test_repo_code_and_files_are_copied_into_the_container(dagent: AgentFactory, tmp_path: Path) -> None:
    a = dagent()
    code = _blob(a, _tar({"main.sh": b"echo from the repo\n"}))
    files = _blob(a, _tar({"cfg/settings.toml": b"x = 1\n"}))
    a.submit(
        "code",
        ["sh main.sh", "cat ~/conf/settings.toml", "echo $DSTACK_REPO_DIR $DSTACK_WORKING_DIR", "pwd", "touch mine"],
        image=CMD_IMAGE,  # WORKDIR /srv: the repo dir "." is there
        user="1000:1000",
        repo={"repo_type": "local", "repo_dir": ".", "code_hash": code},
        file_archives=[{"hash": files, "path": "~/conf"}],
        home_dir="/home/alice",
    )
    st = a.wait_finished("code")
    assert st["state"] == "done", (st, a.output("code"))
    assert a.output("code") == b"from the repo\nx = 1\n/srv /srv\n/srv\n"  # owned by the job's user: writable
    missing = "c" * 64
    a.submit("no-code", ["true"], image=UBUNTU, repo={"repo_type": "local", "repo_dir": ".", "code_hash": missing})
    st = a.wait_finished("no-code")
    assert (st["state"], st["termination_reason"]) == ("failed", "setup_failed")
    assert st["message"].startswith("Failed to set up the job's files:") and missing in st["message"]


def test_exit_status_and_stderr_with_docker_timestamps(dagent: AgentFactory) -> None:
    a = dagent()
    t0 = time.time()
    a.submit("fail", ["echo out", "echo err >&2", "exit 3"], image=UBUNTU)
    st = a.wait_finished("fail")
    assert (st["state"], st["exit_status"], st["message"]) == ("failed", 3, "exited with status 3")
    assert a.output("fail", "stdout") == b"out\n" and a.output("fail", "stderr") == b"err\n"
    entries = a.http.get("/jobs/fail/logs").json()["entries"]
    assert all(t0 - 1 < e["timestamp"] <= st["finished_at"] for e in entries)
    # the agent's own lines about it (dstack's runner log): the image, the container, the exit
    own = a.output("fail", "agent").decode().splitlines()
    assert own[0] == f"Job test-run (fail) received: image {UBUNTU}", own
    assert own[1] in (f"Image {UBUNTU} found on the host", f"Pulling image {UBUNTU}"), own
    assert any(line.startswith("Container corral-fail (") for line in own), own
    assert own[-1] == "Exited with status 3: failed", own


def test_memory_limit_is_enforced_and_cpu_limit_set(dagent: AgentFactory) -> None:
    a = dagent()
    limits = {"memory_mib": 48, "cpus": 0.5, "network_mode": "bridge"}  # what a job on some blocks gets
    a.submit("oom", ['x=$(head -c 300000000 /dev/zero | tr "\\0" a)', "echo survived"], image=UBUNTU, container=limits)
    a.submit(
        "limits",
        ["cat /sys/fs/cgroup/memory/memory.limit_in_bytes", "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"],
        image=UBUNTU,
        container=limits,
    )
    st = a.wait_finished("oom", timeout=60)
    assert (st["state"], st["exit_status"]) == ("failed", 137), st
    assert st["message"].startswith("Out of memory: the container was killed for exceeding its memory limit (48 MiB)")
    assert b"survived" not in a.output("oom")
    assert a.wait_finished("limits")["exit_status"] == 0
    assert a.output("limits") == f"{48 * 2**20}\n50000\n".encode()


def test_ports_host_network_and_bridge(dagent: AgentFactory) -> None:
    a = dagent()
    port = _free_port()
    serve = [f"mkdir -p /www && echo hello-{port} > /www/index.html", f"httpd -f -p {port} -h /www"]
    a.submit("host-net", serve, image=UBUNTU, container={"ports": [port]})
    bridge = ["mkdir -p /www && echo hello-bridge > /www/index.html", "httpd -f -p 8080 -h /www"]
    a.submit("bridged", bridge, image=UBUNTU, container={"ports": [8080], "network_mode": "bridge"})
    for job_id, expected in (("host-net", f"hello-{port}"), ("bridged", "hello-bridge")):
        st = a.wait_running(job_id)
        deadline = time.monotonic() + 10
        while st["state"] == "pending" and time.monotonic() < deadline:
            time.sleep(0.05)
            st = a.state(job_id)
        host_port = {p["container"]: p["host"] for p in st["container"]["ports"]}
        target = port if job_id == "host-net" else host_port[8080]
        if job_id == "host-net":
            assert host_port == {port: port}
        else:
            assert st["container"]["network_mode"] == "bridge" and host_port[8080] != 8080
        body = ""
        while time.monotonic() < deadline:
            try:
                body = httpx.get(f"http://127.0.0.1:{target}/", timeout=1).text
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert body == f"{expected}\n"
        a.http.post(f"/jobs/{job_id}/stop", json={"abort": True})
        assert a.wait_finished(job_id)["state"] == "terminated"


def test_instance_volume_and_privileged(dagent: AgentFactory, tmp_path: Path) -> None:
    a = dagent()
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "in.txt").write_text("from the host\n")
    volumes = [
        {"instance_path": str(shared), "path": "/data"},
        {"instance_path": str(tmp_path / "absent"), "path": "/opt/absent", "optional": True},
    ]
    a.submit(
        "vol",
        ["cat /data/in.txt", "echo from the job > /data/out.txt", "test ! -e /opt/absent && echo skipped"],
        image=UBUNTU,
        container={"volumes": volumes},
    )
    assert a.wait_finished("vol")["exit_status"] == 0
    assert a.output("vol") == b"from the host\nskipped\n"
    assert (shared / "out.txt").read_text() == "from the job\n"
    a.submit(
        "missing", ["true"], image=UBUNTU, container={"volumes": [{"instance_path": "/nonexistent-x", "path": "/x"}]}
    )
    st = a.wait_finished("missing")
    assert st["state"] == "failed" and st["exit_status"] is None and "/nonexistent-x" in st["message"]
    mount = ["mkdir -p /mnt/t && mount -t tmpfs none /mnt/t && echo mounted"]
    a.submit("priv", mount, image=UBUNTU, container={"privileged": True})
    a.submit("unpriv", mount, image=UBUNTU)
    priv = a.wait_finished("priv")
    if priv["exit_status"] is None:  # a root lacking capabilities, where every other one could not do either
        assert "This host cannot run a privileged container" in priv["message"], priv
    else:
        assert priv["exit_status"] == 0 and a.output("priv") == b"mounted\n", (priv, a.output("priv"))
    assert a.wait_finished("unpriv")["exit_status"] != 0
    assert b"mounted" not in a.output("unpriv")


def test_pull_with_and_without_registry_auth(dagent: AgentFactory, registries: Registries) -> None:
    a = dagent()
    public = registries.push(registries.open, "public:1", size=2 * 2**20)
    private = registries.push(registries.private, "private:1")
    user, password = REGISTRY_USER
    a.submit("public", ["echo pulled"], image=public)
    a.submit(
        "private",
        ["echo pulled with auth"],
        image=private,
        container={"registry_username": user, "registry_password": password},
    )
    st = a.wait_finished("public", timeout=60)
    assert st["state"] == "done", st
    assert a.output("public") == b"pulled\n"
    progress = st["image_pull_progress"]
    assert progress["is_total_bytes_final"] and progress["total_bytes"] > 2 * 2**20 * 0.9, progress
    assert progress["downloaded_bytes"] == progress["total_bytes"] == progress["extracted_bytes"]
    assert a.wait_finished("private", timeout=60)["state"] == "done"
    assert a.output("private") == b"pulled with auth\n"
    # The registry password never reaches the disk.
    assert password not in (a.job_dir("private") / "submission.json").read_text()


def test_pull_failures_are_told_apart(dagent: AgentFactory, registries: Registries) -> None:
    a = dagent()
    private = registries.push(registries.private, "denied:1")
    cases = {
        "not-found": (f"{registries.open.address}/no-such-image:1", {}, "was not found in its registry"),
        "unreachable": ("127.0.0.1:1/nothing:1", {}, "the registry 127.0.0.1:1 is unreachable"),
        "no-auth": (private, {}, f"The registry {registries.private.address} refused to serve image"),
        "bad-auth": (
            private,
            {"registry_username": "bob", "registry_password": "wrong"},
            "Check `registry_auth`",
        ),
    }
    for job_id, (image, container, _) in cases.items():
        a.submit(job_id, ["true"], image=image, container=container)
    for job_id, (image, _, expected) in cases.items():
        st = a.wait_finished(job_id, timeout=30)
        assert (st["state"], st["exit_status"]) == ("failed", None), st
        assert expected in st["message"] and f"`{image}`" in st["message"], st["message"]
        assert st["container"] is None


def test_stop_is_graceful_then_forced_and_leaves_nothing(dagent: AgentFactory, docker_engine: DockerEngine) -> None:
    a = dagent()
    a.submit("polite", ['trap "echo got TERM; exit 7" TERM', "echo up", "while true; do sleep 0.1; done"], image=UBUNTU)
    a.submit(
        "stubborn",
        ['trap "echo ignoring TERM" TERM', "echo up", "while true; do sleep 0.1; done"],
        image=UBUNTU,
        stop_duration=1.5,
    )
    a.submit("aborted", ["echo up", "sleep 600"], image=UBUNTU, stop_duration=60)
    for job_id in ("polite", "stubborn", "aborted"):
        _wait_output(a, job_id, b"up\n")
    t0 = time.monotonic()
    for job_id, abort in (("polite", False), ("stubborn", False), ("aborted", True)):
        assert a.http.post(f"/jobs/{job_id}/stop", json={"abort": abort}).status_code == 200
    polite = a.wait_finished("polite")
    assert (polite["state"], polite["exit_status"], polite["termination_reason"]) == ("terminated", 7, "stopped")
    assert a.output("polite").endswith(b"got TERM\n")
    aborted = a.wait_finished("aborted")
    assert (aborted["state"], aborted["termination_reason"], aborted["exit_status"]) == ("terminated", "aborted", 137)
    stubborn = a.wait_finished("stubborn")
    assert time.monotonic() - t0 >= 1.4
    assert (stubborn["state"], stubborn["exit_status"]) == ("terminated", 137)
    assert b"ignoring TERM" in a.output("stubborn")
    assert _mine(docker_engine, a) == []


def test_a_stop_with_a_deadline_is_readable_in_the_container(dagent: AgentFactory) -> None:
    a = dagent()
    trap = "trap 'cat \"$CORRAL_PREEMPTION_FILE\"; exit 0' TERM"
    a.submit("preempted", [trap, "echo up", "while true; do sleep 0.1; done"], image=UBUNTU, stop_duration=60)
    _wait_output(a, "preempted", b"up\n")
    t0 = time.monotonic()
    body = {"deadline": 2_000_000_000, "message": "Preempted by run high"}
    assert a.http.post("/jobs/preempted/stop", json=body).status_code == 200
    st = a.wait_finished("preempted")
    assert time.monotonic() - t0 < 5 and st["exit_status"] == 0, st
    out = a.output("preempted")
    assert b"CORRAL_PREEMPTION_DEADLINE=2000000000\nCORRAL_PREEMPTION_MESSAGE='Preempted by run high'\n" in out, out


def test_stop_while_pulling(dagent: AgentFactory, registries: Registries, docker_engine: DockerEngine) -> None:
    proxy = SlowProxy(registries.open.address, delay=3.0)
    try:
        image = registries.push(registries.open, "slow:1").replace(registries.open.address, proxy.address)
        a = dagent()
        a.submit("slow", ["echo never"], image=image)
        deadline = time.monotonic() + 10
        while a.state("slow")["image_pull_progress"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        st = a.state("slow")
        assert st["state"] == "pending" and st["image_pull_progress"]["is_total_bytes_final"] is False
        a.http.post("/jobs/slow/stop", json={"abort": False})
        st = a.wait_finished("slow", timeout=10)
        assert (st["state"], st["termination_reason"], st["container"]) == ("terminated", "stopped", None)
        assert a.output("slow") == b"" and _mine(docker_engine, a) == []
    finally:
        proxy.stop()


def test_agent_restart_finds_its_containers_again(
    dagent: AgentFactory, docker_engine: DockerEngine, tmp_path: Path
) -> None:
    a = dagent("restart")
    a.submit("long", ["for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.4; done"], image=UBUNTU)
    a.submit("short", ["echo quick", "exit 5"], image=UBUNTU)
    _wait_output(a, "long", b"tick 2\n")
    os.killpg(a.proc.pid, signal.SIGKILL)  # the agent dies; its containers do not
    a.proc.wait(5)
    time.sleep(0.5)  # "short" exits while no agent watches it
    # A container of this agent that no job owns (as if the agent died right after creating it).
    docker_engine.cli(
        "create", "--label", f"{LABEL_AGENT}={a.work_dir}", "--label", "corral.job_id=ghost", UBUNTU, "true"
    )
    b = dagent("restart")  # the same work dir
    long_state = b.wait_finished("long", timeout=20)
    assert long_state["state"] == "done", long_state
    ticks = b.output("long").decode().splitlines()
    assert ticks == [f"tick {i}" for i in range(1, 9)]  # nothing lost, nothing twice
    short = b.wait_finished("short")
    assert (short["state"], short["exit_status"]) == ("failed", 5)
    assert b.output("short") == b"quick\n"
    deadline = time.monotonic() + 10
    while _mine(docker_engine, b) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _mine(docker_engine, b) == []


def test_shutdown_stops_and_removes_containers(dagent: AgentFactory, docker_engine: DockerEngine) -> None:
    a = dagent()
    a.submit("bye", ["echo up", "sleep 600"], image=UBUNTU, stop_duration=2)
    _wait_output(a, "bye", b"up\n")
    assert len(_mine(docker_engine, a)) == 1
    a.http.post("/shutdown")
    assert a.proc.wait(15) == 0
    assert _mine(docker_engine, a) == []


def test_cleanup_removes_the_containers_a_killed_agent_left(
    dagent: AgentFactory, docker_engine: DockerEngine, tmp_path: Path
) -> None:
    """``agent cleanup`` (what the server runs on an SSH host before removing the agent): the containers
    of the stopped agent with this work dir go, another agent's stay."""
    a = dagent("dead")
    a.submit("orphan", ["echo up", "sleep 600"], image=UBUNTU)
    _wait_output(a, "orphan", b"up\n")
    os.killpg(a.proc.pid, signal.SIGKILL)  # the agent dies; its container does not
    a.proc.wait(5)
    assert len(_mine(docker_engine, a)) == 1
    other = str(tmp_path / "another-agent")
    kept = docker_engine.cli("create", "--label", f"{LABEL_AGENT}={other}", UBUNTU, "true").stdout.strip()
    try:
        argv = [sys.executable, "-m", "corral.agent", "cleanup", "--work-dir", str(a.work_dir)]
        env = {**os.environ, "DOCKER_HOST": docker_engine.host}
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout) == (0, "containers=1\n"), out.stderr
        assert _mine(docker_engine, a) == []
        assert docker_engine.containers(f"{LABEL_AGENT}={other}") == [kept]
        again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert (again.returncode, again.stdout) == (0, "containers=0\n"), again.stderr
    finally:
        docker_engine.cli("rm", "-f", kept, check=False)


def test_gpu_request_on_a_host_without_nvidia_runtime(
    dagent: AgentFactory, docker_engine: DockerEngine, tmp_path: Path
) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920, 550.54'\necho 'NVIDIA A100-SXM4-80GB, 81920, 550.54'\n"
    )
    fake.chmod(0o755)
    a = dagent(env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert [g["name"] for g in a.http.get("/info").json()["gpus"]] == ["A100", "A100"]
    a.submit("gpu", ["nvidia-smi"], image=UBUNTU, container={"gpus": 1})
    st = a.wait_finished("gpu")
    assert st["state"] == "failed" and st["exit_status"] is None
    assert 'could not select device driver "nvidia"' in st["message"] and "NVIDIA Container Toolkit" in st["message"]
    a.submit("too-many", ["true"], image=UBUNTU, container={"gpus": 3})  # the failed job gave its GPU back
    st = a.wait_finished("too-many")
    assert st["message"] == "The job needs 3 GPU(s), but only 2 of this host's 2 are free"
    assert _mine(docker_engine, a) == []


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(a: AgentProc, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    assert a.http.put(f"/blobs/{digest}", content=data).status_code == 200
    return digest


def _wait_output(a: AgentProc, job_id: str, expected: bytes, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while expected not in a.output(job_id):
        assert time.monotonic() < deadline, (job_id, a.state(job_id), a.output(job_id))
        time.sleep(0.05)
