"""The official dstack 0.22.5 CLI's ``dstack offer`` against ``corral server`` (a process) whose ``config.yml`` names
the test cluster: the CPU partition's nodes, region = the cluster; the GPU node for a GPU request only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dstack_client_env import DSTACK_VERSION, ClientInstallError, DstackCli, client_venv, corral_server
from test_slurm_offers import config_yml

from skip_policy import needs_root
from slurm_harness import CPU_NODES, SlurmTestCluster

pytestmark = needs_root("the Slurm cluster runs in network namespaces")

TOKEN = "slurm-offer-token-5d1e"


@pytest.fixture
def dstack_venv() -> Path:
    try:
        return client_venv()
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION}:\n{e}", pytrace=False)


def test_dstack_offer_lists_the_partitions_nodes(slurm: SlurmTestCluster, tmp_path: Path, dstack_venv: Path) -> None:
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "config.yml").write_text(config_yml(slurm, slurm.user_key))
    home, workdir = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    workdir.mkdir()
    with corral_server(tmp_path, TOKEN) as server:
        cli = DstackCli(dstack_venv, home, workdir, server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        res = cli.ok("offer", "--memory", "1GB..", "--json")
        offers = json.loads(res.stdout)["offers"]
        assert {o["instance"]["name"] for o in offers} == set(CPU_NODES), cli.explain(res)  # no GPU asked for
        assert {(o["backend"], o["region"], o["price"]) for o in offers} == {("slurm", "testcluster", 0)}
        res = cli.ok("offer", "--gpu", "A100:1", "--memory", "1GB..")
        assert "slurm (testcluster)" in res.stdout and "g1" in res.stdout, cli.explain(res)
        assert not any(n in res.stdout for n in CPU_NODES), cli.explain(res)
