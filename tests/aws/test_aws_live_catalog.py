"""gpuhunt's published AWS catalogue, laid out as gpuhunt publishes it (``<base>/aws/version``,
``<base>/aws/<version>/catalog.zip`` holding ``aws.csv``) under a local ``file://`` base: a server with the
AWS backend (credentials checked against moto) fetches it in the background -- start-up and requests never
wait for it --, prices offers from it, keeps it in its state directory and uses that copy on a restart without
fetching; a copy a day old is fetched again; a fetch that fails leaves the prices as they were and is logged.

The catalogues' prices here are made up to tell the catalogues apart; the shipped snapshot's are not used."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from moto_harness import REGION, MotoEC2

from corral.services import cloud_backends
from corral.workers.aws_catalog import AWSCatalogRefresher
from corral.workers.orphans import OrphanReaper
from server_harness import RunningServer, make_settings, running_server, wait_for

CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIALIVE, secret_key: live-secret}}
        regions: [{REGION}]
"""
#: gpuhunt's v2 CSV columns (gpuhunt ``_internal/models.py``: ``CatalogItem``; its published ``aws.csv``).
HEADER = (
    "instance_name,location,price,cpu,memory,gpu_count,gpu_name,gpu_memory,spot,disk_size,gpu_vendor,flags,cpu_arch,"
    "provider_data"
)
DAY = 24 * 3600


def publish(
    base: Path, version: str, g4dn_price: float, archive: bytes | None = None, extra: tuple[str, ...] = ()
) -> None:
    """A gpuhunt-style catalogue ``version`` under ``base`` whose g4dn.xlarge costs ``g4dn_price`` (``archive``:
    the catalog.zip's bytes instead)."""
    rows = [
        f"g4dn.xlarge,{REGION},{g4dn_price},4,16,1,T4,16,False,,nvidia,,x86,",
        f"g4dn.xlarge,{REGION},{g4dn_price / 4},4,16,1,T4,16,True,,nvidia,,x86,",
        f"m5.large,{REGION},0.01,2,8,0,,,False,,,,x86,",
        f"m6g.large,{REGION},0.001,2,8,0,,,False,,,,arm64,",  # Graviton: not offered (amd64 images only)
        *extra,
    ]
    if archive is None:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("aws.csv", "\n".join([HEADER, *rows]) + "\n")
        archive = buf.getvalue()
    (base / "aws" / version).mkdir(parents=True, exist_ok=True)
    (base / "aws" / version / "catalog.zip").write_bytes(archive)
    if not (base / "aws" / "version").is_fifo():
        (base / "aws" / "version").write_text(version + "\n")


def server_settings(tmp: Path, base: Path) -> Any:
    settings = make_settings(tmp, aws_live_catalog=base.as_uri())
    settings.server_dir.mkdir(parents=True, exist_ok=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
    return settings


async def offers(s: RunningServer) -> list[dict[str, Any]]:
    """``runs/get_plan``'s on-demand offers, as ``corral offer`` asks for them."""
    conf = {"type": "task", "image": "scratch", "user": "root", "commands": [":"],
            "resources": {"cpu": "1..", "memory": "0GB..", "gpu": "0.."}}  # fmt: skip
    body = {
        "run_spec": {"configuration": conf, "profile": {"name": "default"}},
        "max_offers": 1000,
        "for_offers_only": True,
    }
    async with s.client() as c:
        r = await c.post("/api/project/main/runs/get_plan", json=body)
    assert r.status_code == 200, r.text
    return list(r.json()["job_plans"][0]["offers"])


async def g4dn(s: RunningServer) -> tuple[float, str]:
    """The on-demand g4dn.xlarge offer's price and the catalogue its ``backend_data`` names."""
    (o,) = [o for o in await offers(s) if o["instance"]["name"] == "g4dn.xlarge"]
    return o["price"], o["backend_data"]["price_catalog"]


async def test_fetched_in_the_background_then_cached_across_a_restart(
    moto: MotoEC2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = tmp_path / "gpuhunt"
    (base / "aws").mkdir(parents=True)
    os.mkfifo(base / "aws" / "version")  # a fetch that hangs until the test writes the version
    publish(base, "20261201", 0.4321)
    settings = server_settings(tmp_path, base)
    caplog.set_level("INFO", logger="corral.aws")
    async with running_server(settings) as s:
        try:
            await asyncio.sleep(1.5)  # the refresher has started its fetch, which waits on the version
            price, source = await g4dn(s)  # the server answers meanwhile, from the shipped snapshot
            assert price != 0.4321 and "skypilot-catalog" in source
            assert not (settings.server_dir / "aws-catalog" / "meta.json").exists()
        finally:
            _answer(base / "aws" / "version", "20261201\n")
        assert await wait_for(lambda: _priced(s, 0.4321), timeout=20)
    assert "AWS prices: gpuhunt AWS catalogue 20261201" in caplog.text
    assert sorted(p.name for p in (settings.server_dir / "aws-catalog").iterdir()) == ["aws.csv", "meta.json"]

    shutil.rmtree(base)  # the published catalogue is gone: a fetch would fail and say so
    caplog.clear()
    async with running_server(settings) as s:
        price, source = await g4dn(s)
        assert price == 0.4321 and "gpuhunt AWS catalogue 20261201" in source
        assert {o["instance"]["name"] for o in await offers(s)} == {"g4dn.xlarge", "m5.large"}  # no arm64
        await wait_for(lambda: _logged(caplog, "AWS prices: gpuhunt AWS catalogue 20261201"), timeout=10)
        await asyncio.sleep(0.5)
    assert "cannot fetch" not in caplog.text  # a day-fresh copy: no fetch


async def test_a_day_old_copy_is_fetched_again_and_a_failed_fetch_changes_nothing(
    moto: MotoEC2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = tmp_path / "gpuhunt"
    publish(base, "20261201", 0.4321)
    settings = server_settings(tmp_path, base)
    caplog.set_level("INFO", logger="corral.aws")
    async with running_server(settings) as s:
        assert await wait_for(lambda: _priced(s, 0.4321), timeout=20)
        publish(base, "20261202", 0.5432)
        refresher, now = AWSCatalogRefresher(s.ctx), time.time()
        assert not await refresher.pass_once(now + DAY / 2)  # fetched less than a day ago: not asked again
        assert (await g4dn(s))[0] == 0.4321
        assert await refresher.pass_once(now + DAY + 60)
        price, source = await g4dn(s)
        assert price == 0.5432 and "gpuhunt AWS catalogue 20261202" in source

        publish(base, "20261203", 0.6543, archive=b"not a zip archive")
        assert not await refresher.pass_once(now + 2 * DAY + 120)
        assert (await g4dn(s))[0] == 0.5432  # the cached catalogue stays
    assert "cannot fetch gpuhunt's catalogue" in caplog.text and "20261203/catalog.zip" in caplog.text
    assert "AWS prices stay: gpuhunt AWS catalogue 20261202" in caplog.text


async def test_an_unreachable_catalogue_leaves_the_shipped_snapshot_and_is_logged(
    moto: MotoEC2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = server_settings(tmp_path, tmp_path / "nowhere")
    caplog.set_level("INFO", logger="corral.aws")
    async with running_server(settings) as s:
        await wait_for(lambda: _logged(caplog, "cannot fetch gpuhunt's catalogue"), timeout=10)
        assert "skypilot-catalog" in (await g4dn(s))[1]
    assert "AWS prices stay: skypilot-org/skypilot-catalog" in caplog.text
    assert not (settings.server_dir / "aws-catalog" / "meta.json").exists()


async def test_a_server_where_no_project_uses_aws_never_fetches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The live catalogue is on by default, but a machine that does not use AWS sends no request for it: the
    embedded default (and CI's demo) starts without a fetch, and the first project with the AWS backend starts
    one."""
    base = tmp_path / "gpuhunt"
    publish(base, "20261201", 0.4321)
    settings = make_settings(tmp_path, aws_live_catalog=base.as_uri())
    caplog.set_level("INFO", logger="corral.aws")
    async with running_server(settings) as s:
        refresher = AWSCatalogRefresher(s.ctx)
        assert not await refresher.pass_once(time.time())
        assert not (settings.server_dir / "aws-catalog").exists()
        assert "cannot fetch" not in caplog.text


def _answer(fifo: Path, text: str) -> None:
    """Write ``text`` to the fetch waiting on ``fifo`` (none waiting: nothing to do)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader
        return
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


async def test_the_orphan_reaper_looks_in_every_region_of_the_catalogue_in_use(moto: MotoEC2, tmp_path: Path) -> None:
    """A project without ``regions`` is offered every region of the catalogue: the fetched one can name
    regions the shipped snapshot has not, and the reaper looks for this server's orphans there too."""
    base = tmp_path / "gpuhunt"
    far = "ap-south-1"  # not a region of the shipped snapshot
    publish(base, "20261201", 0.4321, extra=(f"g4dn.xlarge,{far},0.5,4,16,1,T4,16,False,,nvidia,,x86,",))
    settings = server_settings(tmp_path, base)
    (settings.server_dir / "config.yml").write_text(CONFIG.replace(f"        regions: [{REGION}]\n", ""))
    async with running_server(settings) as s:
        await wait_for(lambda: _offered_in(s, far), timeout=20)
        ec2 = moto.client(far)
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        me = await cloud_backends.server_id(s.ctx.db)
        tags = {"owner": "corral", "corral_server": me, "corral_instance": "no-such-row"}
        orphan = ec2.run_instances(
            ImageId=image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )["Instances"][0]["InstanceId"]  # fmt: skip
        try:
            settings = dataclasses.replace(s.ctx.settings, orphan_grace=0.0, orphan_action="report")
            assert await OrphanReaper(dataclasses.replace(s.ctx, settings=settings)).pass_once(force=True) == 1
        finally:
            ec2.terminate_instances(InstanceIds=[orphan])


async def _offered_in(s: RunningServer, region: str) -> bool:
    return any(o["region"] == region for o in await offers(s))


async def _priced(s: RunningServer, price: float) -> bool:
    return (await g4dn(s))[0] == price


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text
