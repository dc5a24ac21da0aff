"""The offers of a Slurm cluster (``backends.slurm.offers``, pure), from ``sinfo`` outputs captured from Slurm 22.05
(``tests/data/slurm/``) and a few written in its format."""

from __future__ import annotations

from pathlib import Path

from corral.backends.slurm.model import GpuPartitions, SlurmClusterConfig, cluster_config
from corral.backends.slurm.offers import cpu_shares, node_offers
from corral.backends.slurm.parse import ClusterSnapshot, parse_sinfo
from corral.domain.gpu_models import GpuModel
from corral.domain.resources import Gpu

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
A100 = GpuModel("nvidia", "A100", 80 * 1024)
CONFIG = SlurmClusterConfig(
    name="tc", hostname="login", user="u", gpu_partitions=(GpuPartitions(A100, ("gpu",)),), cpu_partitions=("cpu",)
)


def _snap(text: str) -> ClusterSnapshot:
    nodes, partitions = parse_sinfo(text)
    return ClusterSnapshot(0.0, nodes, partitions, ())


def test_every_node_once_per_partition_cpu_first_gpu_in_shares() -> None:
    offers = node_offers(CONFIG, _snap((DATA / "sinfo-idle.txt").read_text()))
    assert [(o.instance_type, o.zone, o.resources.cpus, len(o.resources.gpus)) for o in offers] == [
        *[(n, "cpu", k, 0) for n in ("n1", "n2", "n3", "n4") for k in (1, 2, 4)],
        ("g1", "gpu", 2, 1),
        ("g1", "gpu", 4, 2),
    ]
    assert [o.resources.memory_mib for o in offers[:3]] == [4000, 8000, 16000]
    half, whole = offers[-2:]
    assert (half.resources.cpus, half.resources.memory_mib, whole.resources.cpus, whole.resources.memory_mib) == (
        2,
        8000,
        4,
        16000,
    )
    assert {(o.backend, o.region, o.price) for o in offers} == {("slurm", "tc", 0.0)}
    assert [o.gpu_jobs_only for o in offers] == [False] * 12 + [True] * 2
    assert whole.resources.gpus[0] == Gpu("A100", 81920)


def test_drained_down_and_silent_nodes_are_not_offered() -> None:
    busy = {o.instance_type for o in node_offers(CONFIG, _snap((DATA / "sinfo-busy.txt").read_text()))}
    assert busy == {"n1", "n2", "g1"}  # n3 drained, n4 down; busy nodes are offered
    silent = {o.instance_type for o in node_offers(CONFIG, _snap((DATA / "sinfo-not-responding.txt").read_text()))}
    assert silent == {"n1", "n2", "g1"}  # n3 drained, n4 not responding


def test_partitions_by_the_configuration() -> None:
    text = (
        "a|1|idle|cpu*|up|1:00:00|8|1000|(null)\n"
        "a|1|idle|debug|up|1:00:00|8|1000|(null)\n"
        "b|2|idle|gpu|up|1:00:00|8|1000|(null)\n"  # a GPU partition's node without GPUs
        "c|3|idle|down|down|1:00:00|8|1000|(null)\n"  # a partition that is down
    )
    snap = _snap(text)
    assert [(o.instance_type, o.zone, o.resources.cpus) for o in node_offers(CONFIG, snap)] == [
        ("a", "cpu", k) for k in (1, 2, 4, 8)
    ]
    default = cluster_config(
        {"name": "tc", "hostname": "h", "user": "u", "gpu_partitions": [{"gpu": "A100:80GB", "partitions": ["gpu"]}]}
    )
    assert {(o.instance_type, o.zone) for o in node_offers(default, snap)} == {("a", "cpu"), ("a", "debug")}
    assert default.cpu_partitions is None and default.port == 22 and default.named_partitions() == ("gpu",)
    assert CONFIG.named_partitions() == ("gpu", "cpu")
    assert default.is_cpu_partition("nowhere", ("cpu",)) is False


def test_cpu_shares_are_powers_of_two_and_the_whole_node() -> None:
    assert [cpu_shares(n) for n in (1, 2, 6, 8)] == [[1], [1, 2], [1, 2, 4, 6], [1, 2, 4, 8]]


def test_the_stored_document_as_the_backend_reads_it() -> None:
    c = cluster_config(
        {
            "name": "tc",
            "hostname": "h",
            "user": "u",
            "port": 2222,
            "cpu_partitions": [],
            "account": "a",
            "sbatch_options": {"constraint": "ib", "exclusive": None},
        }
    )
    assert (c.port, c.cpu_partitions, c.gpu_model("gpu")) == (2222, (), None)
    assert c.site_options().sbatch_options == (("constraint", "ib"), ("exclusive", None))
    assert c.site_options().account == "a"
