"""A policy service built on dstack 0.22.5's own ``rest_plugin`` models, with corral's ``plugins: [rest_plugin]``
and the official dstack CLI: every request corral sends parses as dstack's ``SpecApplyRequest``, every answer
dstack's ``SpecApplyResponse`` serializes is applied, and the CLI shows a refusal.

The service runs in the dstack client's virtualenv (``dstack_client_env``): it validates each body with
``RunSpecRequest``/``FleetSpecRequest`` (a body dstack's models reject is answered 422, which refuses the
apply) and answers with ``RunSpecResponse``/``FleetSpecResponse``, as dstack's example plugin server does.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from dstack_client_env import CorralServer, DstackCli, corral_server, short_home

TOKEN = "e2e-policy-token-0123456789"
RESOURCES = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"

_SERVICE = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pydantic import ValidationError
from dstack.plugins.builtin.rest_plugin import (
    FleetSpecRequest, FleetSpecResponse, RunSpecRequest, RunSpecResponse,
)

MODELS = {
    "/apply_policies/on_run_apply": (RunSpecRequest, RunSpecResponse),
    "/apply_policies/on_fleet_apply": (FleetSpecRequest, FleetSpecResponse),
}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        request_model, response_model = MODELS[self.path]
        try:
            request = request_model.model_validate_json(self.rfile.read(int(self.headers["Content-Length"])))
        except ValidationError as e:
            self.answer(422, str(e).encode())
            return
        spec, error = request.spec, None
        if self.path.endswith("on_run_apply"):
            gpu = spec.configuration.resources.gpu
            if gpu is not None and gpu.count.min is not None and gpu.count.min > 2:
                error = f"{request.user}: runs may use at most 2 GPUs"
        else:
            spec.configuration.tags = {**(spec.configuration.tags or {}), "team": request.project}
        self.answer(200, response_model(spec=spec, error=error).model_dump_json().encode())

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"""


@pytest.fixture(scope="module")
def policy_url(dstack_venv: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [str(dstack_venv / "bin" / "python"), "-c", _SERVICE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().decode().strip()
        assert port.isdigit(), f"the policy service did not start (exit code {proc.poll()})"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, policy_url: str) -> Iterator[CorralServer]:
    tmp = tmp_path_factory.mktemp("policy-e2e")
    (tmp / "server").mkdir(mode=0o700)
    (tmp / "server" / "config.yml").write_text("plugins:\n  - rest_plugin\nprojects:\n  - name: main\n")
    with corral_server(tmp, TOKEN, DSTACK_PLUGIN_SERVICE_URI=policy_url) as s:
        yield s


@pytest.fixture(scope="module")
def cli(dstack_venv: Path, server: CorralServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DstackCli]:
    workdir = tmp_path_factory.mktemp("policy-work")
    with short_home() as home:
        cli = DstackCli(dstack_venv, home, workdir, server)
        cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
        yield cli


def test_the_cli_shows_a_policys_refusal_and_nothing_is_submitted(cli: DstackCli) -> None:
    cli.write("big.dstack.yml", "type: task\nname: big\ncommands: [nvidia-smi]\nresources:\n  gpu: 4\n")
    res = cli.run("apply", "-f", "big.dstack.yml", "-y", "-d")
    assert res.returncode != 0, cli.explain(res)
    assert "admin: runs may use at most 2 GPUs" in res.output and "rest_plugin" in res.output, cli.explain(res)
    assert cli.server.api("/api/project/main/runs/list", {}).json() == []


def test_a_run_the_policy_allows_is_submitted(cli: DstackCli) -> None:
    cli.write("small.dstack.yml", f"type: task\nname: small\ncommands: ['sleep 30']\n{RESOURCES}")
    cli.ok("apply", "-f", "small.dstack.yml", "-y", "-d")
    runs = cli.server.api("/api/project/main/runs/list", {}).json()
    assert [r["run_spec"]["run_name"] for r in runs] == ["small"]
    cli.ok("stop", "small", "-y", "-x")


def test_every_fleet_gets_the_policys_tag(cli: DstackCli) -> None:
    cli.write("fleet.dstack.yml", f"type: fleet\nname: tagged\nnodes: 0..1\ntags:\n  cost-center: ml\n{RESOURCES}")
    cli.ok("apply", "-f", "fleet.dstack.yml", "-y")
    fleet = cli.server.api("/api/project/main/fleets/get", {"name": "tagged"}).json()
    fleet_tags = {"cost-center": "ml", "team": "main"}
    assert fleet["spec"]["configuration"]["tags"] == fleet_tags
    cli.ok("apply", "-f", "fleet.dstack.yml", "-y")  # the same file again: the fleet is kept as it is
    fleets = cli.server.api("/api/project/main/fleets/list", {}).json()
    assert [(f["name"], f["spec"]["configuration"]["tags"]) for f in fleets] == [("tagged", fleet_tags)]
    cli.ok("fleet", "delete", "tagged", "-y")
