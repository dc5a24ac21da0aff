"""Configuring the Slurm backend (dstack's fields), through the backends API and the server's ``config.yml``,
against the real test cluster: what works is stored with its credentials sealed and answered without them; what
does not is a 400 (or a start-up error) naming the field: the login node unreachable, a wrong key, the controller
down (``scontrol ping``), a partition the cluster does not have, a GPU model that is not one, or two models for
one partition. corral's extensions are refused through the API."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from corral.config.server_config import ServerConfigError
from corral.server import prepare
from server_harness import RunningServer, make_settings, running_server
from skip_policy import needs_root
from slurm_harness import USER, SlurmTestCluster

pytestmark = [needs_root("the Slurm cluster runs in network namespaces"), pytest.mark.asyncio(loop_scope="module")]

P = "/api/project/main/backends"


def backend(slurm: SlurmTestCluster, **cluster: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": "testcluster",
        "hostname": slurm.login_ip,
        "user": USER,
        "private_key": {"content": slurm.key_pem()},
        "gpu_partitions": [{"gpu": "A100:80GB", "partitions": ["gpu"]}],
        "cpu_partitions": ["cpu"],
    }
    c.update(cluster)
    return {"type": "slurm", "clusters": [{k: v for k, v in c.items() if v is not None}]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, slurm_session: SlurmTestCluster
) -> AsyncIterator[RunningServer]:
    async with running_server(make_settings(tmp_path_factory.mktemp("slurm-config"))) as s:
        yield s


async def _create(server: RunningServer, body: dict[str, Any]) -> tuple[int, str]:
    async with server.client() as c:
        r = await c.post(f"{P}/create", json=body)
        if r.status_code == 200:
            assert (await c.post(f"{P}/delete", json={"backends_names": ["slurm"]})).status_code == 200
        return r.status_code, r.text


async def test_a_working_backend_is_stored_sealed_and_answered_without_credentials(
    server: RunningServer, slurm: SlurmTestCluster
) -> None:
    body = backend(slurm)
    answer = {
        "type": "slurm",
        "clusters": [
            {
                "name": "testcluster",
                "gpu_partitions": [{"gpu": "A100:80GB", "partitions": ["gpu"]}],
                "cpu_partitions": ["cpu"],
            }
        ],
    }
    key_body = "".join(slurm.key_pem().splitlines()[1:-1])
    async with server.client() as c:
        r = await c.post(f"{P}/create", json=body)
        assert r.status_code == 200, r.text
        assert r.json() == answer
        assert (await c.post(f"{P}/slurm/config_info")).json() == answer
        text = (await c.post(f"{P}/slurm/get_yaml")).text
        assert slurm.login_ip not in text and key_body[:40] not in text and USER not in text
        db = (server.settings.server_dir / "data" / "corral.db").read_bytes()
        assert key_body[:40].encode() not in db and slurm.login_ip.encode() not in db
        assert [c.name for c in server.ctx.slurm.clusters()] == ["testcluster"]
        assert {o.instance_type for o in server.ctx.slurm.offers()} >= {"n1", "g1"}
        r = await c.post(f"{P}/update", json=backend(slurm, cpu_partitions=None))
        assert r.status_code == 200, r.text
        assert "cpu_partitions" not in r.json()["clusters"][0]
        assert (await c.post(f"{P}/create", json=body)).status_code == 400  # exists
        assert (await c.post(f"{P}/delete", json={"backends_names": ["slurm"]})).status_code == 200
        assert server.ctx.slurm.clusters() == []


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"port": 2}, "clusters[0].hostname", "cannot reach the login node"),
        ({"private_key": "wrong"}, "clusters[0].private_key", "did not accept the key"),
        (
            {"gpu_partitions": [{"gpu": "A100:80GB", "partitions": ["gpus"]}]},
            "clusters[0].gpu_partitions[0].partitions",
            "no partition 'gpus'",
        ),
        ({"cpu_partitions": ["cpu", "debug"]}, "clusters[0].cpu_partitions", "no partition 'debug'"),
        (
            {"gpu_partitions": [{"gpu": "A100", "partitions": ["gpu"]}]},
            "clusters[0].gpu_partitions[0].gpu",
            "multiple matching GPU models",
        ),
        (
            {"gpu_partitions": [{"gpu": "Z9000", "partitions": ["gpu"]}]},
            "clusters[0].gpu_partitions[0].gpu",
            "not a known GPU model",
        ),
        (
            {"gpu_partitions": [{"gpu": "A100:80GB", "partitions": ["gpu"]}, {"gpu": "H100", "partitions": ["gpu"]}]},
            "clusters[0]",
            "mapped to two GPU models",
        ),
        ({"account": "research"}, "clusters[0].account", "config.yml only"),
        ({"private_key": {"path": "/etc/shadow"}}, "clusters[0].private_key.path", "give the key itself"),
        ({"hostname": None}, "clusters[0].hostname", "Field required"),
    ],
)
async def test_a_backend_that_does_not_work_is_refused_naming_the_field(
    server: RunningServer, slurm: SlurmTestCluster, change: dict[str, Any], field: str, words: str
) -> None:
    if change.get("private_key") == "wrong":
        change = {"private_key": {"content": slurm.wrong_key_pem()}}
    status, text = await _create(server, backend(slurm, **copy.deepcopy(change)))
    assert status == 400, text
    assert f"{field}:" in text and words in text, text


async def test_the_controller_down_is_refused(server: RunningServer, slurm: SlurmTestCluster) -> None:
    slurm.stop_controller()
    try:
        status, text = await _create(server, backend(slurm))
    finally:
        slurm.start_controller()
    assert status == 400 and "clusters[0]: `scontrol ping` on the login node failed" in text, text


def _config_yml(slurm: SlurmTestCluster, key: Path, extra: str = "") -> str:
    return f"""projects:
- name: main
  backends:
  - type: slurm
    clusters:
    - name: testcluster
      hostname: {slurm.login_ip}
      user: {USER}
      private_key: {{path: {key}}}
      gpu_partitions: [{{gpu: A100:80GB, partitions: [gpu]}}]
{extra}"""


async def test_config_yml_takes_the_extensions_and_a_broken_one_stops_the_start(
    tmp_path: Path, slurm: SlurmTestCluster
) -> None:
    settings = make_settings(tmp_path)
    settings.server_dir.mkdir(parents=True)
    extensions = (
        "      account: research\n      qos: normal\n      time_limit: '30'\n      reservation: maint\n"
        "      sbatch_options: {constraint: fast, exclusive: null}\n"
    )
    (settings.server_dir / "config.yml").write_text(_config_yml(slurm, slurm.user_key, extensions))
    async with running_server(settings) as s:
        (cluster,) = s.ctx.slurm.clusters()
        site = cluster.config.site_options()
        assert (site.account, site.qos, site.time_limit, site.reservation) == ("research", "normal", "30", "maint")
        assert site.sbatch_options == (("constraint", "fast"), ("exclusive", None))
    for extra, field in (
        ("      sbatch_options: {job-name: x}\n", "clusters[0].sbatch_options"),
        ("      time_limit: soon\n", "clusters[0].time_limit"),
    ):
        (settings.server_dir / "config.yml").write_text(_config_yml(slurm, slurm.user_key, extra))
        with pytest.raises(
            ServerConfigError, match=rf"project main: backend slurm: .*{field.replace('[', '.').replace(']', '.')}"
        ):
            await prepare(settings)
    other = (
        _config_yml(slurm, slurm.user_key).replace("- name: main", "- name: other").replace(f"user: {USER}", "user: x")
    )
    (settings.server_dir / "config.yml").write_text(_config_yml(slurm, slurm.user_key) + other.split("\n", 1)[1])
    with pytest.raises(
        ServerConfigError, match=r"project other: backend slurm: .*clusters\[0\]\.name: project main has"
    ):
        await prepare(settings)
    (settings.server_dir / "config.yml").write_text(_config_yml(slurm, slurm.hosts.wrong_key))
    with pytest.raises(ServerConfigError, match=r"project main: backend slurm: .*clusters\[0\]\.private_key: "):
        await prepare(settings)
    (settings.server_dir / "config.yml").write_text(_config_yml(slurm, tmp_path / "missing_key"))
    with pytest.raises(ServerConfigError, match=r"private_key: .*cannot read"):
        await prepare(settings)
