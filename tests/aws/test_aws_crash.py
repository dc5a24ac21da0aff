"""A ``corral server`` process SIGKILLed between RunInstances and the commit that records its instance,
then started again on the same state directory and the same EC2 (moto): the row's instance is found by its
``corral_instance`` tag and adopted -- exactly one instance in EC2, no second launch -- and the job runs.

The fault proxy in front of moto holds RunInstances' answer (moto has made the instance) until the test
has killed the server, so the server never hears of the instance it launched."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from dstack_client_env import CorralServer, DstackCli, _corral_command, client_venv, corral_server
from moto_harness import REGION, VPC_NAME, FaultProxy, Hypervisor, MotoEC2

from corral.backends.aws import catalog
from corral.cli.formatting import format_price

TOKEN = "crash-test-token"
CONFIG = f"""
projects:
  - name: main
    backends:
      - type: aws
        creds: {{type: access_key, access_key: AKIACRASHTEST, secret_key: crash-secret}}
        regions: [{REGION}]
        vpc_name: {VPC_NAME}
        public_ips: false
"""
FLEET = {"type": "fleet", "name": "crashfl", "nodes": "0..1", "backends": ["aws"], "resources": {"cpu": "2.."}}
TASK = {"type": "task", "name": "after-crash", "commands": ["echo survived"], "fleets": ["crashfl"],
        "creation_policy": "reuse-or-create", "resources": {"cpu": "2.."}}  # fmt: skip


def _post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def _fleet_instances(moto: MotoEC2, *states: str) -> list[dict[str, Any]]:
    filters = [{"Name": "tag:corral_fleet", "Values": ["crashfl"]}]
    if states:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    pages = moto.client().describe_instances(Filters=filters)
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def _until(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


@dataclass
class Restarted:
    server: CorralServer
    proxy: FaultProxy
    tmp: Path
    ec2_id: str
    row_id: str


@pytest.fixture(scope="module")
def restarted(
    tmp_path_factory: pytest.TempPathFactory, moto: MotoEC2, hypervisor: Hypervisor, vpc: tuple[str, str, str]
) -> Iterator[Restarted]:
    """The server killed while RunInstances' answer is held, then started again: what the tests look at."""
    tmp = tmp_path_factory.mktemp("awscrash")
    proxy = FaultProxy(moto.url).start()
    proxy.blocked_subnets.add(vpc[1])  # zone a: no capacity (and no fake host would answer there)
    proxy.hold = True
    (tmp / "server").mkdir()
    (tmp / "server" / "config.yml").write_text(CONFIG)
    env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_EC2_METADATA_DISABLED": "true", "CORRAL_PROVISIONING_TIMEOUT": "60"}
    try:
        with corral_server(tmp, TOKEN, **env) as first:
            body = {"plan": {"spec": {"configuration": FLEET, "profile": {}}}, "force": True}
            r = _post(first.url, "/api/project/main/fleets/apply", body)
            assert r.status_code == 200, r.text
            body = {"force": True, "plan": {"run_spec": {"configuration": TASK}}}
            r = _post(first.url, "/api/project/main/runs/apply", body)
            assert r.status_code == 200, r.text
            assert proxy.launched.wait(60), first.log_tail()
            os.killpg(first.proc.pid, signal.SIGKILL)  # moto made the instance; the server never heard of it
            first.proc.wait(10)
        proxy.hold = False
        proxy.release.set()
        launched = _fleet_instances(moto, "pending", "running")
        assert len(launched) == 1, launched
        row_id = {t["Key"]: t["Value"] for t in launched[0]["Tags"]}["corral_instance"]
        db = sqlite3.connect(tmp / "server" / "data" / "corral.db")
        status, agent = db.execute("SELECT status, agent FROM instances WHERE id = ?", (row_id,)).fetchone()
        db.close()
        assert status == "pending" and not agent  # the commit never happened
        with corral_server(tmp, TOKEN, **env) as second:
            yield Restarted(second, proxy, tmp, launched[0]["InstanceId"], row_id)
            r = _post(second.url, "/api/project/main/fleets/delete", {"names": ["crashfl"]})
            assert r.status_code == 200, r.text
            _until(lambda: not _fleet_instances(moto, "pending", "running", "shutting-down"), 60, "termination")
    finally:
        proxy.release.set()
        proxy.stop()


def _finished(server: CorralServer) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        run = _post(server.url, "/api/project/main/runs/get", {"run_name": "after-crash"}).json()
        return run if run["status"] in ("done", "failed", "terminated") else None

    return dict(_until(check, 120, "the run after the restart"))


def test_a_server_killed_after_run_instances_adopts_its_instance_on_restart(
    restarted: Restarted, moto: MotoEC2
) -> None:
    run = _finished(restarted.server)
    sub = run["jobs"][0]["job_submissions"][-1]
    assert run["status"] == "done", (sub.get("termination_reason_message"), restarted.server.log_tail())
    live = _fleet_instances(moto, "pending", "running", "stopping", "stopped", "shutting-down")
    assert [i["InstanceId"] for i in live] == [restarted.ec2_id]  # exactly one instance in EC2: adopted
    row = restarted.row_id
    assert [lt.token for lt in restarted.proxy.launches] == [f"corral-{row}-1", f"corral-{row}-2"]
    db = sqlite3.connect(restarted.tmp / "server" / "data" / "corral.db")
    (agent,) = db.execute("SELECT agent FROM instances WHERE id = ?", (row,)).fetchone()
    db.close()
    assert json.loads(agent)["connection"]["aws"]["instance_id"] == restarted.ec2_id


def _corral(r: Restarted, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(HOME=str(r.tmp / "server-home"), CORRAL_CONFIG_DIR=str(r.tmp / "corral-config"), COLUMNS="200",
               NO_COLOR="1", TERM="dumb")  # fmt: skip
    out = subprocess.run([*_corral_command(), *args], env=env, capture_output=True, text=True, timeout=60, cwd=r.tmp)
    assert out.returncode == 0, f"corral {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _priced_rows(text: str, types: set[str]) -> list[tuple[str, str]]:
    """(instance type, price) of each table row naming one of ``types`` and a price."""
    rows = []
    for line in text.splitlines():
        words = line.split()
        named = [w for w in words if w in types]
        prices = [w for w in words if re.fullmatch(r"\$[0-9.]+", w)]
        if named and prices:
            rows.append((named[0], prices[-1]))
    return rows


def test_offers_and_the_instance_show_the_catalogues_prices(restarted: Restarted) -> None:
    """``corral offer``, the official ``dstack offer`` and ``corral ps`` print the catalogue's prices."""
    assert _finished(restarted.server)["status"] == "done"
    price = {r.instance_type: format_price(r.price) for r in catalog.load() if r.region == REGION and not r.spot}
    shown = _priced_rows(_corral(restarted, "offer"), set(price))
    assert len(shown) >= 3 and all(p == price[t] for t, p in shown), shown
    dollars = [float(p[1:]) for _t, p in shown]
    assert dollars == sorted(dollars) and shown[0][1] == format_price(
        min(o.price for o in catalog.offers(catalog.load(), frozenset({REGION})) if not o.resources.spot)
    )  # cheapest first, on-demand (dstack's default spot_policy)
    (ps,) = [line for line in _corral(restarted, "ps", "-a").splitlines() if "after-crash" in line]
    assert "aws (us-east-1)" in ps and price["t3.large"] in ps.split(), ps  # the instance it ran on

    home, work = restarted.tmp / "dstack-home", restarted.tmp / "dstack-work"
    home.mkdir()
    work.mkdir()
    cli = DstackCli(client_venv(), home, work, restarted.server)
    # what `dstack project add` writes (one CLI start less)
    (home / ".dstack").mkdir()
    (home / ".dstack" / "config.yml").write_text(
        f"projects:\n- name: main\n  url: {restarted.server.url}\n  token: {TOKEN}\n  default: true\n"
    )
    res = cli.ok("offer")
    dstack_shown = _priced_rows(res.stdout, set(price))
    assert len(dstack_shown) >= 3 and all(p == price[t] for t, p in dstack_shown), cli.explain(res)
    assert dstack_shown[: len(shown)] == shown[: len(dstack_shown)]  # the same offers, in the same order
    # the catalogue and its date: in `dstack offer --json`'s backend_data, and after `corral offer`'s table
    data = [o["backend_data"] for o in json.loads(cli.ok("offer", "--json").stdout)["offers"]]
    assert data and all(d["price_catalog"] and re.fullmatch(r"\d{4}-\d\d-\d\d", d["price_date"]) for d in data)
    # $0.005/h: AWS public IPv4 charge (AWS News Blog, 2023-07-28)
    assert f"as of {data[0]['price_date']}; a public IPv4 address adds $0.005/h" in _corral(restarted, "offer")
