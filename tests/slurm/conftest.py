"""Fixtures of the Slurm backend's tests: one real Slurm cluster on fake hosts for the whole session
(``slurm_harness``), every test starting with all nodes idle and no job, and leaving none behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import slurm_harness
from slurm_harness import NODES, SlurmTestCluster


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestCluster]:
    if os.geteuid() != 0:
        pytest.fail("the Slurm tests need root (network namespaces); CI runs them as root")
    if not slurm_harness.installed():
        pytest.fail(
            "Slurm is not installed: apt-get install --no-install-recommends slurmctld slurmd slurm-client munge"
        )
    cluster = SlurmTestCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


#: The node states ``scontrol update state=resume`` accepts (slurm's scontrol(1), NodeName ... State=RESUME); it
#: refuses any other ("Invalid node state specified"), e.g. a node still completing or not responding.
RESUMABLE = frozenset({"down", "drained", "draining", "drain", "fail", "failing"})


@pytest.fixture
def slurm(slurm_session: SlurmTestCluster) -> Iterator[SlurmTestCluster]:
    """The cluster with every node idle, no job and the partitions' configured ``MaxTime``, before and after the
    test."""
    slurm_session.cancel_all()
    for partition in ("cpu", "gpu"):
        slurm_session.set_max_time(partition, "60")
    for node, state in slurm_session.node_states().items():
        if state.rstrip("*~#!%$@^-+") in RESUMABLE:  # a test drained or downed it; other states pass by themselves
            slurm_session.resume(node)
    slurm_session.wait_nodes(NODES, "idle", timeout=60)  # (its error names every node's state)
    yield slurm_session
    slurm_session.cancel_all()
