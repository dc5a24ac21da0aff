"""The host's sandbox slots under concurrency: the host-wide lock covers only the slot records (and the
bridge), never one job's network set-up or teardown; the bridge outlives the last sandbox only briefly
(jobs that follow each other keep one); an agent's spare network, made after a job, is its next job's.
Real namespaces, veths and bridge: needs root (CI runs as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent import sandbox, sandbox_net
from corral.agent.jobs import JobRunner
from corral.agent.protocol import JobState, JobSubmission
from corral.agent.sandbox_spare import SPARE_JOB
from skip_policy import needs_root

pytestmark = needs_root("the sandbox needs root (CI runs as root)")


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[tuple[sandbox.Sandboxes, sandbox.Sandboxes]]:
    """Two agents' views of the host (two work dirs, one state directory), as two agents of one host have."""
    for name in ("one", "two"):  # an agent's work dir that is gone would have its slots reaped by others
        (tmp_path / name).mkdir()
    one = sandbox.Sandboxes(str(tmp_path / "one"), sandbox.SandboxConfig(mode="on"))
    two = sandbox.Sandboxes(str(tmp_path / "two"), sandbox.SandboxConfig(mode="on"))
    assert one.available, one.reason
    yield one, two
    for sbs in (one, two):
        sbs.cancel_bridge_check()
        sbs.reap(set())


def _others_hold_slots(tmp_path: Path) -> bool:
    """Whether an agent of another test (running beside this one) holds a slot: the bridge is then theirs too."""
    slots = Path(sandbox.DEFAULT_STATE_DIR) / "slots"
    for f in slots.glob("*.json") if slots.is_dir() else []:
        try:
            if str(tmp_path) not in f.read_text():
                return True
        except OSError:
            continue
    return False


def test_one_agents_network_teardown_does_not_hold_up_anothers_setup(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = sandboxes
    first = one.open("ending", [])
    real_down = sandbox_net.job_net_down

    def slow_down(slot: int, wait: bool = True) -> None:  # the kernel taking its time over the ending job's veth
        if slot == first.slot:
            time.sleep(1.5)
        real_down(slot, wait)

    monkeypatch.setattr(sandbox_net, "job_net_down", slow_down)
    closing = threading.Thread(target=one.close, args=(first,), kwargs={"keep_bridge": True})
    closing.start()
    time.sleep(0.2)  # the teardown is under way
    t0 = time.monotonic()
    second = two.open("starting", [8000])
    took = time.monotonic() - t0
    closing.join()
    try:
        assert second.slot != first.slot and second.netns and os.path.exists(second.netns)
        assert took < 1.0, f"the second agent's job waited {took:.2f} s for the first one's teardown"
        assert not os.path.exists(first.netns or "")
    finally:
        two.close(second)


def test_a_jobs_end_never_removes_a_slot_given_back_meanwhile(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes],
) -> None:
    """A job's slot given back while its end was on its way (the job forgotten at once, a reap) may be another
    agent's job's by the time the end releases the sandbox: that one keeps its namespace and its slot."""
    one, two = sandboxes
    # a test beside this one may open and close sandboxes all the while: try until the freed slot is the next one
    # taken (a try takes about 0.1 s; under such churn, five tries were seen to lose every time)
    for attempt in range(100):
        ended = one.open(f"ended-{attempt}", [])
        one.release(f"ended-{attempt}")  # given back meanwhile: its namespace went, its slot is free
        taken = two.open("taken", [])
        if taken.slot == ended.slot:
            break
        # another agent on this host (a test beside this one) took the freed slot first: try again
        two.close(taken)
        one.close(ended, keep_bridge=True, quiesced=True)
    try:
        assert taken.slot == ended.slot, "the freed slot is the next one taken"
        assert one.spare.keep(ended) is False  # not kept as a spare either: it is not the ended job's now
        one.close(ended, keep_bridge=True, quiesced=True)
        assert taken.netns and os.path.exists(taken.netns), "the other agent's namespace was removed"
        records = two.slots.records(str(Path(sandbox.DEFAULT_STATE_DIR) / "slots"))
        assert records[taken.slot]["job_id"] == "taken", records
    finally:
        two.close(taken)


def test_the_bridge_lingers_for_jobs_that_follow_each_other_then_goes(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    one, _two = sandboxes
    ups: list[str] = []
    real_up = sandbox_net.bridge_up

    def counted_up(bridge: str, network: object) -> None:
        ups.append(bridge)
        real_up(bridge, network)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox_net, "bridge_up", counted_up)
    for i in range(3):  # one job after another on the host, each the only one while it runs
        sb = one.open(f"job-{i}", [])
        one.close(sb, keep_bridge=True)
        one.bridge_down_later(0.5)
        assert os.path.exists(f"/sys/class/net/{one.config.bridge}"), "the bridge went with its job"
    assert len(ups) <= 1, f"the bridge was put up {len(ups)} times for 3 jobs in a row"
    deadline = time.monotonic() + 5
    while os.path.exists(f"/sys/class/net/{one.config.bridge}") and time.monotonic() < deadline:
        if _others_hold_slots(tmp_path):
            return  # another test's job keeps the bridge: its going is checked by test_sandbox.py's teardown
        time.sleep(0.05)
    assert not os.path.exists(f"/sys/class/net/{one.config.bridge}"), "the bridge outlived its linger"
    assert not os.path.exists(os.path.join(one.config.state_dir, "bridge"))


def _record(slot: int) -> dict[str, object]:
    path = Path(sandbox.DEFAULT_STATE_DIR) / "slots" / f"{slot}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _counting_net_ups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The slots whose network is made from now on (a spare taken makes none)."""
    made: list[int] = []
    real_up = sandbox_net.job_net_up

    def counted_up(slot: int, *a: object) -> str:
        made.append(slot)
        return real_up(slot, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox_net, "job_net_up", counted_up)
    return made


def test_a_spare_network_made_after_a_job_is_the_next_jobs_and_goes_when_the_agent_is_idle(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _two = sandboxes
    one.spare.prepare()
    assert one.spare.held is not None
    spare_slot, spare_ns = one.spare.held
    assert os.path.exists(spare_ns) and _record(spare_slot)["job_id"] == SPARE_JOB
    made = _counting_net_ups(monkeypatch)
    first = one.open("next", [8000])
    assert (first.slot, first.netns) == (spare_slot, spare_ns) and made == [], "the next job takes the spare"
    assert _record(spare_slot)["job_id"] == "next" and 8000 in first.ports()
    # a job whose slot was reserved ahead (a multi-node run's address given out) keeps that slot
    one.spare.prepare()
    assert one.spare.held is not None
    made.clear()
    reserved = one.reserve("ahead")
    ahead = one.open("ahead", [])
    assert ahead.slot == reserved != one.spare.held[0] and made == [reserved]
    one.spare.release_if_idle()
    assert one.spare.held is not None, "the agent runs jobs: its spare stays"
    one.close(first, keep_bridge=True)
    one.close(ahead, keep_bridge=True)
    left = one.spare.held[0]
    one.spare.release_if_idle()
    assert one.spare.held is None and _record(left) == {}, "an idle agent keeps no spare"


def test_an_ended_jobs_quiet_network_is_kept_as_the_spare_and_a_busy_one_is_not(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _two = sandboxes
    first = one.open("first", [])
    one.quiesce(first)
    assert first.netns is not None and sandbox_net.netns_quiet(first.netns)
    assert one.spare.keep(first), "a job that left nothing in its namespace hands it on"
    assert one.spare.held == (first.slot, first.netns) and _record(first.slot)["job_id"] == SPARE_JOB
    made = _counting_net_ups(monkeypatch)
    second = one.open("second", [])
    assert (second.slot, second.netns, made) == (first.slot, first.netns, []), "the next job takes it as it is"
    assert _record(second.slot)["job_id"] == "second"
    # a socket open in the namespace (here one listening, held by this test): the namespace is not handed on
    assert second.netns is not None
    holder = subprocess.Popen(
        ["ip", "netns", "exec", sandbox_net.netns_name(second.slot), sys.executable, "-c",
         "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 7001)); s.listen(); print(1, flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"1\n"
        assert not sandbox_net.netns_quiet(second.netns)
        assert not one.spare.keep(second) and one.spare.held is None
    finally:
        holder.kill()
        holder.wait()
    one.close(second, keep_bridge=True, quiesced=True)
    assert not os.path.exists(second.netns), "a namespace not handed on goes"
    # an agent that has a spare already keeps only that one
    third = one.open("third", [])
    one.spare.prepare()
    assert one.spare.held is not None and not one.spare.keep(third)
    one.close(third, keep_bridge=True)
    assert not sandbox_net.netns_quiet("/run/netns/corral-no-such-namespace")


def test_a_slots_record_is_rewritten_in_place_when_the_spare_is_kept_and_taken(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes],
) -> None:
    one, _two = sandboxes
    first = one.open("in-place-first", [])
    path = Path(sandbox.DEFAULT_STATE_DIR) / "slots" / f"{first.slot}.json"
    inode = path.stat().st_ino
    one.quiesce(first)
    assert one.spare.keep(first)
    assert _record(first.slot)["job_id"] == SPARE_JOB and path.stat().st_ino == inode, "no new file per change"
    second = one.open("in-place-second", [])
    assert second.slot == first.slot and _record(second.slot)["job_id"] == "in-place-second"
    assert path.stat().st_ino == inode and not (path.parent / f".{first.slot}.json.tmp").exists(), "nor a temporary one"
    # a record that outgrew a page (written whole, to a new file) is read back whole after a shorter rewrite
    big = {**_record(second.slot), "note": "x" * 5000}
    one.slots.rewrite(str(path.parent), second.slot, big)
    assert _record(second.slot) == big
    one.slots.rewrite(str(path.parent), second.slot, {**big, "note": ""})
    assert _record(second.slot)["note"] == "" and _record(second.slot)["job_id"] == "in-place-second"
    one.close(second, keep_bridge=True)
    assert _record(second.slot) == {}


def test_a_deleted_jobs_directory_and_slot_are_gone_whether_it_ran_in_its_slot_or_not(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], tmp_path: Path
) -> None:
    one, _two = sandboxes
    runner = JobRunner(str(tmp_path / "one"), sandboxes=one)  # no container runtime: a job with an image fails
    try:
        # a job that ran in its sandbox: its end hands its slot on as the agent's spare
        runner.submit(JobSubmission("ran", "run", ["echo ok"]))
        assert _finished(runner, "ran").state == "done"
        job_dir = Path(runner.get("ran").dir)
        assert job_dir.is_dir()
        runner.forget("ran")
        assert not job_dir.exists() and not _slots_naming("ran")
        assert one.spare.held is not None and _record(one.spare.held[0])["job_id"] == SPARE_JOB
        # a job whose slot was reserved ahead (its address given out) and that never ran in it: DELETE gives it back
        assert runner.reserve_address("reserved") is not None and _slots_naming("reserved")
        runner.submit(JobSubmission("reserved", "run", ["echo ok"], image="ubuntu"))
        assert _finished(runner, "reserved").state == "failed"
        runner.forget("reserved")
        assert not _slots_naming("reserved") and not (tmp_path / "one" / "jobs" / "reserved").exists()
    finally:
        runner.shutdown()


def _finished(runner: JobRunner, job_id: str) -> JobState:
    deadline = time.monotonic() + 10
    while not (st := runner.get(job_id).snapshot()).finished and time.monotonic() < deadline:
        time.sleep(0.02)
    return st


def _slots_naming(job_id: str) -> list[int]:
    slots = Path(sandbox.DEFAULT_STATE_DIR) / "slots"
    return [int(f.stem) for f in slots.glob("*.json") if json.loads(f.read_text() or "{}").get("job_id") == job_id]


def test_the_bridges_marker_counts_only_in_the_network_namespace_that_wrote_it(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _two = sandboxes
    sb = one.open("holder", [])  # the bridge is up, and stays while this slot is held
    try:
        ups: list[str] = []
        monkeypatch.setattr(sandbox_net, "bridge_up", lambda bridge, network: ups.append(bridge))
        marker = Path(one.config.state_dir) / "bridge"
        with one.slots.locked():
            one.slots.bridge_up()
        assert ups == [], "the marker of this namespace: nothing to do"
        # an agent in a container of its own network, sharing the state directory, wrote it
        marker.write_text(f"{one.config.bridge} {one.slots.network} net:[1]\n")
        with one.slots.locked():
            one.slots.bridge_up()
        assert ups == [one.config.bridge], "another namespace's marker: the bridge and rules are put up here"
    finally:
        one.close(sb, keep_bridge=True)


def test_the_slots_of_an_agent_still_ending_are_left_to_it_once_its_work_dir_is_gone(
    sandboxes: tuple[sandbox.Sandboxes, sandbox.Sandboxes], tmp_path: Path
) -> None:
    """An agent whose instance's directory was removed while it was still ending (its slots still its own,
    and still acted on: its jobs' networks torn down, its spare's) keeps them until its process has ended;
    another agent's start gave them back at once, and a third agent's namespace at that slot was removed
    under it. A record written before records named their agent is judged by its work dir alone."""
    ending, other = sandboxes
    process = subprocess.Popen(["sleep", "60"])  # the ending agent's process
    try:
        slot = ending.reserve("its-job")
        old = ending.reserve("older-agents-job")
        with ending.slots.locked() as slots:
            path = os.path.join(slots, f"{slot}.json")
            rec = json.loads(Path(path).read_text())
            stat = Path(f"/proc/{process.pid}/stat").read_text()
            start = stat[stat.rfind(")") + 2 :].split()[19]
            Path(path).write_text(json.dumps({**rec, "pid": process.pid, "pid_start": start}))
            old_path = os.path.join(slots, f"{old}.json")
            old_rec = json.loads(Path(old_path).read_text())
            Path(old_path).write_text(json.dumps({k: v for k, v in old_rec.items() if k not in ("pid", "pid_start")}))
        shutil.rmtree(tmp_path / "one")  # the ending agent's work dir
        other.reap(set())
        assert os.path.exists(path), "the slot of an agent still running was given back"
        assert not os.path.exists(old_path), "a record naming no agent, of a work dir that is gone, stays"
        process.kill()
        process.wait()
        other.reap(set())
        assert not os.path.exists(path), "the slot of an agent that has ended stays taken"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
