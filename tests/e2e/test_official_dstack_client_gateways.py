"""The official dstack 0.22.5 CLI, unchanged, with gateways on an SSH fleet's host (see ``fakehosts``):
``dstack apply -f gateway.yml -y -d`` creates a gateway that holds the fleet's host, ``dstack gateway list`` and
``get --json`` parse corral's answers with the client's own models, ``dstack gateway update --set-default`` moves
the project's default, ``dstack gateway delete -y`` and ``dstack delete -f gateway.yml -y`` remove the gateways and
give the host back to the fleet.
(The gateway's process and its traffic: ``test_gateway_official_client.py``.)"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dstack_client_env import DSTACK_VERSION, ClientInstallError, CorralServer, DstackCli, client_venv, corral_server
from dstack_client_env import short_home as make_short_home
from test_official_dstack_client import rows

from fakehosts import FakeHosts, HostSpec

TOKEN = "e2e-gateway-admin-token-0123456789"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    if os.geteuid() != 0:
        pytest.fail("the SSH fleet tests need root (network namespaces); CI runs them as root")
    fh = FakeHosts({"edge1": HostSpec()}, tmp_path_factory.mktemp("dstack-gateway-hosts"))
    fh.start()
    try:
        yield fh
    finally:
        fh.stop()


@pytest.fixture(name="short_home")
def _short_home() -> Iterator[Path]:
    with make_short_home() as home:
        yield home


def _gateways(server: CorralServer) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in server.api("/api/project/main/gateways/list", {}).json()}


def _wait(condition: Callable[[], bool], cli: DstackCli, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, cli.server.log_tail()
        time.sleep(0.2)


def _gateway_yml(name: str) -> str:
    return f"type: gateway\nname: {name}\nbackend: remote\nregion: edge\ndomain: example.test\n"


def test_gateways_with_the_official_client(hosts: FakeHosts, tmp_path: Path, short_home: Path) -> None:
    try:
        venv = client_venv()
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION}:\n{e}", pytrace=False)
    ip = hosts.ip("edge1")
    with corral_server(tmp_path, TOKEN, CORRAL_INSTANCE_CHECK_INTERVAL="1") as server:
        (tmp_path / "work").mkdir()
        cli = DstackCli(venv, short_home, tmp_path / "work", server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        cli.write(
            "fleet.dstack.yml",
            f"type: fleet\nname: edge\nssh_config:\n  user: root\n  identity_file: {hosts.key}\n  hosts:\n    - {ip}\n",
        )
        cli.ok("apply", "-f", "fleet.dstack.yml", "-y", timeout=180)

        def fleet() -> dict[str, Any]:
            return dict(server.api("/api/project/main/fleets/get", {"name": "edge"}).json())

        _wait(lambda: [i["status"] for i in fleet()["instances"]] == ["idle"], cli)

        cli.write("gw.dstack.yml", _gateway_yml("gw"))
        res = cli.ok("apply", "-f", "gw.dstack.yml", "-y", "-d")
        gw = _gateways(server)["gw"]
        assert (gw["default"], gw["replicas"][0]["hostname"]) == (True, ip), cli.explain(res)
        assert gw["status"] in ("submitted", "provisioning", "running"), cli.explain(res)
        assert [i["status"] for i in fleet()["instances"]] == ["busy"]  # held for the gateway
        cli.write("gw2.dstack.yml", _gateway_yml("gw2"))
        cli.ok("apply", "-f", "gw2.dstack.yml", "-y", "-d")  # no idle host left: failed
        assert _gateways(server)["gw2"]["status"] == "failed"

        res = cli.ok("gateway", "list")  # the client parses every gateway with its own models
        (row,) = rows(res.stdout, "gw")
        assert ip in row.split() and "example.test" in row.split(), cli.explain(res)
        assert {"submitted", "provisioning", "running"} & set(row.split()), cli.explain(res)
        assert "✓" in row, cli.explain(res)
        (row,) = rows(res.stdout, "gw2")
        assert "failed" in row.split() and "✓" not in row, cli.explain(res)
        res = cli.ok("gateway", "get", "gw", "--json")
        assert json.loads(res.stdout)["id"] == gw["id"], cli.explain(res)

        cli.ok("gateway", "update", "gw2", "--set-default")
        assert {n: g["default"] for n, g in _gateways(server).items()} == {"gw": False, "gw2": True}

        cli.ok("gateway", "delete", "gw", "-y", timeout=60)
        cli.ok("delete", "-f", "gw2.dstack.yml", "-y", timeout=60)
        _wait(lambda: not _gateways(server), cli)
        _wait(lambda: [i["status"] for i in fleet()["instances"]] == ["idle"], cli)  # the host is the fleet's again
        cli.ok("fleet", "delete", "edge", "-y")
        _wait(lambda: not server.api("/api/project/main/fleets/list", {}).json(), cli)
