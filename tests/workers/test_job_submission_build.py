"""A job's submission to its agent, built whole from the job, its run, its replica's nodes and what was gathered
for it; and how a job's end is recorded, from the agent's last state and the stop the server asked for."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from test_job_container import _inst, _job

from corral.agent.protocol import JobState, NetworkMount, RepoCheckout
from corral.domain.records import RunRec
from corral.domain.statuses import InstanceStatus, JobStatus, RunStatus
from corral.settings import Settings
from corral.workers.jobs.code import JobCode
from corral.workers.jobs.nodes import nodes_of
from corral.workers.jobs.outcomes import End, end_of, started_values
from corral.workers.jobs.submission import Given, build_submission

SETTINGS = Settings(server_dir=Path("/nonexistent"), database_url="sqlite+aiosqlite://")


def _run(conf: dict[str, Any], jobs: tuple[Any, ...] = ()) -> RunRec:
    return RunRec(
        id="r", project_id="p", project_name="main", user_name="admin", run_name="run", submitted_at=0.0,
        last_processed_at=0.0, status=RunStatus.RUNNING, status_message=None, termination_reason=None,
        run_spec={"configuration": conf, "repo_id": "repo"}, priority=0, fleet_id=None, fleet_name=None,
        deployment_num=0, deleted=False, jobs=jobs,
    )  # fmt: skip


def test_a_single_node_job_is_built_whole() -> None:
    spec = {"commands": ["echo hi"], "env": {"A": "${{ secrets.A }}"}, "stop_duration": 3, "max_duration": 60}
    job = dataclasses.replace(_job(), job_spec=spec)
    inst = _inst()
    run = _run({"type": "task", "commands": ["echo hi"], "working_dir": "src"}, (job,))
    code = JobCode(RepoCheckout(repo_type="virtual", repo_dir=".", code_hash="abc"))
    mount = NetworkMount("data", "vol-1", "/dev/sdf", "/data")
    given = Given({"A": "secret"}, secret_values=("secret",), network_volumes=(mount,), code=code)
    sub = build_submission(job, run, nodes_of(job, inst, run, [inst]), SETTINGS, given)
    assert (sub.job_id, sub.run_name, sub.commands, sub.working_dir) == ("j", "run", ["echo hi"], "src")
    assert sub.env["A"] == "secret" and sub.env["DSTACK_MASTER_NODE_IP"] == "127.0.0.1"
    assert sub.env["DSTACK_REPO_ID"] == "repo" and sub.env["DSTACK_GPUS_PER_NODE"] == "4"
    assert (sub.stop_duration, sub.max_duration, sub.home_dir) == (3.0, 60.0, "/root")
    assert sub.repo == code.repo and sub.network_volumes == [mount]
    assert not sub.host_network and sub.image is None and sub.container is None


def test_nodes_across_hosts_keep_the_hosts_network_and_fill_the_group_addresses() -> None:
    spec = {"commands": ["ping ${{ groups[0].nodes[1].IP_ADDRESS }}"], "jobs_per_replica": 2}
    first = dataclasses.replace(_job(), job_spec=spec)
    second = dataclasses.replace(_job(), id="j2", job_num=1, instance_id="i2", job_spec={"node_group_job_index": 1})
    insts = [dataclasses.replace(_inst(), backend="ssh", hostname="10.0.0.1"),
             dataclasses.replace(_inst(), id="i2", backend="ssh", hostname="10.0.0.2")]  # fmt: skip
    run = _run({"type": "task"}, (second, first))
    nodes = nodes_of(first, insts[0], run, insts)
    assert (nodes.ips, nodes.one_host, nodes.ready, nodes.master_ip) == (
        ("10.0.0.1", "10.0.0.2"),
        False,
        True,
        "10.0.0.1",
    )
    sub = build_submission(first, run, nodes, SETTINGS, Given({}))
    assert sub.host_network and sub.commands == ["ping 10.0.0.2"]
    assert sub.env["DSTACK_NODES_IPS"] == "10.0.0.1\n10.0.0.2" and sub.env["DSTACK_GPUS_NUM"] == "8"


def test_nodes_on_one_host_wait_for_every_instance() -> None:
    first = _job()
    second = dataclasses.replace(_job(), id="j2", job_num=1, instance_id="i2")
    starting = dataclasses.replace(_inst(), id="i2", status=InstanceStatus.PROVISIONING, agent=None)
    run = _run({"type": "task"}, (first, second))
    nodes = nodes_of(first, _inst(), run, [_inst(), starting])
    assert nodes.one_host and not nodes.ready


def test_an_image_and_the_registry_auth_given_make_a_container() -> None:
    job = _job()
    run = _run({"type": "task", "image": "private/x", "registry_auth": {"username": "u", "password": "sealed"}})
    given = Given({}, registry_auth={"username": "u", "password": "clear"})
    sub = build_submission(job, run, nodes_of(job, _inst(), run, [_inst()]), SETTINGS, given)
    assert sub.image == "private/x" and sub.container is not None
    assert (sub.container.registry_username, sub.container.registry_password) == ("u", "clear")


def test_docker_true_runs_in_the_image_its_job_spec_names_privileged_under_bash() -> None:
    job = dataclasses.replace(_job(), job_spec={"image_name": "me/dind:2", "commands": ["start-dockerd", "docker ps"]})
    run = _run({"type": "task", "docker": True, "commands": ["docker ps"]})
    default = dataclasses.replace(SETTINGS, default_image="corral/default:1")  # not for docker: true
    sub = build_submission(job, run, nodes_of(job, _inst(), run, [_inst()]), default, Given({}))
    assert (sub.image, sub.shell, sub.commands) == ("me/dind:2", "bash", ["start-dockerd", "docker ps"])
    assert sub.container is not None and sub.container.privileged and sub.container.docker_in_docker


def test_how_a_job_ends() -> None:
    job = dataclasses.replace(_job(), termination_reason_message="idle for an hour")
    done = JobState("j", "done", exit_status=0)
    assert end_of(job, done, None) == End("done", "done_by_runner", None)
    assert end_of(job, JobState("j", "done", exit_status=3), None) == End(
        "failed", "container_exited_with_error", "The job exited with code 3"
    )
    assert end_of(job, done, "abort") == End("aborted", "aborted_by_user", None)
    assert end_of(job, done, "inactivity") == End("terminated", "inactivity_duration_exceeded", "idle for an hour")
    assert end_of(job, done, "resubmit") == End("terminated", "terminated_by_server", "Run is to be resubmitted")
    assert end_of(job, done, "terminate") == End("terminated", "terminated_by_user", None)
    failed = JobState("j", "failed")
    assert end_of(job, failed, None) == End("failed", "creating_container_error", None)
    assert end_of(job, failed, None, executor_error=True) == End("failed", "executor_error", None)
    setup = JobState("j", "failed", message="no repo", termination_reason="setup_failed")
    assert end_of(job, setup, None) == End("failed", "container_exited_with_error", "no repo")


def test_what_is_recorded_of_a_start() -> None:
    job = _job(status=JobStatus.PROVISIONING)
    run = _run({"type": "task", "image": "x"})
    sub = build_submission(job, run, nodes_of(job, _inst(), run, [_inst()]), SETTINGS, Given({}))
    pending = started_values(job, _inst(), sub, JobState("j", "pending"), ("server", 2222), 5.0)
    assert pending["status"] == "pulling" and pending["ssh_seen_at"] == 5.0
    assert (pending["job_provisioning_data"]["hostname"], pending["job_provisioning_data"]["ssh_port"]) == (
        "server",
        2222,
    )
    running = started_values(job, _inst(), sub, JobState("j", "running"), None, 5.0)
    assert running["status"] == "running" and running["job_provisioning_data"]["hostname"] == "h"
