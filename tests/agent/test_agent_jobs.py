"""Job execution through a real agent: exit codes, output, env, stop/abort, limits."""

from __future__ import annotations

import base64
import time
from pathlib import Path

from agent_harness import AgentProc

from corral.agent import procs


def test_exit_codes(agent: AgentProc) -> None:
    for job_id, code in (("exit0", 0), ("exit1", 1), ("exit42", 42)):
        agent.submit(job_id, ["echo start", f"exit {code}"])
    for job_id, code, state in (("exit0", 0, "done"), ("exit1", 1, "failed"), ("exit42", 42, "failed")):
        st = agent.wait_finished(job_id)
        assert (st["state"], st["exit_status"]) == (state, code), st
        assert st["started_at"] <= st["finished_at"]
        assert agent.output(job_id) == b"start\n"


def test_commands_are_joined_with_and(agent: AgentProc) -> None:
    agent.submit("and-chain", ["echo one", "false", "echo never"])
    st = agent.wait_finished("and-chain")
    assert st["exit_status"] == 1
    assert agent.output("and-chain") == b"one\n"


def test_command_not_found(agent: AgentProc) -> None:
    agent.submit("notfound", ["no-such-command-xyz --flag"])
    st = agent.wait_finished("notfound")
    assert (st["state"], st["exit_status"]) == ("failed", 127)
    assert b"no-such-command-xyz" in agent.output("notfound", "stderr")
    assert b"not found" in agent.output("notfound", "stderr")
    assert agent.output("notfound", "stdout") == b""


def test_stdout_stderr_unicode_and_raw_bytes(agent: AgentProc) -> None:
    script = r"printf 'h\303\251llo \342\234\223\n'; printf '\377\376 raw\n' >&2; printf 'no-newline'"
    agent.submit("bytes", [script])
    agent.wait_finished("bytes")
    assert agent.output("bytes", "stdout") == "héllo ✓\n".encode() + b"no-newline"
    assert agent.output("bytes", "stderr") == b"\xff\xfe raw\n"
    entries = agent.http.get("/jobs/bytes/logs").json()["entries"]
    assert [base64.b64decode(e["message_b64"]) for e in entries if e["source"] == "stdout"] == [
        "héllo ✓\n".encode(),
        b"no-newline",
    ]
    assert all(isinstance(e["timestamp"], float) for e in entries)


def test_partial_line_flushed_after_half_a_second(agent: AgentProc) -> None:
    agent.submit("partial", ["printf 'progress 10%%'", "sleep 2", "echo ' done'"])
    t0 = time.monotonic()
    offset = agent.started_offset("partial")
    r = agent.http.get("/jobs/partial/logs", params={"wait": 5, "offset": offset}).json()
    assert time.monotonic() - t0 < 1.6
    assert base64.b64decode(r["entries"][0]["message_b64"]) == b"progress 10%"
    agent.wait_finished("partial")
    assert agent.output("partial") == b"progress 10% done\n"


def test_long_line_split_in_64k_pieces(agent: AgentProc) -> None:
    agent.submit("longline", ["head -c 200000 /dev/zero | tr '\\0' x", "echo"])
    agent.wait_finished("longline")
    entries = agent.http.get("/jobs/longline/logs").json()["entries"]
    sizes = [len(base64.b64decode(e["message_b64"])) for e in entries if e["source"] != "agent"]
    assert sum(sizes) == 200001 and max(sizes) <= 65536


def test_env_and_working_dir(agent: AgentProc, tmp_path: Path) -> None:
    env = {"DSTACK_RUN_NAME": "my-run", "FOO": "bar baz"}
    agent.submit(
        "env",
        ['echo "$DSTACK_RUN_NAME|$FOO|${AGENT_ONLY_SECRET:-unset}|$HOME"', "pwd", "touch here"],
        env=env,
        working_dir="sub/dir",
    )
    agent.wait_finished("env")
    lines = agent.output("env").decode().splitlines()
    run_name, foo, secret, home = lines[0].split("|")
    assert (run_name, foo, secret) == ("my-run", "bar baz", "unset")
    assert home
    workdir = agent.job_dir("env") / "workdir" / "sub" / "dir"
    assert Path(lines[1]).resolve() == workdir.resolve()
    assert (workdir / "here").exists()
    # An absolute working_dir (a container path) lives inside the job's own directory, never on the host's /.
    agent.submit("env-abs", ["pwd", 'echo "$DSTACK_WORKING_DIR"'], working_dir="/abs-wd")
    agent.wait_finished("env-abs")
    inside = (agent.job_dir("env-abs") / "workdir" / "abs-wd").resolve()
    assert [Path(line).resolve() for line in agent.output("env-abs").decode().split()] == [inside, inside]
    assert not Path("/abs-wd").exists()


def test_shell_choice(agent: AgentProc) -> None:
    agent.submit("sh", ['echo "$0"'], shell="sh")
    agent.submit("bad-shell", ["true"], shell="/nonexistent/shell")
    assert agent.wait_finished("sh")["exit_status"] == 0
    assert agent.output("sh") == b"/bin/sh\n"
    st = agent.wait_finished("bad-shell")
    assert st["state"] == "failed" and "/nonexistent/shell" in st["message"]


def test_stop_sigterm(agent: AgentProc) -> None:
    agent.submit("stop", ["echo up", "sleep 60"])
    agent.wait_running("stop")
    agent.http.get("/jobs/stop/logs", params={"wait": 5, "offset": agent.started_offset("stop")})
    t0 = time.monotonic()
    assert agent.http.post("/jobs/stop/stop", json={"abort": False}).status_code == 200
    st = agent.wait_finished("stop")
    assert time.monotonic() - t0 < 2
    assert st["state"] == "terminated" and st["termination_reason"] == "stopped"
    assert st["exit_status"] == 143


def test_trapped_sigterm_gets_sigkill_after_stop_duration(agent: AgentProc) -> None:
    agent.submit("trap", ["trap 'echo got-term' TERM", "echo ready", "while true; do sleep 0.1; done"], stop_duration=1)
    agent.http.get("/jobs/trap/logs", params={"wait": 5, "offset": agent.started_offset("trap")})
    t0 = time.monotonic()
    agent.http.post("/jobs/trap/stop", json={})
    st = agent.wait_finished("trap")
    elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 4, elapsed
    assert st["state"] == "terminated" and st["exit_status"] == 137
    assert b"got-term" in agent.output("trap")


def test_a_stop_with_a_deadline_is_readable_before_sigterm_and_kills_at_it(agent: AgentProc) -> None:
    said = 'echo "got-term $CORRAL_PREEMPTION_DEADLINE $CORRAL_PREEMPTION_MESSAGE"'
    trap = f"trap '. \"$CORRAL_PREEMPTION_FILE\"; {said}' TERM"
    agent.submit("preempt", [trap, "echo ready", "while true; do sleep 0.1; done"], stop_duration=60)
    agent.http.get("/jobs/preempt/logs", params={"wait": 5, "offset": agent.started_offset("preempt")})
    t0, deadline = time.monotonic(), int(time.time()) + 2
    r = agent.http.post("/jobs/preempt/stop", json={"deadline": deadline, "message": "Preempted by run it's-me"})
    assert r.status_code == 200, r.text
    st = agent.wait_finished("preempt")
    elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 4, elapsed  # killed at the deadline, not after its stop_duration of 60 s
    assert st["state"] == "terminated" and st["exit_status"] == 137
    assert f"got-term {deadline} Preempted by run it's-me".encode() in agent.output("preempt")
    bad = agent.http.post("/jobs/preempt/stop", json={"deadline": "soon"})
    assert bad.status_code == 400 and "stop.deadline" in bad.text


def test_abort_kills_at_once(agent: AgentProc) -> None:
    agent.submit("abort", ["trap '' TERM", "sleep 60"], stop_duration=60)
    agent.wait_running("abort")
    t0 = time.monotonic()
    agent.http.post("/jobs/abort/stop", json={"abort": True})
    st = agent.wait_finished("abort")
    assert time.monotonic() - t0 < 3
    assert st["state"] == "terminated" and st["termination_reason"] == "aborted"


def test_stop_kills_grandchildren(agent: AgentProc) -> None:
    agent.submit("gc", ["(sleep 60 & echo $! > gc.pid; wait)", "sleep 60"])
    agent.wait_running("gc")
    pid_file = agent.job_dir("gc") / "workdir" / "gc.pid"
    deadline = time.monotonic() + 5
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    gc_pid = int(pid_file.read_text())
    assert procs.is_alive(gc_pid)
    agent.http.post("/jobs/gc/stop", json={})
    agent.wait_finished("gc")
    assert not procs.is_alive(gc_pid)


def test_leftovers_killed_when_main_process_exits(agent: AgentProc) -> None:
    agent.submit("leftover", ["sleep 60 > /dev/null 2>&1 & echo $! > bg.pid", "echo main-done"])
    st = agent.wait_finished("leftover")
    assert st["state"] == "done"
    bg_pid = int((agent.job_dir("leftover") / "workdir" / "bg.pid").read_text())
    deadline = time.monotonic() + 2
    while procs.is_alive(bg_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not procs.is_alive(bg_pid)


def test_max_duration(agent: AgentProc) -> None:
    agent.submit("maxdur", ["sleep 60"], max_duration=0.5, stop_duration=1)
    t0 = time.monotonic()
    st = agent.wait_finished("maxdur")
    assert time.monotonic() - t0 < 3
    assert st["state"] == "terminated" and st["termination_reason"] == "max_duration_exceeded"
    assert "max_duration" in st["message"]


def test_large_output_memory_bounded(agent: AgentProc) -> None:
    rss_before = agent.vm_kib("VmRSS")
    line = "x" * 99
    agent.submit("big", [f"yes {line} | head -c 20000000", "echo end >&2"])
    st = agent.wait_finished("big", timeout=25)
    assert st["state"] == "done"
    assert agent.vm_kib("VmHWM") - rss_before < 25 * 1024, "agent memory grew with the output"
    out = agent.output("big", "stdout")
    assert len(out) == 20_000_000 and out.startswith(line.encode() + b"\n")
    own = len(agent.output("big", "agent"))  # the agent's own lines about the job
    assert (agent.job_dir("big") / "logs.dat").stat().st_size == 20_000_000 + 4 + own
    assert agent.vm_kib("VmHWM") - rss_before < 40 * 1024


def test_long_poll_returns_promptly(agent: AgentProc) -> None:
    agent.submit("lp", ["sleep 0.7", "echo hi", "sleep 60"])
    t0 = time.monotonic()
    offset = agent.started_offset("lp")
    r = agent.http.get("/jobs/lp/logs", params={"offset": offset, "wait": 20}).json()
    assert 0.5 < time.monotonic() - t0 < 2.5
    assert base64.b64decode(r["entries"][0]["message_b64"]) == b"hi\n"
    assert r["next_offset"] == offset + 1 and r["state"]["state"] == "running"
    t0 = time.monotonic()  # nothing new: waits the full `wait`
    r = agent.http.get("/jobs/lp/logs", params={"offset": offset + 1, "wait": 0.3}).json()
    assert r["entries"] == [] and time.monotonic() - t0 >= 0.29
    agent.http.post("/jobs/lp/stop", json={"abort": True})
    agent.wait_finished("lp")


def test_long_poll_wakes_on_finish_without_output(agent: AgentProc) -> None:
    agent.submit("lp-exit", ["sleep 0.5", "exit 3"])
    t0 = time.monotonic()
    offset = agent.started_offset("lp-exit")
    r = agent.http.get("/jobs/lp-exit/logs", params={"wait": 20, "offset": offset}).json()
    assert time.monotonic() - t0 < 2.5
    assert all(e["source"] == "agent" for e in r["entries"])  # no output: the agent's own lines alone
    assert r["state"]["state"] == "failed" and r["state"]["exit_status"] == 3


def test_image_without_container_runtime(agent_factory: object, tmp_path: Path) -> None:
    a = agent_factory("no-docker", env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})  # type: ignore[operator]
    st = a.submit("img", ["true"], image="ubuntu:22.04")
    assert st["state"] == "failed"
    assert "`image: ubuntu:22.04`" in st["message"] and "no container runtime (Docker)" in st["message"]
    assert a.http.get("/info").json()["container_runtime"] is None


def test_idempotent_submit_and_forget(agent: AgentProc) -> None:
    first = agent.submit("idem", ["sleep 60"])
    second = agent.submit("idem", ["echo other"])
    assert first["pid"] == second["pid"]
    assert agent.http.delete("/jobs/idem").status_code == 409
    agent.http.post("/jobs/idem/stop", json={"abort": True})
    agent.wait_finished("idem")
    assert agent.http.delete("/jobs/idem").status_code == 200
    assert not agent.job_dir("idem").exists()
    assert agent.http.get("/jobs/idem").status_code == 404
    assert "idem" not in [s["job_id"] for s in agent.http.get("/jobs").json()]


def test_the_agent_s_own_lines_about_a_job_are_kept_apart_from_its_output(agent: AgentProc) -> None:
    """What the agent did for the job (dstack's runner log, ``dstack logs -d``): under the source ``agent``."""
    agent.submit("own", ["echo out", "exit 4"])
    agent.wait_finished("own")
    assert agent.output("own") == b"out\n"
    lines = agent.output("own", "agent").decode().splitlines()
    assert lines[0] == "Job test-run (own) received: a host process", lines
    assert any(line.startswith("Process started (pid ") for line in lines), lines
    assert lines[-1] == "Exited with status 4: failed", lines


def test_instance_volumes_without_a_sandbox(agent: AgentProc, tmp_path: Path) -> None:
    """A host process with no sandbox sees the host's paths as they are: a volume at its own path runs, an
    ``optional`` one elsewhere is left out, and a required one elsewhere fails the job saying why."""
    (tmp_path / "in.txt").write_text("host-file\n")
    same = [{"instance_path": str(tmp_path), "path": str(tmp_path)}]
    optional = [{"instance_path": str(tmp_path), "path": "/data", "optional": True}]
    agent.submit("vol-same", [f"cat {tmp_path}/in.txt"], volumes=same + optional)
    assert agent.wait_finished("vol-same")["state"] == "done"
    assert agent.output("vol-same") == b"host-file\n"
    agent.submit("vol-elsewhere", ["true"], volumes=[{"instance_path": str(tmp_path), "path": "/data"}])
    st = agent.wait_finished("vol-elsewhere")
    assert st["state"] == "failed" and st["message"].startswith("Cannot mount the instance volume(s) at /data: "), st
    assert "Job failed: Cannot mount the instance volume(s) at /data" in agent.output("vol-elsewhere", "agent").decode()
