"""The parsers of Slurm's outputs, on outputs captured from Slurm 22.05 (``tests/data/slurm/``, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.backends.slurm import parse

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_sinfo_of_an_idle_cluster() -> None:
    nodes, partitions = parse.parse_sinfo(_read("sinfo-idle.txt"))
    assert [(n.name, n.state, n.partitions, n.cpus, n.memory_mib, n.gpus) for n in nodes] == [
        ("g1", "idle", ("gpu",), 4, 16000, 2),
        *[(f"n{i}", "idle", ("cpu",), 4, 16000, 0) for i in range(1, 5)],
    ]
    assert nodes[0].gres == "gpu:a100:2" and nodes[1].gres == "" and nodes[0].addr.endswith(".17")
    assert all(n.schedulable for n in nodes)
    assert partitions == (
        parse.SlurmPartition("gpu", False, True, "1:00:00"),
        parse.SlurmPartition("cpu", True, True, "1:00:00"),
    )


def test_sinfo_of_a_busy_cluster_with_drained_down_and_silent_nodes() -> None:
    nodes, _ = parse.parse_sinfo(_read("sinfo-busy.txt"))
    assert {n.name: (n.state, n.schedulable) for n in nodes} == {
        "g1": ("mixed", True),
        "n1": ("mixed", True),
        "n2": ("mixed", True),
        "n3": ("drained", False),
        "n4": ("down", False),
    }
    silent = {n.name: n for n in parse.parse_sinfo(_read("sinfo-not-responding.txt"))[0]}["n4"]
    assert (silent.state, silent.flags, silent.schedulable) == ("idle", "*", False)


def test_a_node_in_two_partitions_is_one_node() -> None:
    text = (
        "a1|10.0.0.1|idle~|batch*|up|infinite|64|512000+|gpu:h100:8(S:0-1)\n"
        "a1|10.0.0.1|idle~|long|down|7-00:00:00|64|512000|gpu:h100:8(S:0-1)\n"
    )
    nodes, partitions = parse.parse_sinfo(text)
    assert len(nodes) == 1 and nodes[0].partitions == ("batch", "long") and nodes[0].memory_mib == 512000
    assert nodes[0].gpus == 8 and nodes[0].flags == "~" and nodes[0].schedulable
    assert [(p.name, p.default, p.up) for p in partitions] == [("batch", True, True), ("long", False, False)]


def test_sinfo_in_another_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="expected 9 fields"):
        parse.parse_sinfo("PARTITION AVAIL TIMELIMIT NODES STATE NODELIST\n")


def test_squeue_running_pending_and_ended() -> None:
    jobs = parse.parse_squeue(_read("squeue-busy.txt"))
    by_id = {j.id: j for j in jobs}
    assert by_id["1"].nodes == ("n1", "n2") and by_id["1"].state == "RUNNING" and by_id["1"].comment == ""
    assert by_id["2"].comment == "corral:s1:r2" and by_id["2"].partition == "gpu" and by_id["2"].nodes == ("g1",)
    assert by_id["3"].state == "PENDING" and by_id["3"].reason.startswith("Nodes required for job are DOWN")
    assert by_id["4"].name == "pinned" and by_id["4"].nodes == () and by_id["4"].time_limit == "1:00:00"
    assert {j.state for j in parse.parse_squeue(_read("squeue-ended.txt"))} == {"CANCELLED"}
    assert parse.parse_squeue("\n") == ()
    with pytest.raises(ValueError, match="expected 8 fields"):
        parse.parse_squeue("JOBID PARTITION NAME\n")


def test_a_comment_may_hold_the_separator() -> None:
    (job,) = parse.parse_squeue("7|x|RUNNING|None|n1|cpu|5:00|a|b\n")
    assert job.comment == "a|b"


def test_scontrol_show_node() -> None:
    nodes = parse.parse_scontrol_nodes(_read("scontrol-show-node-busy.txt"))
    n3 = {n.name: n for n in nodes}["n3"]
    assert (n3.state, n3.reason, n3.cpus, n3.memory_mib, n3.partitions, n3.arch) == (
        "drained",
        "disk failure [root@2026-12-06T10:59:06]",
        4,
        16000,
        ("cpu",),
        "x86_64",
    )
    g1 = {n.name: n for n in nodes}["g1"]
    assert (g1.state, g1.gres, g1.hostname) == ("mixed", "gpu:a100:2", "g1") and g1.addr.endswith(".17")
    assert {n.state for n in parse.parse_scontrol_nodes(_read("scontrol-show-node.txt"))} == {"idle"}
    assert parse.parse_scontrol_line("NodeName=x OS=Linux 6.1 #1 SMP Gres=(null)") == {
        "NodeName": "x",
        "OS": "Linux 6.1 #1 SMP",
        "Gres": "(null)",
    }


def test_scontrol_cpus_without_cpuefctv_and_states_with_drain() -> None:
    (old,) = parse.parse_scontrol_nodes("\nNodeName=a CPUTot=8 State=MIXED+DRAIN\n")
    assert (old.cpus, old.memory_mib, old.state, old.partitions, old.addr) == (8, 0, "draining", (), "")
    (bare,) = parse.parse_scontrol_nodes("NodeName=b")
    assert (bare.cpus, bare.state) == (0, "")
    assert parse.split_state("IDLE+DRAIN") == ("drained", "")
    assert parse.split_state("down*") == ("down", "*")
    assert parse.split_state("IDLE+CLOUD") == ("idle", "")
    with pytest.raises(ValueError, match="no NodeName"):
        parse.parse_scontrol_nodes("Node b not found")


def test_sbatch_parsable() -> None:
    assert parse.parse_sbatch(_read("sbatch-parsable.txt")) == "1"
    assert parse.parse_sbatch("1234;cluster2\n") == "1234"
    for bad in ("", "sbatch: error: Batch job submission failed: Invalid account\n"):
        with pytest.raises(ValueError, match="not a job id"):
            parse.parse_sbatch(bad)


def test_gres_gpus() -> None:
    assert [parse.gres_gpus(g) for g in ("gpu:8", "gpu:a100:2", "gpu:tesla:4(S:0-1)", "gpu:a100:2,shard:4", "")] == [
        8,
        2,
        4,
        2,
        0,
    ]
    assert parse.gres_gpus("gpu:a100:2(S:0),gpu:v100:1") == 3
    assert parse.gres_gpus("gpu") == 0 and parse.gres_gpus("mps:100") == 0


def test_host_lists() -> None:
    assert parse.expand_hostlist("n[1-3,5],g1") == ("n1", "n2", "n3", "n5", "g1")
    assert parse.expand_hostlist("n[01-02]-ib") == ("n01-ib", "n02-ib")
    assert parse.expand_hostlist("rack[1-2]n[1-2]") == ("rack1n1", "rack1n2", "rack2n1", "rack2n2")
    assert parse.expand_hostlist("") == () and parse.expand_hostlist("(null)") == ()


def test_a_snapshot_finds_its_nodes_and_jobs() -> None:
    nodes, partitions = parse.parse_sinfo("\n" + _read("sinfo-busy.txt"))
    snap = parse.ClusterSnapshot(1.0, nodes, partitions, parse.parse_squeue(_read("squeue-busy.txt")))
    assert snap.node("n3") is not None and snap.node("n3").state == "drained"  # type: ignore[union-attr]
    assert snap.node("x") is None
    assert snap.job("2") is not None and snap.job("2").comment == "corral:s1:r2"  # type: ignore[union-attr]
    assert snap.job("99") is None


def test_container_runtimes_as_the_probe_prints_them() -> None:
    assert parse.parse_runtimes("singularity\npyxis\n") == ("pyxis", "singularity")
    assert parse.parse_runtimes("") == () and parse.parse_runtimes("docker\n") == ()
