"""The batch script of an allocation (``backends/slurm/batch.py``, pure): every branch."""

from __future__ import annotations

import subprocess

import pytest

from corral.backends.slurm import batch
from corral.backends.slurm.batch import BatchRequest, SiteOptions

HOME = "/home/alice"
ROWS = ("11111111-aaaa", "22222222-bbbb")


def _req(**kw: object) -> BatchRequest:
    fields: dict[str, object] = dict(
        row_ids=ROWS[:1], server_id="srv1", partitions=("cpu",), cpus=2, memory_mib=4096, gpus=0, gpu_type=None,
        home=HOME, agent_hash="0123456789abcdef" * 4,
    )  # fmt: skip
    fields.update(kw)
    return BatchRequest(**fields)  # type: ignore[arg-type]


def test_cpu_allocation_directives() -> None:
    d = batch.directives(_req())
    assert d == [
        "--job-name=corral-11111111-aaaa",
        "--comment=corral:srv1:11111111-aaaa",
        "--output=/home/alice/.corral/slurm/%j.out",
        "--no-requeue",
        "--partition=cpu",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--mem=4096M",
    ]


def test_gang_gpus_time_and_site_options() -> None:
    site = SiteOptions(
        account="research", qos="high", reservation="r1", time_limit="4:00:00",
        sbatch_options=(("constraint", "ib"), ("exclusive", None)),
    )  # fmt: skip
    d = batch.directives(_req(row_ids=ROWS, partitions=("gpu", "gpu2"), gpus=2, gpu_type="a100", site=site))
    assert "--nodes=2" in d and "--partition=gpu,gpu2" in d and "--gres=gpu:a100:2" in d
    assert "--comment=corral:srv1:11111111-aaaa,22222222-bbbb" in d
    site_part = ["--time=4:00:00", "--account=research", "--qos=high", "--reservation=r1"]
    assert d[-6:] == [*site_part, "--constraint=ib", "--exclusive"]
    assert "--gres=gpu:1" in batch.directives(_req(gpus=1))
    # the run's max_duration wins over the site's default, in whole minutes rounded up
    assert "--time=3" in batch.directives(_req(max_duration=121.0, site=site))
    assert "--time=4:00:00" in batch.directives(_req(max_duration=0.0, site=site))
    assert not [x for x in batch.directives(_req(cpus=0, memory_mib=0)) if x.startswith("--time")]
    assert "--cpus-per-task=1" in batch.directives(_req(cpus=0)) and "--mem=1M" in batch.directives(_req(memory_mib=0))


def test_script_is_valid_shell_and_starts_the_agent_on_every_node() -> None:
    text = batch.script(_req(row_ids=ROWS))
    assert text.startswith("#!/bin/sh\n#SBATCH --job-name=corral-11111111-aaaa\n")
    subprocess.run(["sh", "-n"], input=text.encode(), check=True)
    assert "srun --ntasks-per-node=1" in text
    assert "/home/alice/.corral/agent/agent-0123456789abcdef.pyz" in text
    assert "--endpoint-file" in text and "/home/alice/.corral/slurm/$SLURM_JOB_ID/$SLURMD_NODENAME.json" in text
    assert "kill -TERM" in text
    with pytest.raises(ValueError, match="at least one"):
        batch.script(_req(row_ids=()))


def test_paths_names_and_comments() -> None:
    assert batch.endpoint_path(HOME, "42", "n1") == "/home/alice/.corral/slurm/42/n1.json"
    assert batch.job_name(ROWS) == "corral-11111111-aaaa"
    assert batch.parse_comment("corral:srv1:a,b") == ("srv1", ("a", "b"))
    for other in ("", "corral:srv1", "dstack:srv1:a", "corral::a", "corral:srv1:", "corral:a:b:c"):
        assert batch.parse_comment(other) is None
    assert batch.slurm_minutes(1) == "1" and batch.slurm_minutes(60) == "1" and batch.slurm_minutes(61) == "2"


def test_sbatch_options_are_checked() -> None:
    batch.check_sbatch_options({"constraint": "ib", "--exclusive": None})
    with pytest.raises(ValueError, match="'partition' is set by corral"):
        batch.check_sbatch_options({"partition": "x"})
    with pytest.raises(ValueError, match="'J' is set by corral"):
        batch.check_sbatch_options({"-J": "x"})
    with pytest.raises(ValueError, match="not an sbatch option name"):
        batch.check_sbatch_options({"a b": "x"})
    with pytest.raises(ValueError, match="must be one line"):
        batch.check_sbatch_options({"constraint": "a\n#SBATCH --uid=0"})


@pytest.mark.parametrize("value", ["60", "1:00:00", "2-00", "2-12:30:00", "UNLIMITED", "30:00"])
def test_time_limits_slurm_accepts(value: str) -> None:
    batch.check_time_limit(value)


@pytest.mark.parametrize("value", ["1h", "", "-1", "1:2:3:4"])
def test_time_limits_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time"):
        batch.check_time_limit(value)
