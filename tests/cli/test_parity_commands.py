"""corral's own CLI beside the official dstack 0.22.5 CLI, both against one real ``corral server`` process:
``fleet get NAME --json``, ``export``/``import`` of fleets, ``offer --group-by gpu,backend,region`` and
``apply -f volume.yml``. Each corral command prints what dstack's prints for the same call (the same JSON,
the same table rows), and refuses bad input naming it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_fakes import Result
from dstack_client_env import DSTACK_VERSION, ClientInstallError, CorralServer, DstackCli, client_venv, corral_server

import nvidia_smi_fake
from corral.sdk import config_file

CLI = Callable[..., Result]
TOKEN = "cli-parity-token-0123456789"
FLEET = "type: fleet\nname: shared\nnodes: 0..1\nresources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    tmp = tmp_path_factory.mktemp("cli-parity")
    # the local backend's GPUs: a fake nvidia-smi that prints a real H100 machine's captured output
    bin_dir = tmp / "bin"
    nvidia_smi_fake.install(bin_dir)
    with corral_server(tmp, TOKEN, PATH=f"{bin_dir}:{os.environ['PATH']}") as s:
        assert s.api("/api/projects/create", {"project_name": "other"}).is_success
        yield s


@pytest.fixture(scope="module")
def dstack_venv() -> Path:
    try:
        return client_venv()
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION}:\n{e}", pytrace=False)


@pytest.fixture(scope="module")
def dstack(dstack_venv: Path, server: CorralServer, tmp_path_factory: pytest.TempPathFactory) -> DstackCli:
    tmp = tmp_path_factory.mktemp("dstack-cli")
    (tmp / "home").mkdir()
    (tmp / "work").mkdir()
    d = DstackCli(dstack_venv, tmp / "home", tmp / "work", server)
    d.ok("project", "add", "--name", "other", "--url", server.url, "--token", TOKEN, "-y")
    d.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
    d.write("fleet.dstack.yml", FLEET)
    d.ok("apply", "-f", "fleet.dstack.yml", "-y")
    return d


@pytest.fixture
def corral(env: Path, server: CorralServer, cli: CLI) -> CLI:
    config_file.add_project("main", server.url, TOKEN)
    config_file.add_project("other", server.url, TOKEN)
    config_file.set_default("main")
    return cli


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def test_fleet_get_prints_the_fleet_as_dstack_does(corral: CLI, dstack: DstackCli) -> None:
    theirs = json.loads(dstack.ok("fleet", "get", "shared", "--json").stdout)
    res = corral("fleet", "get", "shared", "--json")
    assert res.code == 0, res.err
    ours = json.loads(res.out)
    assert (ours["id"], ours["name"], ours["project_name"], ours["status"]) == (
        theirs["id"], "shared", "main", theirs["status"],
    )  # fmt: skip
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    by_id = corral("fleet", "get", "--id", ours["id"], "--json")
    assert by_id.code == 0 and json.loads(by_id.out)["name"] == "shared", by_id.err
    missing = corral("fleet", "get", "nope", "--json")
    assert missing.code == 1 and "Fleet nope not found" in missing.err, missing
    no_json = corral("fleet", "get", "shared")
    assert no_json.code == 2 and "--json" in no_json.err, no_json
    bad_id = corral("fleet", "get", "--id", "not-a-uuid", "--json")
    assert bad_id.code == 1 and "Invalid UUID format: not-a-uuid" in bad_id.err, bad_id


def test_export_and_import_a_fleet_as_dstack_does(corral: CLI, dstack: DstackCli) -> None:
    res = corral("export", "create", "share", "--fleet", "shared", "--importer", "other")
    assert res.code == 0, res.err
    assert _rows(res.out) == [["NAME", "FLEETS", "GATEWAYS", "IMPORTERS"], ["share", "shared", "-", "other"]]
    listed = corral("export")
    assert _rows(listed.out) == _rows(dstack.ok("export", "list").stdout), listed
    imports = corral("import", "--project", "other")
    assert _rows(imports.out) == [["NAME", "FLEETS", "GATEWAYS"], ["main/share", "shared", "-"]], imports
    assert _rows(imports.out) == _rows(dstack.ok("import", "--project", "other").stdout)
    res = corral("export", "update", "share", "--set-global")
    assert res.code == 0 and _rows(res.out)[1] == ["share", "shared", "-", "*"], res
    res = corral("import", "delete", "share", "--project", "other", "-y")
    assert res.code == 2 and "<export-project>/<export-name>" in res.err, res
    res = corral("export", "update", "share", "--unset-global")
    res = corral("import", "delete", "main/share", "--project", "other", "-y")
    assert res.code == 0 and "Import main/share deleted" in res.out, res
    assert _rows(corral("import", "--project", "other").out) == [["NAME", "FLEETS", "GATEWAYS"]]
    res = corral("export", "delete", "share", "-y")
    assert res.code == 0 and "Export share deleted" in res.out, res
    assert _rows(corral("export").out) == [["NAME", "FLEETS", "GATEWAYS", "IMPORTERS"]]


def test_offer_group_by_matches_dstack(corral: CLI, dstack: DstackCli) -> None:
    for group_by in ("gpu", "gpu,backend", "gpu,backend,region", "gpu,count"):
        theirs = dstack.ok("offer", "--group-by", group_by).stdout
        res = corral("offer", "--group-by", group_by)
        assert res.code == 0, res.err
        assert _rows(res.out) == _rows(theirs), (group_by, res.out, theirs)
        assert "H100:79GB:1" in res.out, res.out  # 81559 MiB, as nvidia-smi reports an H100 80GB HBM3
    data = json.loads(corral("offer", "--group-by", "gpu,backend", "--json").out)
    theirs_json = json.loads(dstack.ok("offer", "--group-by", "gpu,backend", "--json").stdout)
    assert data["group_by"] == theirs_json["group_by"] == ["gpu", "backend"]
    # dstack's client writes its model's unset fields as nulls; the server leaves them out
    assert data["gpus"] == [{k: v for k, v in g.items() if v is not None} for g in theirs_json["gpus"]]
    bad = corral("offer", "--group-by", "backend")
    assert bad.code == 1 and "Cannot group by 'backend' without also grouping by 'gpu'" in bad.err, bad
    bad = corral("offer", "--group-by", "gpu,zone")
    assert bad.code == 1 and "Invalid group-by value: 'zone'" in bad.err, bad


def test_apply_volume_shows_the_plan_and_the_server_s_answer(corral: CLI, env: Path) -> None:
    (env / "vol.dstack.yml").write_text("type: volume\nname: data\nbackend: aws\nregion: us-east-1\nsize: 10GB\n")
    res = corral("apply", "-f", "vol.dstack.yml", "-y")
    assert "Volume type" in res.out and "managed" in res.out and "us-east-1" in res.out, res
    assert "Volume data does not exist yet." in res.out, res
    # this server has no aws backend: its refusal, one line, no traceback
    assert res.code == 1 and "aws" in res.err and "Traceback" not in res.err, res


def test_apply_with_profile_options_and_logs_diagnose(corral: CLI, env: Path, server: CorralServer) -> None:
    (env / "t.dstack.yml").write_text(
        "type: task\nname: opts\nfleets: [shared]\ncommands: [echo from-the-job]\n"
        "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\n"
    )
    args = ("--idle-duration", "1m", "--max-price", "1", "--retry-duration", "10m")
    res = corral("apply", "-f", "t.dstack.yml", *args, "-y", "-d")
    assert res.code == 0, res
    deadline = time.monotonic() + 60
    while True:
        run = server.api("/api/project/main/runs/get", {"run_name": "opts"}).json()
        if run["status"] in ("done", "failed", "terminated"):
            break
        assert time.monotonic() < deadline, run["status"]
        time.sleep(0.5)
    conf = run["run_spec"]["configuration"]
    assert (conf["idle_duration"], conf["max_price"], conf["retry"]["duration"]) == (60, 1.0, 600), conf
    assert run["status"] == "done", run["latest_job_submission"]
    diag = corral("logs", "-d", "opts")
    assert diag.code == 0 and "Process started (pid " in diag.out and "from-the-job" not in diag.out, diag
    assert "Exited with status 0: done" in diag.out, diag
    assert "from-the-job" in corral("logs", "opts").out
    bad = corral("apply", "-f", "t.dstack.yml", "--idle-duration", "soon", "-y", "-d")
    assert bad.code == 2 and "--idle-duration" in bad.err and "soon" in bad.err, bad
