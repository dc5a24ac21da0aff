"""The commands run in-process against a fake client: arguments, API calls, output, exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_fakes import JPD, FakeClient, Result, make_run, submission

from corral.sdk import config_file

CLI = Callable[..., Result]

TASK_YML = """\
type: task
name: hello
commands:
  - echo hello
"""

FLEET_YML = """\
type: fleet
name: test-fleet
nodes: 0..3
resources:
  cpu: 1..
"""

REQUIREMENTS = {
    "resources": {
        "cpu": {"arch": "x86", "count": {"min": 2, "max": None}},
        "memory": {"min": 8.0, "max": None},
        "gpu": {
            "vendor": "nvidia",
            "name": None,
            "count": {"min": 0, "max": None},
            "memory": None,
            "total_memory": None,
            "compute_capability": None,
        },
        "disk": {"size": {"min": 100.0, "max": None}},
    },
    "max_price": None,
    "spot": None,
}

OFFER = {
    "backend": "remote",
    "corral_backend": "local",
    "region": "local",
    "price": 0.0,
    "instance": JPD["instance_type"],
    "availability": "available",
    "blocks": 1,
    "total_blocks": 1,
}


def run_plan(offers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec = {
        "run_name": "hello",
        "configuration_path": ".dstack.yml",
        "configuration": {"type": "task", "nodes": 1},
        "profile": {"name": "default"},
    }
    return {
        "project_name": "main",
        "user": "admin",
        "run_spec": spec,
        "effective_run_spec": spec,
        "job_plans": [
            {
                "job_spec": {"requirements": REQUIREMENTS, "retry": None, "max_duration": None},
                "offers": offers or [],
                "total_offers": len(offers or []),
                "max_price": 0.0,
            }
        ],
        "current_resource": None,
        "action": "create",
    }


# ---- arguments and errors -------------------------------------------------------------------


def test_apply_without_file_is_one_line_error(env: Path, cli: CLI) -> None:
    result = cli("apply")
    assert result.code == 1
    assert result.err == f"Error: No .dstack.yml in {env}; pass a configuration file with -f FILE\n"


def test_apply_missing_file(env: Path, cli: CLI) -> None:
    result = cli("apply", "-f", "nope.yml", "-y")
    assert (result.code, result.err) == (1, "Error: Configuration file nope.yml does not exist\n")


def test_apply_invalid_configuration_is_one_line(fake: FakeClient, cli: CLI) -> None:
    Path("bad.yml").write_text("type: task\ncommands: [x]\nbogus: 1\n")
    result = cli("apply", "-f", "bad.yml", "-y")
    assert result.code == 1
    assert result.err.startswith("Error: bad.yml: ") and "bogus" in result.err
    assert result.err.count("\n") == 1
    assert fake.calls == []


def test_no_project_configured(env: Path, cli: CLI) -> None:
    result = cli("ps")
    assert result.code == 1
    assert result.err.startswith("Error: No project configured. Start a server with `corral server`")


def test_unknown_option_is_usage_error(env: Path, cli: CLI) -> None:
    assert cli("ps", "--bogus").code == 2


def test_server_unreachable_is_one_line(env: Path, cli: CLI) -> None:
    config_file.add_project("main", "http://127.0.0.1:9", "tok")
    result = cli("ps")
    assert result.code == 1
    assert result.err == "Error: Cannot reach the corral server at http://127.0.0.1:9. Start it with `corral server`.\n"


def test_ctrl_c_exits_130(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*a: Any, **k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(fake, "runs_list", interrupted)
    result = cli("ps")
    assert result.code == 130
    assert "Traceback" not in result.err and "Aborted" not in result.err


def test_unexpected_exception_has_no_traceback(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake, "runs_list", lambda *a, **k: 1 / 0)
    result = cli("ps")
    assert result.code == 1
    assert result.err.startswith("Error: ZeroDivisionError") and result.err.count("\n") == 1


# ---- ps, logs, stop, delete -----------------------------------------------------------------


def test_ps_table_and_hint(fake: FakeClient, cli: CLI) -> None:
    running = make_run("train", "running", submission("running", job_provisioning_data=JPD))
    running["cost"] = 1.25  # what the server counted so far
    done = make_run(
        "old",
        "failed",
        submission("failed", termination_reason="failed_to_start_due_to_no_capacity"),
        status_message="failed",
    )
    fake.run_list = [running]
    fake.finished_list = [done]
    fake.run_list[0]["id"], fake.finished_list[0]["id"] = "a", "b"
    fake.finished_list.insert(0, fake.finished_list.pop())
    result = cli("ps")
    assert result.code == 0, result.err
    header = result.out.splitlines()[0].split()
    assert header == ["NAME", "BACKEND", "INSTANCE", "GPU", "PRICE", "COST", "STATUS", "SUBMITTED"]
    assert "gpu-fleet-0" in result.out  # which instance each job runs on (beyond dstack)
    assert "$1.25" in result.out  # the run's cost
    assert "train" in result.out and "local" in result.out and "gpu=H200:140.4GB:1" in result.out
    assert "$0" in result.out
    assert [c[2] for c in fake.calls if c[0] == "runs_list"] == [
        {"only_active": True, "limit": 100},
        {"only_active": False, "limit": 1},
    ]


def test_ps_shows_only_active_runs_with_hint(fake: FakeClient, cli: CLI) -> None:
    fake.finished_list = [
        make_run(
            "old",
            "failed",
            submission("failed", termination_reason="failed_to_start_due_to_no_capacity"),
            status_message="failed",
        )
    ]
    result = cli("ps")
    assert "old" not in result.out
    assert result.out.splitlines()[0].split()[0] == "NAME"
    assert "Shown only active runs. Use -a to show all." in result.out
    result = cli("ps", "-a")
    assert "old" in result.out and "no capacity" in result.out


def test_ps_all_and_json(fake: FakeClient, cli: CLI) -> None:
    fake.finished_list = [make_run("old", "done", submission("done"))]
    result = cli("ps", "-a")
    assert "exited (0)" in result.out
    assert [c[2]["only_active"] for c in fake.calls] == [False]
    result = cli("ps", "--json")
    assert json.loads(result.out)["project"] == "main"


def test_logs_decodes_base64(fake: FakeClient, cli: CLI) -> None:
    fake.runs["hello"] = [make_run("hello", "done", submission("done"))]
    fake.logs = [b"hello\n", "héllo ✓\n".encode()]
    result = cli("logs", "hello")
    assert result.code == 0
    assert "hello\n" in result.out
    assert fake.calls[-1][0] == "logs_poll" and fake.calls[-1][1][2] == "sub-1"


def test_logs_unknown_run(fake: FakeClient, cli: CLI) -> None:
    result = cli("logs", "nope")
    assert (result.code, result.err) == (1, "Error: Run nope not found in project main\n")


def test_stop_and_delete(fake: FakeClient, cli: CLI) -> None:
    fake.runs["hello"] = [make_run("hello", "running")]
    assert cli("stop", "hello", "-y").out.strip() == "Stopped"
    assert cli("stop", "hello", "-y", "--abort").out.strip() == "Aborted"
    assert ("runs_stop", ("main", ["hello"]), {"abort": True}) in fake.calls
    fake.runs["hello"] = [make_run("hello", "done", submission("done"))]
    result = cli("delete", "hello", "-y")
    assert result.out.strip() == "Run hello deleted"
    assert fake.calls[-1][:2] == ("runs_delete", ("main", ["hello"]))


def test_stop_asks_and_no_exits(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.runs["hello"] = [make_run("hello", "running")]
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("n\n"))
    result = cli("stop", "hello")
    assert "Exiting" in result.out
    assert "runs_stop" not in fake.names()


# ---- apply: runs ------------------------------------------------------------------------------


def test_apply_task_detached(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "submitted")]
    result = cli("apply", "-y", "-d")
    assert result.code == 0, result.err
    assert fake.names() == ["repos_init_virtual", "runs_get_plan", "fleets_list", "runs_apply"]
    run_spec = fake.calls[1][1][1]
    assert run_spec == {
        "run_name": "hello",
        "repo_id": "none",
        "repo_data": {"repo_type": "virtual"},
        "repo_code_hash": None,
        "repo_dir": None,
        "file_archives": [],
        "configuration_path": ".dstack.yml",
        "configuration": yaml.safe_load(TASK_YML),
        "profile": {"name": "default"},
    }
    assert fake.calls[3][1][1] == {"run_spec": run_spec, "current_resource": None}
    assert "Run hello submitted, detaching..." in result.out
    assert "cpu=x86:2.. mem=8GB.. disk=100GB.. gpu=nvidia:0.." in result.out
    assert "The project has no fleets" in result.out


def test_apply_instance_option_adds_selectors(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(TASK_YML + "instances: [a-0]\n")
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "submitted")]
    result = cli("apply", "-y", "-d", "--instance", "f-1", "--instance", "f-2")
    assert result.code == 0, result.err
    assert fake.calls[1][1][1]["configuration"]["instances"] == ["a-0", "f-1", "f-2"]


def test_apply_task_follows_logs_and_exit_status(fake: FakeClient, cli: CLI) -> None:
    Path("t.yml").write_text(TASK_YML)
    fake.run_plan = run_plan([OFFER])
    sub_failed = submission(
        "failed", termination_reason="container_exited_with_error", exit_status=3, job_provisioning_data=JPD
    )
    fake.runs["hello"] = [
        make_run("hello", "submitted"),
        make_run("hello", "provisioning"),
        make_run("hello", "running", submission("running", job_provisioning_data=JPD)),
        make_run("hello", "failed", sub_failed, status_message="failed"),
    ]
    fake.logs = [b"hello\n"]
    result = cli("apply", "-f", "t.yml", "-y")
    assert result.code == 3, result.err
    assert "hello submitted" in result.out or "hello provisioning" in result.out
    assert "provisioning completed (running)" in result.out
    assert result.out.count("hello\n") == 1
    assert "Exited (3)" in result.out
    assert "INSTANCE TYPE" in result.out  # the offers table


def test_apply_task_done_exits_zero(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "done", submission("done", exit_status=0))]
    fake.logs = [b"hi\n"]
    result = cli("apply", "-y")
    assert result.code == 0, result.err
    assert "hi\n" in result.out and "Exited (0)" in result.out


def test_apply_task_failing_before_running_is_error(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    sub = submission(
        "failed",
        termination_reason="failed_to_start_due_to_no_capacity",
        termination_reason_message="No offers matching the run requirements in fleet 'f'.",
    )
    fake.runs["hello"] = [
        make_run("hello", "submitted"),
        make_run("hello", "failed", sub, status_message="failed"),
    ]
    result = cli("apply", "-y")
    assert result.code == 1
    assert result.err == (
        "Error: Run hello failed (no capacity): No offers matching the run requirements in fleet 'f'.\n"
    )


def test_apply_ctrl_c_detaches(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "submitted")]

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("corral.cli.apply_run.time.sleep", interrupt)
    result = cli("apply", "-y")
    assert result.code == 0
    assert "Detached; the run keeps going. Stop it with `corral stop hello`" in result.out


def test_apply_name_and_env(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".dstack.yml").write_text(TASK_YML + "env:\n  - HF_TOKEN\n  - A=1\n")
    monkeypatch.setenv("HF_TOKEN", "secret")
    fake.run_plan = run_plan()
    fake.runs["other"] = [make_run("other", "submitted")]
    result = cli("apply", "-y", "-d", "-n", "other", "-e", "B=2")
    assert result.code == 0, result.err
    run_spec = fake.calls[1][1][1]
    assert run_spec["run_name"] == "other"
    assert run_spec["configuration"]["env"] == {"HF_TOKEN": "secret", "A": "1", "B": "2"}
    monkeypatch.delenv("HF_TOKEN")
    result = cli("apply", "-y", "-d")
    assert result.err == "Error: Environment variable HF_TOKEN is not set\n"


def test_apply_confirmation_declined(fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan()
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("n\n"))
    result = cli("apply")
    assert result.code == 0
    assert "Submit the run hello? [y/n]" in result.out
    assert "runs_apply" not in fake.names()


# ---- apply: fleets; fleet list and delete -------------------------------------------------------

FLEET = {
    "id": "f1",
    "name": "test-fleet",
    "project_name": "main",
    "created_at": "2026-11-29T22:03:48Z",
    "status": "active",
    "status_message": None,
    "spec": {
        "configuration": {
            "type": "fleet",
            "name": "test-fleet",
            "nodes": {"min": 0, "max": 3},
            "resources": REQUIREMENTS["resources"],
        },
        "configuration_path": ".dstack.yml",
        "profile": {"name": "default"},
    },
    "instances": [
        {
            "id": "i1",
            "backend": "remote",
            "corral_backend": "local",
            "instance_num": 0,
            "status": "idle",
            "instance_type": JPD["instance_type"],
            "region": None,
            "price": 0.0,
            "created": "2026-11-29T22:03:48Z",
            "total_blocks": 1,
            "busy_blocks": 0,
            "health_status": "healthy",
            "unreachable": False,
        },
    ],
}


def test_apply_fleet(fake: FakeClient, cli: CLI) -> None:
    Path(".dstack.yml").write_text(FLEET_YML)
    fake.fleet_plan = {
        "project_name": "main",
        "user": "admin",
        "spec": FLEET["spec"],
        "effective_spec": FLEET["spec"],
        "current_resource": None,
        "offers": [],
        "total_offers": 0,
        "action": "create",
    }
    fake.fleets = [FLEET]
    result = cli("apply", "-y")
    assert result.code == 0, result.err
    assert fake.names() == ["fleets_get_plan", "fleets_apply"]
    spec = {
        "configuration": yaml.safe_load(FLEET_YML),
        "configuration_path": ".dstack.yml",
        "profile": {"name": "default"},
    }
    assert fake.calls[0][1][1] == spec
    assert fake.calls[1][1][1] == {"spec": spec, "current_resource": None}
    assert "min=0 target=0 max=3" in result.out
    assert "Fleet test-fleet does not exist yet." in result.out
    assert "No matching instance offers available" in result.out
    assert "instance=0" in result.out and "idle" in result.out


def test_fleet_list_and_delete(fake: FakeClient, cli: CLI) -> None:
    fake.fleets = [FLEET]
    result = cli("fleet")
    header = result.out.splitlines()[0].split()
    assert header == ["NAME", "NODES", "GPU", "SPOT", "BACKEND", "PRICE", "STATUS", "CREATED"]
    assert "test-fleet" in result.out and "0..3" in result.out and "local" in result.out
    assert cli("fleet", "delete", "test-fleet", "-y").out.strip() == "Fleet test-fleet deleted"
    assert fake.calls[-1][:2] == ("fleets_delete", ("main", ["test-fleet"]))
    result = cli("fleet", "delete", "test-fleet", "-i", "0", "-y")
    assert fake.calls[-1][:2] == ("fleets_delete_instances", ("main", "test-fleet", [0]))
    result = cli("fleet", "delete", "nope", "-y")
    assert (result.code, result.err) == (1, "Error: Fleet nope does not exist\n")


# ---- offer and projects -----------------------------------------------------------------------


def test_offer_json_and_table(fake: FakeClient, cli: CLI) -> None:
    plan = run_plan([OFFER])
    fake.run_plan = plan
    result = cli("offer", "--gpu", "H200", "--json")
    assert result.code == 0, result.err
    output = json.loads(result.out)
    assert set(output) == {"project", "user", "requirements", "offers", "total_offers"}
    conf = fake.calls[0][1][1]["configuration"]
    assert conf["type"] == "task" and conf["commands"] == [":"] and conf["resources"]["gpu"] == "H200"
    result = cli("offer")
    assert "cpu=16 mem=128GB disk=64GB gpu=H200:140.4GB:1" in result.out


class _ProjectClient:
    def __init__(self, url: str, token: str, timeout: float = 30) -> None:
        self.token = token

    def __enter__(self) -> _ProjectClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def projects_get(self, name: str) -> dict[str, Any]:
        from corral.sdk.errors import AuthError

        if self.token != "good":
            raise AuthError("Invalid token")
        return {"project_name": name}


def test_project_add_list_set_default(env: Path, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.sdk.client.CorralClient", _ProjectClient)
    result = cli("project", "add", "--name", "main", "--url", "http://127.0.0.1:3000", "--token", "good")
    assert result.code == 0, result.err
    assert "Configuration updated at" in result.out
    cli("project", "add", "--name", "dev", "--url", "127.0.0.1:3001", "--token", "good", "-y")
    assert config_file.get_project()["name"] == "dev"
    assert config_file.get_project("dev")["url"] == "http://127.0.0.1:3001"
    assert cli("project", "set-default", "main").code == 0
    listing = cli("project", "list").out
    assert listing.split()[:3] == ["PROJECT", "URL", "DEFAULT"]
    assert "✓" in next(line for line in listing.splitlines() if line.split()[0] == "main")
    bad = cli("project", "add", "--name", "x", "--url", "http://h", "--token", "bad")
    assert (bad.code, bad.err) == (1, "Error: Forbidden: the token is not valid at http://h\n")
    assert cli("project", "set-default", "nope").code == 1


def test_server_command_calls_serve(env: Path, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    seen: dict[str, Any] = {}
    module = types.ModuleType("corral.server")
    module.main = lambda **kw: seen.update(kw)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "corral.server", module)
    assert cli("server", "--port", "3005").code == 0
    assert seen == {"host": "127.0.0.1", "port": 3005, "log_level": "info", "access_log": False}
    assert cli("server", "--access-log").code == 0
    assert seen == {"host": "127.0.0.1", "port": 3000, "log_level": "info", "access_log": True}


# ---- unknown names and nothing done: a non-zero exit naming what was not found ------------------------


def test_logs_of_a_job_or_replica_the_run_does_not_have(fake: FakeClient, cli: CLI) -> None:
    fake.runs["hello"] = [make_run("hello", "done", submission("done"))]
    fake.logs = [b"job zero\n"]
    result = cli("logs", "hello", "--job", "5")
    assert (result.code, result.err) == (1, "Error: Run hello has no job 5 in replica 0 (jobs: 0)\n")
    result = cli("logs", "hello", "--replica", "5")
    assert (result.code, result.err) == (1, "Error: Run hello has no replica 5 (replicas: 0)\n")
    assert "logs_poll" not in fake.names() and "job zero" not in result.out


def test_stop_of_a_finished_run_and_delete_of_an_active_one_do_nothing(fake: FakeClient, cli: CLI) -> None:
    fake.runs["old"] = [make_run("old", "done", submission("done"))]
    result = cli("stop", "old", "-y")
    assert (result.code, result.err) == (1, "Error: Run old has already finished (done): nothing to stop\n")
    fake.runs["busy"] = [make_run("busy", "running")]
    result = cli("delete", "busy", "-y")
    assert result.code == 1
    assert result.err == (
        "Error: Run busy is still active (running): stop it first with `corral stop busy`, then delete it\n"
    )
    assert "runs_stop" not in fake.names() and "runs_delete" not in fake.names()


def test_offer_for_an_unknown_fleet_refuses(fake: FakeClient, cli: CLI) -> None:
    fake.fleets = [{"name": "local-fleet", "project_name": "main"}]
    result = cli("offer", "--fleet", "nope")
    assert (result.code, result.err) == (1, "Error: Fleet nope not found in project main (its fleets: local-fleet)\n")
    assert "runs_get_plan" not in fake.names()
    fake.run_plan = run_plan([OFFER])
    assert cli("offer", "--fleet", "local-fleet").code == 0


def test_ps_and_apply_show_what_a_run_waits_for(fake: FakeClient, cli: CLI) -> None:
    reason = "Waiting for capacity: fleet 'f' has 1 of at most 1 instances, none free"
    waiting = make_run("hello", "submitted", submission("submitted", corral_waiting=reason), status_message="pending")
    fake.run_list = [waiting]
    result = cli("ps")
    assert f"hello: {reason}" in result.out, result.out
    Path(".dstack.yml").write_text(TASK_YML)
    fake.run_plan = run_plan([OFFER])
    fake.runs["hello"] = [waiting, make_run("hello", "done", submission("done", exit_status=0))]
    result = cli("apply", "-y")
    assert result.code == 0, result.err
    assert f"hello pending ({reason})" in result.out, result.out


def test_apply_shows_the_plan_verdict_before_asking(
    fake: FakeClient, cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    Path(".dstack.yml").write_text(TASK_YML)
    fake.fleets = [{"name": "f", "project_name": "main"}]
    fake.run_plan = {**run_plan(), "corral_plan_error": "Failed to use specified fleets: no fleet named 'nope'"}
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("n\n"))
    result = cli("apply")
    assert "The run cannot be placed: Failed to use specified fleets: no fleet named 'nope'" in result.out
    assert result.out.index("cannot be placed") < result.out.index("Exiting")
    assert "runs_apply" not in fake.names()


def test_apply_fills_env_references_in_registry_auth_as_dstacks_cli(fake: FakeClient, cli: CLI) -> None:
    auth = "registry_auth:\n  username: ${{ env.REG_USER }}\n  password: ${{ secrets.reg }}\n"
    Path(".dstack.yml").write_text(TASK_YML + "image: example.invalid/img\nenv:\n  - REG_USER=puller\n" + auth)
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "submitted")]
    result = cli("apply", "-y", "-d")
    assert result.code == 0, result.err
    sent = fake.calls[1][1][1]["configuration"]["registry_auth"]
    assert sent == {"username": "puller", "password": "${{ secrets.reg }}"}  # the server fills in secrets
    Path(".dstack.yml").write_text(TASK_YML + "image: x\nregistry_auth:\n  username: ${{ env.NOPE }}\n  password: p\n")
    result = cli("apply", "-y", "-d")
    assert result.err == "Error: registry_auth.username: Failed to interpolate due to missing vars: ['env.NOPE']\n"


def test_apply_gives_run_arguments_to_commands_as_dstacks_cli(fake: FakeClient, cli: CLI) -> None:
    commands = "type: task\nname: hello\ncommands:\n  - python t.py ${{ run.args }}\n  - echo ${{ secrets.s }} $$HOME\n"
    Path(".dstack.yml").write_text(commands)
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "submitted")]
    result = cli("apply", "-y", "-d", "--", "--lr", "0.1 0.2")
    assert result.code == 0, result.err
    sent = fake.calls[1][1][1]["configuration"]["commands"]
    assert sent == ["python t.py --lr '0.1 0.2'", "echo ${{ secrets.s }} $HOME"]
    Path(".dstack.yml").write_text("type: task\nname: hello\ncommands:\n  - echo ${{ unknown.x }}\n")
    result = cli("apply", "-y", "-d")
    assert result.err == "Error: commands[0]: Failed to interpolate due to missing vars: ['unknown.x']\n"
    Path(".dstack.yml").write_text(FLEET_YML)
    result = cli("apply", "-y", "-d", "--", "x")
    assert result.code == 2 and "run arguments" in result.err
