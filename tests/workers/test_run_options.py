"""Run options corral accepts in dstack's grammar but does not apply are refused with a 400 naming the
field (and the plan says so first); ``home_dir``, a run's ``backends`` and each node group's own options are applied."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

from corral.config import run_spec
from corral.config.parsing import parse_run_configuration
from corral.scheduler.fleet_view import run_backends
from corral.services.job_specs import derive
from server_harness import finished_run, fleet_body, make_settings, running_server, task_body

FAKE_UV = """#!/bin/sh
[ "$1" = python ] && exit 1
for last; do :; done
mkdir -p "$last/bin"
echo "$@" > "$last/uv-args"
echo "export VIRTUAL_ENV=$last" > "$last/bin/activate"
"""


async def _logs(c: Any, run: dict[str, Any]) -> str:
    body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": run["latest_job_submission"]["id"]}
    r = await c.post("/api/project/main/logs/poll", json={**body, "limit": 1000})
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


def test_a_run_s_backends_in_corral_s_names() -> None:
    assert run_backends(["remote"]) == {"local", "ssh"}
    assert run_backends(["aws", "gcp"]) == {"aws", "gcp"}


def test_home_dir_reaches_the_job_spec() -> None:
    spec = run_spec.read(
        {"configuration": {"type": "task", "commands": ["true"], "home_dir": "/home/me"}, "repo_data": {},
         "repo_code_hash": None}
    )  # fmt: skip
    assert derive(spec, "r").jobs[0]["home_dir"] == "/home/me"


async def test_refused_run_options_name_the_field(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"schedule": {"cron": "0 0 31 2 *"}}, "never fire"),
            ({"availability_zones": ["us-east-1a"]}, "`availability_zones`"),
            ({"dstack": True}, "`dstack: true`"),
            ({"tags": {"team": "ml"}}, "`tags`"),
        ]
        for extra, words in cases:
            r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], **extra))
            assert r.status_code == 400, (extra, r.text)
            assert words in r.json()["detail"][0]["msg"], (extra, r.text)
        # node groups' address references must name a node the run has
        groups = {"groups": [{"name": "a", "commands": ["echo ${{ groups[1].nodes[0].IP_ADDRESS }}"]}]}
        body = task_body([], **groups)
        del body["plan"]["run_spec"]["configuration"]["commands"]
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 400 and "groups[1].nodes[0]" in r.text and "out of range" in r.text, r.text
        # a run's `backends` keeps it off the others' instances and offers
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body(nodes="0..1"))).is_success
        for backends, verdict in ((["aws"], "does not list its backends (remote)"), (["remote"], None)):
            spec = task_body(["true"], backends=backends, fleets=["fl"])["plan"]["run_spec"]
            plan = (await c.post("/api/project/main/runs/get_plan", json={"run_spec": spec})).json()
            assert (plan["corral_plan_error"] is None) == (verdict is None), plan["corral_plan_error"]
            assert verdict is None or verdict in plan["corral_plan_error"]
            assert bool(plan["job_plans"][0]["offers"]) == (verdict is None)
        # `python` without an image: a virtualenv of that Python made by uv (here a fake uv on the job's PATH
        # that records how it was called), or the job fails saying why (no uv, and python3 is another version)
        fake = tmp_path / "fakebin"
        fake.mkdir()
        (fake / "uv").write_text(FAKE_UV)
        (fake / "uv").chmod(0o755)
        path = {"PATH": f"{fake}:{os.environ['PATH']}"}
        probe = 'echo "venv=$VIRTUAL_ENV"; cat "$VIRTUAL_ENV/uv-args"'
        r = await c.post("/api/project/main/runs/apply", json=task_body([probe], name="py-uv", python="3.12", env=path))
        assert r.status_code == 200, r.text
        host = subprocess.run(
            ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        ).stdout.strip()
        other = "3.9" if host != "3.9" else "3.10"
        # (a PATH without uv, whichever this machine has: the dev venv's own, say)
        no_uv = ":".join(d for d in os.environ["PATH"].split(":") if d and not (Path(d) / "uv").exists())
        body = task_body(["true"], name="py-other", python=other, env={"PATH": no_uv})
        r = await c.post("/api/project/main/runs/apply", json=body)
        assert r.status_code == 200, r.text
        ok, bad = await finished_run(c, "py-uv"), await finished_run(c, "py-other")
        assert ok["status"] == "done", ok["latest_job_submission"]
        lines = (await _logs(c, ok)).split("\n")
        assert lines[0].startswith("venv=") and "dstack-venv-" in lines[0], lines
        assert lines[1].startswith("venv -q --prompt dstack -p 3.12 --seed "), lines
        assert bad["status"] == "failed"
        assert f"`python: {other}` asks for Python {other}" in await _logs(c, bad)
        # the plan says it too, before apply
        plan = await c.post(
            "/api/project/main/runs/get_plan",
            json={"run_spec": task_body(["true"], tags={"a": "b"})["plan"]["run_spec"]},
        )
        assert plan.status_code == 200 and "`tags`" in plan.json()["corral_plan_error"], plan.text


def _job(conf: dict[str, Any]) -> dict[str, Any]:
    spec = run_spec.read({"configuration": conf, "repo_data": {}, "repo_code_hash": None})
    job: dict[str, Any] = derive(spec, "r").jobs[0]
    return job


def test_each_node_group_s_commands_ports_and_resources_reach_its_own_nodes() -> None:
    groups = [
        {"name": "head", "nodes": 1, "commands": ["lead"], "ports": ["8080:80"], "resources": {"cpu": "2.."}},
        {"name": "work", "nodes": 2, "commands": ["follow"], "resources": {"cpu": "4..", "gpu": "A100:2"}},
    ]
    conf = parse_run_configuration({"type": "task", "groups": groups}).model_dump(mode="json")  # as a run stores it
    jobs = derive(run_spec.read({"configuration": conf, "repo_data": {}, "repo_code_hash": None}), "r").jobs
    assert [j["commands"][-1] for j in jobs] == ["lead", "follow", "follow"]
    assert [[(a["port"], a["map_to_port"]) for a in j["app_specs"]] for j in jobs] == [[(80, 8080)], [], []]
    resources = [j["requirements"]["resources"] for j in jobs]
    assert [r["cpu"]["count"]["min"] for r in resources] == [2, 4, 4]
    assert [r["gpu"]["name"] for r in resources] == [None, ["A100"], ["A100"]]


def test_single_branch_reaches_the_job_spec_with_dstacks_defaults() -> None:
    task = {"type": "task", "commands": ["true"]}
    dev = {"type": "dev-environment", "ide": "vscode"}
    assert _job(task)["single_branch"] is True
    assert _job(dev)["single_branch"] is False
    assert _job({**task, "single_branch": False})["single_branch"] is False
    assert _job({**dev, "single_branch": True})["single_branch"] is True


def test_nvcc_without_an_image_checks_the_hosts_compiler_before_the_commands() -> None:
    task = {"type": "task", "commands": ["echo hi"]}
    check = [c for c in _job({**task, "nvcc": True})["commands"] if "command -v nvcc" in c]
    assert len(check) == 1 and "`nvcc: true`" in check[0]
    assert not any("nvcc" in c for c in _job(task)["commands"])


def test_a_dev_environments_setup_runs_before_its_init() -> None:
    dev = {"type": "dev-environment", "ide": "vscode", "setup": ["echo set-up"], "init": ["echo in-it"]}
    script = "\n".join(_job(dev)["commands"])
    assert "echo set-up" in script and script.index("echo set-up") < script.index("echo in-it")
