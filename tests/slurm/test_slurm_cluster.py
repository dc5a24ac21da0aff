"""The connection to a real Slurm cluster's login node: commands in a login shell, the shared snapshot (one
``sinfo``/``squeue`` pass for many callers), channels to a node through the login node, call counters."""

from __future__ import annotations

import asyncio

import pytest

from corral.backends.slurm.cluster import SlurmCluster, check_cluster
from corral.backends.slurm.model import SlurmClusterConfig
from corral.backends.slurm.parse import parse_sbatch
from skip_policy import needs_root
from slurm_harness import CPU_NODES, GPU_NODES, USER, SlurmTestCluster

pytestmark = needs_root("the Slurm cluster runs in network namespaces")


def _cluster(slurm: SlurmTestCluster, min_interval: float = 2.0) -> SlurmCluster:
    config = SlurmClusterConfig(name="tc", hostname=slurm.login_ip, user=USER)
    return SlurmCluster(config, slurm.key_pem(), min_interval=min_interval)


async def test_commands_run_as_the_user_in_a_login_shell(slurm: SlurmTestCluster) -> None:
    slurm.as_user("echo 'echo welcome to the cluster' >> ~/.profile")
    cluster = _cluster(slurm)
    try:
        res = await cluster.run("id -un; cat", input="from stdin\n")
        assert (res.exit_status, res.stdout, res.stderr) == (0, f"{USER}\nfrom stdin\n", "")
        failed = await cluster.run("sinfo --no-such-option")
        assert failed.exit_status != 0 and "unrecognized option" in failed.stderr
        job = parse_sbatch((await cluster.run("sbatch --parsable -o /dev/null --wrap 'sleep 60'")).stdout)
        snap = await cluster.snapshot(0)
        assert snap.job(job) is not None and snap.job(job).state in ("PENDING", "RUNNING")  # type: ignore[union-attr]
    finally:
        slurm.as_user("sed -i '/welcome/d' ~/.profile")
        await cluster.aclose()


async def test_snapshot_sees_nodes_partitions_and_jobs(slurm: SlurmTestCluster) -> None:
    cluster = _cluster(slurm)
    try:
        snap = await cluster.snapshot()
        assert sorted(n.name for n in snap.nodes) == sorted(CPU_NODES + GPU_NODES)
        g1 = snap.node("g1")
        assert g1 is not None and (g1.partitions, g1.cpus, g1.memory_mib, g1.gpus) == (("gpu",), 4, 16000, 2)
        assert g1.addr == slurm.hosts.ip("g1") and g1.schedulable
        assert sorted((p.name, p.default, p.up) for p in snap.partitions) == [("cpu", True, True), ("gpu", False, True)]
        details = await cluster.node_details()
        assert {d.name: d.cpus for d in details} == {n: 4 for n in CPU_NODES + GPU_NODES}
    finally:
        await cluster.aclose()


async def test_concurrent_snapshots_make_one_pass(slurm: SlurmTestCluster) -> None:
    cluster = _cluster(slurm)
    try:
        snaps = await asyncio.gather(*(cluster.snapshot(0) for _ in range(20)))
        assert len({id(s) for s in snaps}) == 1
        assert [await cluster.snapshot(0) for _ in range(5)][-1] is snaps[0]  # within min_interval: the same
        assert cluster.calls_per_minute() == {"sinfo": 1.0, "squeue": 1.0}
    finally:
        await cluster.aclose()


async def test_a_pass_every_min_interval_at_most(slurm: SlurmTestCluster) -> None:
    cluster = _cluster(slurm, min_interval=0.3)
    try:
        first = await cluster.snapshot(0)
        await asyncio.sleep(0.4)
        second = await cluster.snapshot(0)
        assert second is not first and second.taken_at > first.taken_at
        assert cluster.calls_per_minute()["squeue"] == 2.0
    finally:
        await cluster.aclose()


async def test_a_channel_to_a_node_through_the_login_node(slurm: SlurmTestCluster) -> None:
    cluster = _cluster(slurm)
    try:
        reader, writer = await cluster.open_connection(slurm.hosts.ip("n1"), 22)
        banner = await asyncio.wait_for(reader.readline(), 5)
        assert banner.startswith(b"SSH-2.0-")
        writer.close()
        with pytest.raises(OSError, match="cannot be reached from the login node"):
            await cluster.open_connection(slurm.hosts.ip("n1"), 1)
    finally:
        await cluster.aclose()


async def test_container_runtimes_are_looked_for_and_none_is_found(slurm: SlurmTestCluster) -> None:
    """The test cluster has neither Pyxis (``srun --help`` lists no ``--container-image``) nor Apptainer or
    Singularity: none is found, and that is said (``()``), not left unknown (``None``)."""
    assert "--container-image" not in slurm.as_user("srun --help")
    cluster = _cluster(slurm)
    try:
        assert cluster.runtimes is None
        await check_cluster(cluster, "clusters[0]")
        assert cluster.runtimes == ()
    finally:
        await cluster.aclose()
