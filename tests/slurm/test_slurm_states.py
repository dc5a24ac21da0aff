"""Slurm's job states and pending reasons as corral reads them (``backends/slurm/states.py``, pure).

The reason and state words are Slurm's (https://slurm.schedmd.com/job_reason_codes.html,
https://slurm.schedmd.com/squeue.html); the ones seen on Slurm 22.05.8 here are in the reference's §4."""

from __future__ import annotations

import pytest

from corral.backends.slurm import states

SEEN_WAITING = ["Resources", "Priority", "ReqNodeNotAvail, UnavailableNodes:n1", "JobHeldUser", ""]
SEEN_NEVER = ["PartitionConfig", "BadConstraints", "QOSNotAllowed", "InvalidAccount", "DependencyNeverSatisfied"]


@pytest.mark.parametrize("reason", SEEN_WAITING)
def test_reasons_that_wait(reason: str) -> None:
    assert states.pending_verdict(reason, 10.0, 1800.0) is None


@pytest.mark.parametrize("reason", SEEN_NEVER)
def test_reasons_that_never_start(reason: str) -> None:
    assert states.pending_verdict(reason, 0.0, 1800.0) == f"Slurm says the job can never start: {reason}"


def test_pinned_node_not_available_never_starts_and_the_limit() -> None:
    assert states.never_starts("ReqNodeNotAvail, UnavailableNodes:n1", pinned=True)
    verdict = states.pending_verdict("Resources", 1800.0, 1800.0)
    assert verdict == "still pending after 1800s (the limit is 1800s): Resources"
    assert states.pending_verdict("", 5.0, 5.0) == "still pending after 5s (the limit is 5s): no reason"
    assert states.pending_verdict("Resources", 10**6, 0.0) is None  # 0: no limit


def test_ended_messages() -> None:
    assert "is gone" in states.ended_message("7", None)
    assert "interruption" in states.ended_message("7", "NODE_FAIL")
    assert "interruption" in states.ended_message("7", "PREEMPTED")
    assert "interruption" in states.ended_message("7", "TIMEOUT")
    assert "(an error)" in states.ended_message("7", "OUT_OF_MEMORY")
    assert states.ended_message("7", "CANCELLED") == "Slurm job 7 ended CANCELLED outside corral"


def test_node_states() -> None:
    for lost in ("down", "down*", "fail", "failing", "DOWN~"):
        assert states.node_lost(lost)
    for fine in ("idle", "alloc", "mixed", "drained", "draining", "drng", ""):
        assert not states.node_lost(fine)


def test_endpoint_lines() -> None:
    text = (
        'n1 10.0.0.1 {"url": "http://10.0.0.1:4000", "token": "t1"}\n'
        "n2 10.0.0.2 -\n"
        'n3  {"url": "http://n3:1", "token": "t3"}\n'
        "n4 10.0.0.4 {not json\n"
        'n5 10.0.0.5 {"url": 5, "token": "x"}\n'
        "\n lonely\n"
    )
    nodes = states.parse_endpoints(text)
    assert [n.node for n in nodes] == ["n1", "n2", "n3", "n4", "n5"]
    assert nodes[0] == states.NodeEndpoint("n1", "10.0.0.1", "http://10.0.0.1:4000", "t1")
    assert nodes[1].url is None and nodes[3].url is None and nodes[4].url is None
    assert nodes[2].addr == "n3"  # no NodeAddr printed: the node's name
    assert states.all_written(nodes[:1], 1) and not states.all_written(nodes[:2], 2)
    assert not states.all_written(nodes[:1], 2)
    assert states.parse_endpoints("n6 10.0.0.6") == [states.NodeEndpoint("n6", "10.0.0.6", None, None)]


def test_the_longest_pending_time_setting() -> None:
    from corral.settings import Settings, SettingsError

    assert Settings.from_env({}).slurm_max_pending == 1800.0
    assert Settings.from_env({"CORRAL_SLURM_MAX_PENDING": "0"}).slurm_max_pending == 0.0
    assert Settings.from_env({"CORRAL_SLURM_MAX_PENDING": "90"}).slurm_max_pending == 90.0
    with pytest.raises(SettingsError, match="CORRAL_SLURM_MAX_PENDING must be a number of seconds"):
        Settings.from_env({"CORRAL_SLURM_MAX_PENDING": "-5"})
