"""The AWS backend's prices are real: ``corral offer``, through a server with the AWS backend (credentials
checked against moto) in four regions, lists AWS's published on-demand prices, says which catalogue and
day they come from and that a public IPv4 address costs extra, and offers no (type, region) pair or spot
market AWS does not sell.

The expected prices and the pairs AWS does not sell are this file's own fixtures, never the catalogue's."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from moto_harness import MotoEC2

from corral.cli import render
from corral.cli.main import run
from corral.sdk import config_file
from server_harness import RunningServer, make_settings, running_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1"]
CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIAPRICES, secret_key: prices-secret}}
        regions: [{", ".join(REGIONS)}]
"""

#: Linux on-demand $/hour. GPU types and p4d/p5: AWS's price list as SkyPilot's catalogue publishes it
#: (skypilot-org/skypilot-catalog, catalogs/v8/aws/vms.csv, commit 00148f2a). c5: the price table of AWS's
#: Auto Scaling guide ("Configure instance weighting": weights-spot-price-per-unit-hour-example).
REAL_ON_DEMAND = {
    ("g4dn.xlarge", "us-east-1"): 0.526,
    ("g4dn.12xlarge", "us-east-1"): 3.912,
    ("g4dn.12xlarge", "eu-west-1"): 4.362,
    ("g5.2xlarge", "us-east-1"): 1.212,
    ("g5.2xlarge", "eu-west-1"): 1.35296,
    ("g5.4xlarge", "us-east-1"): 1.624,
    ("g5.4xlarge", "eu-central-1"): 2.03081,
    ("g5.12xlarge", "us-east-1"): 5.672,
    ("g5.16xlarge", "us-east-1"): 4.096,
    ("g5.24xlarge", "us-east-1"): 8.144,
    ("g5.48xlarge", "us-east-1"): 16.288,
    ("g5.48xlarge", "eu-central-1"): 20.3681,
    ("g6.xlarge", "us-east-1"): 0.8048,
    ("g6.4xlarge", "us-east-1"): 1.3232,
    ("g6.8xlarge", "us-east-1"): 2.0144,
    ("g6e.12xlarge", "us-east-1"): 10.49264,
    ("g6e.16xlarge", "us-east-1"): 7.57719,
    ("p4d.24xlarge", "us-east-1"): 21.957642,
    ("p4d.24xlarge", "eu-west-1"): 23.71569,
    ("p4d.24xlarge", "eu-central-1"): 27.43298,
    ("p5.48xlarge", "us-east-1"): 55.04,
    ("p5.4xlarge", "us-east-1"): 6.88,
    ("c5.2xlarge", "us-east-1"): 0.34,
    ("c5.4xlarge", "us-east-1"): 0.68,
    ("c5.12xlarge", "us-east-1"): 2.04,
}
#: (type, region) pairs AWS does not sell: its regional instance-type lists (DescribeInstanceTypeOfferings) and
#: SkyPilot's catalogue have no g6/g6e in eu-west-1 and no p5 in eu-west-1 or eu-central-1.
NOT_OFFERED = [
    ("g6.xlarge", "eu-west-1"),
    ("g6.4xlarge", "eu-west-1"),
    ("g6.8xlarge", "eu-west-1"),
    ("g6e.12xlarge", "eu-west-1"),
    ("g6e.16xlarge", "eu-west-1"),
    ("p5.48xlarge", "eu-west-1"),
    ("p5.48xlarge", "eu-central-1"),
    ("p5.4xlarge", "eu-west-1"),
    ("p5.4xlarge", "eu-central-1"),
]
#: Types without a spot market (DescribeSpotPriceHistory has no p5.4xlarge price in any zone).
NO_SPOT = ["p5.4xlarge"]
L4_MIB = 24 * 1024
#: AWS's charge for a public IPv4 address, $/hour (AWS News Blog, 2023-07-28, "New - AWS Public IPv4 Address
#: Charge + Public IP Insights").
PUBLIC_IPV4 = "$0.005/h"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory, moto: MotoEC2) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path_factory.mktemp("awsprices"))
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(CONFIG)
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


def _shown_prices(text: str) -> dict[tuple[str, str], float]:
    """(type, region) -> price of each row of an offers table."""
    shown = {}
    for m in re.finditer(r"aws \(([a-z0-9-]+)\)\s.*?\s([a-z0-9]+\.[a-z0-9]+)\s+\$([0-9.]+)", text):
        shown[(m[2], m[1])] = float(m[3])
    return shown


async def test_corral_offer_lists_aws_real_on_demand_prices(corral: Callable[..., str]) -> None:
    text = await asyncio.to_thread(corral, "offer", "--on-demand", "--max-offers", "1000")
    shown = _shown_prices(text)
    listed = {pair: shown[pair] for pair in REAL_ON_DEMAND if pair in shown}
    assert len(listed) == len(REAL_ON_DEMAND), sorted(set(REAL_ON_DEMAND) - set(shown))
    off = {pair: (p, REAL_ON_DEMAND[pair]) for pair, p in listed.items() if abs(p / REAL_ON_DEMAND[pair] - 1) > 0.02}
    assert not off, off
    # which catalogue and day the prices come from, and what they leave out
    (note,) = [line for line in text.splitlines() if line.strip().startswith("aws prices:")]
    assert re.search(r"skypilot-catalog .*, as of \d{4}-\d\d-\d\d; a public IPv4 address adds ", note), note
    assert note.rstrip().endswith(PUBLIC_IPV4), note


async def test_no_offer_aws_does_not_sell(corral: Callable[..., str]) -> None:
    on_demand = json.loads(await asyncio.to_thread(corral, "offer", "--max-offers", "5000", "--json"))["offers"]
    spot = json.loads(await asyncio.to_thread(corral, "offer", "--spot", "--max-offers", "5000", "--json"))["offers"]
    assert {o["region"] for o in on_demand} == {o["region"] for o in spot} == set(REGIONS)
    pairs = {(o["instance"]["name"], o["region"]) for o in on_demand + spot}
    assert not pairs & set(NOT_OFFERED), sorted(pairs & set(NOT_OFFERED))
    spot_types = {o["instance"]["name"] for o in spot}
    assert spot_types and not spot_types & set(NO_SPOT), sorted(spot_types & set(NO_SPOT))
    assert set(NO_SPOT) <= {o["instance"]["name"] for o in on_demand}
    # an L4 has 24 GB (NVIDIA's L4 datasheet), as gpuhunt (`_get_gpu_memory_gib`) and so dstack's offers say;
    # EC2's DescribeInstanceTypes reports 22888 MiB
    l4 = [g for o in on_demand for g in o["instance"]["resources"]["gpus"] if g["name"] == "L4"]
    assert l4 and {g["memory_mib"] for g in l4} == {L4_MIB}
    # every offer says where its price comes from (dstack's `offer --json` prints backend_data as it is)
    assert all(o["backend_data"]["price_catalog"] and o["backend_data"]["price_date"] for o in on_demand + spot)
