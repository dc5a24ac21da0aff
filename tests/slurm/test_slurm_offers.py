"""Offers of a Slurm cluster through a server whose ``config.yml`` names it (dstack's fields): one per node and
partition as Slurm reports it, region = the cluster, zone = the partition, price 0; GPUs only in the GPU
partition, as the model it is mapped to, and the GPU partition only for runs that ask for GPUs; a drained node
gone from ``corral offer`` one refresh later."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from corral.cli import render
from corral.cli.main import run
from corral.sdk import config_file
from server_harness import RunningServer, make_settings, running_server
from skip_policy import needs_root
from slurm_harness import CPU_NODES, GPU_NODES, USER, SlurmTestCluster

pytestmark = [needs_root("the Slurm cluster runs in network namespaces"), pytest.mark.asyncio(loop_scope="module")]

#: The model of the test cluster's GPU partition as an operator would name it (the fake GPUs are A100 80GB:
#: tests/slurm_harness.py's fake nvidia-smi).
GPU = "A100:80GB"


def config_yml(slurm: SlurmTestCluster, key_path: Path, extra: str = "") -> str:
    return f"""projects:
- name: main
  backends:
  - type: slurm
    clusters:
    - name: testcluster
      hostname: {slurm.login_ip}
      user: {USER}
      private_key:
        path: {key_path}
      gpu_partitions:
      - gpu: {GPU}
        partitions: [gpu]
      cpu_partitions: [cpu]
{extra}"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, slurm_session: SlurmTestCluster
) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path_factory.mktemp("slurm-offers"))
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(config_yml(slurm_session, slurm_session.user_key))
    async with running_server(settings) as s:
        yield s


@pytest.fixture
def corral(
    server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., str]:
    """``corral ARGS...`` against the server (in a thread: the server answers on this loop); its stdout."""
    monkeypatch.setenv("CORRAL_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("COLUMNS", "250")
    config_file.add_project("main", server.url, server.token)

    def invoke(*argv: str) -> str:
        render.reset_console()
        code = run(list(argv))
        out = capsys.readouterr().out
        assert code == 0, out
        return out

    return invoke


async def _offers(corral: Callable[..., str], *args: str) -> list[dict[str, Any]]:
    data = json.loads(await asyncio.to_thread(corral, "offer", "--json", "--max-offers", "100", *args))
    return list(data["offers"])


def _where(offer: dict[str, Any]) -> tuple[str, str]:
    return offer["instance"]["name"], offer["region"]


async def test_corral_offer_lists_every_node_of_the_cluster(
    corral: Callable[..., str], slurm: SlurmTestCluster
) -> None:
    offers = await _offers(corral, "--memory", "1GB..")
    assert sorted({_where(o) for o in offers}) == sorted((n, "testcluster") for n in CPU_NODES)  # no GPU asked for
    assert sorted(o["instance"]["resources"]["cpus"] for o in offers if o["instance"]["name"] == "n1") == [1, 2, 4]
    offers += await _offers(corral, "--memory", "1GB..", "--gpu", "2")
    by_node = {o["instance"]["name"]: o for o in offers}  # each node's largest share last
    assert {o["backend"] for o in offers} == {"slurm"} and {o["price"] for o in offers} == {0}
    assert by_node["n1"]["instance"]["resources"]["cpus"] == 4
    assert by_node["n1"]["instance"]["resources"]["memory_mib"] == 16000
    assert by_node["n1"]["instance"]["resources"]["gpus"] == []
    gpus = by_node["g1"]["instance"]["resources"]["gpus"]
    assert [(g["name"], g["memory_mib"], g["vendor"]) for g in gpus] == [("A100", 80 * 1024, "nvidia")] * 2
    table = await asyncio.to_thread(corral, "offer", "--gpu", "1..")
    assert "slurm (testcluster)" in table and "g1" in table and "n1" not in table


async def test_gpu_offers_only_on_the_gpu_node(corral: Callable[..., str], slurm: SlurmTestCluster) -> None:
    offers = await _offers(corral, "--gpu", "A100:1", "--memory", "1GB..")
    assert [_where(o) for o in offers] == [("g1", "testcluster")]
    (one,) = offers  # one of its two GPUs, with half its CPUs and memory
    assert (one["instance"]["resources"]["cpus"], one["instance"]["resources"]["memory_mib"]) == (2, 8000)
    assert [_where(o) for o in await _offers(corral, "--gpu", "2", "--memory", "1GB..")] == [("g1", "testcluster")]
    assert await _offers(corral, "--gpu", "H100") == []
    assert await _offers(corral, "--gpu", "A100:3") == []


async def test_a_drained_node_is_gone_within_one_refresh(
    corral: Callable[..., str], slurm: SlurmTestCluster, server: RunningServer
) -> None:
    slurm.drain("n2", "bad disk")
    deadline = time.monotonic() + server.ctx.slurm.refresh_every * 2 + 5
    names = {o["instance"]["name"] for o in await _offers(corral, "--memory", "1GB..")}
    while "n2" in names and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        names = {o["instance"]["name"] for o in await _offers(corral, "--memory", "1GB..")}
    assert "n2" not in names and "n1" in names
    slurm.resume("n2")
    deadline = time.monotonic() + server.ctx.slurm.refresh_every * 2 + 5
    while "n2" not in names and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        names = {o["instance"]["name"] for o in await _offers(corral, "--memory", "1GB..")}
    assert "n2" in names


async def test_fleet_and_run_plans_list_the_partitions_nodes(server: RunningServer, slurm: SlurmTestCluster) -> None:
    fleet = {"type": "fleet", "name": "hpc", "nodes": "0..2", "backends": ["slurm"], "resources": {"memory": "1GB.."}}
    spec = {"configuration": fleet, "profile": {}}

    def task(resources: dict[str, Any]) -> dict[str, Any]:
        conf = {"type": "task", "commands": ["true"], "resources": resources}
        return {"run_spec": {"configuration": conf, "repo_id": "x", "repo_data": {"repo_type": "virtual"}}}

    async with server.client() as c:
        r = await c.post("/api/project/main/fleets/get_plan", json={"spec": spec})
        assert r.status_code == 200, r.text
        assert {o["instance"]["name"] for o in r.json()["offers"]} == set(CPU_NODES + GPU_NODES)  # a fleet: any run
        body = {"force": False, "plan": {"spec": spec, "current_resource": None}}
        assert (await c.post("/api/project/main/fleets/apply", json=body)).status_code == 200
        try:
            r = await c.post("/api/project/main/runs/get_plan", json=task({"cpu": "1..", "memory": "1GB.."}))
            assert r.status_code == 200, r.text
            offers = r.json()["job_plans"][0]["offers"]
            assert {o["instance"]["name"] for o in offers} == set(CPU_NODES), r.text
            assert {(o["backend"], o["region"]) for o in offers} == {("slurm", "testcluster")}
            r = await c.post("/api/project/main/runs/get_plan", json=task({"gpu": "A100:1", "memory": "1GB.."}))
            assert [o["instance"]["name"] for o in r.json()["job_plans"][0]["offers"]] == ["g1"]
        finally:
            assert (await c.post("/api/project/main/fleets/delete", json={"names": ["hpc"]})).status_code == 200
