"""The test cluster itself: five idle nodes, jobs across nodes, GPUs on the GPU node only, SSH as the cluster
user with its own key, a home shared by every host, and a teardown that leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import asyncssh
import pytest

from skip_policy import needs_root
from slurm_harness import CPU_NODES, GPU_NODES, HOME, USER, SlurmTestCluster

pytestmark = needs_root("the Slurm cluster runs in network namespaces")


def test_five_nodes_idle_in_two_partitions(slurm: SlurmTestCluster) -> None:
    out = slurm.root("login", "sinfo -h -N -o '%N %P %T %c %m %G'")
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == sorted(
        [[n, "cpu*", "idle", "4", "16000", "(null)"] for n in CPU_NODES]
        + [[n, "gpu", "idle", "4", "16000", "gpu:a100:2"] for n in GPU_NODES]
    )


def test_srun_across_two_nodes_as_the_cluster_user(slurm: SlurmTestCluster) -> None:
    out = slurm.as_user("srun -N2 sh -c 'echo $(hostname) $(id -un) $SLURM_NODEID'")
    hosts = sorted(line.split() for line in out.splitlines())
    assert len(hosts) == 2 and {h[0] for h in hosts} <= set(CPU_NODES) and hosts[0][0] != hosts[1][0]
    assert {h[1] for h in hosts} == {USER}
    assert sorted(h[2] for h in hosts) == ["0", "1"]


def test_gpus_only_on_the_gpu_node(slurm: SlurmTestCluster) -> None:
    out = slurm.as_user("srun -p gpu --gres=gpu:2 sh -c 'echo $(hostname) $CUDA_VISIBLE_DEVICES; nvidia-smi'")
    assert out.splitlines()[0] == "g1 0,1"
    assert "A100" in out
    with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
        slurm.as_user("srun -p cpu --gres=gpu:1 --immediate=5 hostname")


def test_home_is_shared_and_python_runs_on_the_nodes(slurm: SlurmTestCluster) -> None:
    slurm.as_user(f"echo written-on-login > {HOME}/shared.txt")
    out = slurm.as_user("srun -w n3 sh -c 'cat ~/shared.txt; python3 -c \"print(6 * 7)\"'")
    assert out.split() == ["written-on-login", "42"]


async def test_ssh_to_the_login_node_with_the_users_key(slurm: SlurmTestCluster) -> None:
    key = asyncssh.import_private_key(slurm.key_pem())
    async with asyncssh.connect(slurm.login_ip, username=USER, client_keys=[key], known_hosts=None) as conn:
        res = await conn.run("bash -lc 'id -u; sinfo -h -o %P'", check=True)
    assert str(res.stdout).split() == ["4242", "cpu*", "gpu"]
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            slurm.login_ip,
            username=USER,
            client_keys=[asyncssh.import_private_key(slurm.wrong_key_pem())],
            known_hosts=None,
        )


def test_drain_and_resume(slurm: SlurmTestCluster) -> None:
    slurm.drain("n2")
    assert slurm.node_states()["n2"] == "drained"
    slurm.resume("n2")
    assert slurm.node_states()["n2"] == "idle"


def test_teardown_leaves_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    cluster = SlurmTestCluster(tmp_path_factory.mktemp("slurm-teardown")).start()
    n = cluster.hosts.n
    namespaces = [f"cfh{n}h{name}" for name in cluster.hosts.hosts]
    pids = [int(p) for ns in namespaces for p in _run("ip", "netns", "pids", ns).split()]
    daemons = {_run("ps", "-o", "comm=", "-p", str(p)).strip() for p in pids}
    assert {"slurmctld", "slurmd", "munged", "sshd"} <= daemons
    cluster.stop()
    deadline = time.monotonic() + 15  # the kernel kills a PID namespace's processes when its init dies
    while [p for p in pids if os.path.exists(f"/proc/{p}")] and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {p: _run("ps", "-o", "stat=,comm=", "-p", str(p)).strip() for p in pids if os.path.exists(f"/proc/{p}")}
    assert not left
    # the /24 is free now: another run on this machine may claim it at once (its pid in the owner file)
    owner = Path(f"/run/corral-fakehosts/{n}")
    reclaimed = owner.exists() and owner.read_text().strip() != str(os.getpid())
    assert reclaimed or not [ns for ns in namespaces if ns in _run("ip", "netns", "list")]
    assert reclaimed or f"cfh{n}br" not in _run("ip", "link", "show")


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout
