"""``docker: true`` (Docker inside the job): the job runs in the docker-in-docker image, privileged, with
``start-dockerd`` before its commands, as dstack 0.22.5 runs it (on a host whose engine cannot start a
privileged container, with every capability the host has instead); a host without Docker fails it saying why;
``CORRAL_ALLOW_DOCKER_IN_DOCKER=false`` refuses it with a 400 naming the field and the setting."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.settings import Settings, SettingsError
from docker_harness import UBUNTU, DockerEngine, dind_rootfs
from server_harness import finished_run, fleet_body, make_settings, running_server, task_body

#: dstack 0.22.5: ``DSTACK_DIND_IMAGE`` defaults to ``dstackai/dind`` (src/dstack/_internal/settings.py), and
#: its job configurator puts ``start-dockerd`` before a ``docker: true`` run's commands and makes the job
#: privileged (src/dstack/_internal/server/services/jobs/configurators/base.py).
DSTACK_DIND_IMAGE = "dstackai/dind"
DSTACK_DIND_FIRST_COMMAND = "start-dockerd"

#: The docker-in-docker image the tests make (``docker import``: no registry can be reached from here).
TEST_DIND_IMAGE = "corral-test/dind:1"


async def _logs(c: httpx.AsyncClient, run: dict[str, Any]) -> str:
    body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": run["latest_job_submission"]["id"]}
    r = await c.post("/api/project/main/logs/poll", json={**body, "limit": 1000})
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


def test_the_settings_of_docker_in_docker() -> None:
    assert Settings.from_env({}).allow_docker_in_docker is True
    assert Settings.from_env({"CORRAL_ALLOW_DOCKER_IN_DOCKER": "false"}).allow_docker_in_docker is False
    assert Settings.from_env({}).dind_image == DSTACK_DIND_IMAGE
    assert Settings.from_env({"DSTACK_DIND_IMAGE": "me/dind:2"}).dind_image == "me/dind:2"
    with pytest.raises(SettingsError, match="CORRAL_ALLOW_DOCKER_IN_DOCKER='maybe' must be true or false"):
        Settings.from_env({"CORRAL_ALLOW_DOCKER_IN_DOCKER": "maybe"})


async def test_the_plan_of_a_docker_run_is_dstack_s(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        plan = await c.post("/api/project/main/runs/get_plan", json=task_body(["docker info"], docker=True)["plan"])
        assert plan.status_code == 200, plan.text
        spec = plan.json()["job_plans"][0]["job_spec"]
        assert spec["image_name"] == DSTACK_DIND_IMAGE
        assert spec["privileged"] is True
        assert spec["commands"] == [DSTACK_DIND_FIRST_COMMAND, "docker info"]


async def test_the_admin_setting_refuses_docker_with_a_400(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, allow_docker_in_docker=False)) as s, s.client() as c:
        r = await c.post("/api/project/main/runs/apply", json=task_body(["docker info"], docker=True))
        assert r.status_code == 400, r.text
        msg = r.json()["detail"][0]["msg"]
        assert "`docker: true`" in msg and "CORRAL_ALLOW_DOCKER_IN_DOCKER=false" in msg and "remove `docker`" in msg
        plan = await c.post("/api/project/main/runs/get_plan", json=task_body(["docker info"], docker=True)["plan"])
        assert "CORRAL_ALLOW_DOCKER_IN_DOCKER=false" in plan.json()["corral_plan_error"]
        # runs without `docker` are not affected
        assert (await c.post("/api/project/main/runs/apply", json=task_body(["true"]))).status_code == 200


async def test_a_host_without_docker_fails_the_run_saying_why(tmp_path: Path) -> None:
    no_engine = f"unix://{tmp_path / 'no-docker.sock'}"  # nothing listens there: the host has no Docker
    async with running_server(make_settings(tmp_path, docker_host=no_engine)) as s, s.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body())).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=task_body(["docker info"], docker=True))
        assert r.status_code == 200, r.text
        got = await finished_run(c, r.json()["run_spec"]["run_name"])
        sub = got["latest_job_submission"]
        assert got["status"] == "failed", sub
        message = sub["termination_reason_message"]
        assert "`docker: true`" in message and "no Docker engine" in message, message
        assert "whose hosts have Docker" in message, message


@pytest.fixture(scope="module")
def dind_image(docker_engine: DockerEngine) -> Iterator[str]:
    docker_engine.import_image(TEST_DIND_IMAGE, dind_rootfs())
    yield TEST_DIND_IMAGE
    docker_engine.cli("rmi", TEST_DIND_IMAGE, check=False)


def _privileged_containers_start(engine: DockerEngine) -> tuple[bool, str]:
    """Whether this machine's engine can start a privileged container at all (a root without every
    capability, as inside another container, cannot) and the engine's error if not."""
    out = engine.cli("run", "--rm", "--privileged", UBUNTU, "true", check=False)
    return out.returncode == 0, out.stderr


#: include/uapi/linux/capability.h: CAP_SYS_RESOURCE is capability 24, the one this machine's root lacks.
CAP_SYS_RESOURCE = 24


def _host_lacks(bit: int) -> bool:
    """Whether this process's bounding set (``/proc/self/status``, proc(5)) lacks capability ``bit``."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("CapBnd:"))
    return not int(line.split()[1], 16) >> bit & 1


async def _diagnostics(c: httpx.AsyncClient, run: dict[str, Any]) -> str:
    """The agent's own lines of the job (``dstack logs -d``)."""
    body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": run["latest_job_submission"]["id"]}
    r = await c.post("/api/project/main/logs/poll", json={**body, "limit": 1000, "diagnose": True})
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


async def test_docker_runs_inside_the_job(tmp_path: Path, docker_engine: DockerEngine, dind_image: str) -> None:
    """Privileged where the engine can; on a host whose root lacks some capability (this machine's lacks
    CAP_SYS_RESOURCE), with every other one instead, saying so once."""
    settings = make_settings(tmp_path, docker_host=docker_engine.host, dind_image=dind_image)
    commands = [
        # an image made inside the job: a root filesystem of the dind image's own busybox, imported
        "mkdir -p /tmp/rootfs/bin && cp /bin/busybox /tmp/rootfs/bin/ && ln -s busybox /tmp/rootfs/bin/echo",
        "tar -C /tmp/rootfs -cf /tmp/made.tar . && docker import /tmp/made.tar made:1 >/dev/null",
        "docker run --rm --network none made:1 echo hello from the inner container",
        "docker info --format 'inner storage: {{.Driver}}'",
    ]
    async with running_server(settings) as s, s.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body())).status_code == 200
        r = await c.post("/api/project/main/runs/apply", json=task_body(commands, docker=True))
        assert r.status_code == 200, r.text
        assert r.json()["jobs"][0]["job_spec"]["image_name"] == dind_image
        got = await finished_run(c, r.json()["run_spec"]["run_name"], timeout=120)
        sub = got["latest_job_submission"]
        assert got["status"] == "done", (sub, await _diagnostics(c, got))
        out = await _logs(c, got)
        assert "dockerd started\n" in out and "hello from the inner container\n" in out, out
        assert "inner storage: vfs\n" in out, out
        said = await _diagnostics(c, got)
        privileged, engine_error = _privileged_containers_start(docker_engine)
        notices = [line for line in said.splitlines() if "cannot grant" in line]
        if privileged:  # dstack's way: --privileged, nothing said
            assert notices == [], said
        else:
            assert "unable to apply caps" in engine_error, engine_error
            assert len(notices) == 1 and "runs with every other capability" in notices[0], said
            assert _host_lacks(CAP_SYS_RESOURCE) == ("CAP_SYS_RESOURCE" in notices[0]), notices
    assert docker_engine.containers("corral.agent") == []


def _created_since(engine: DockerEngine, since: float) -> list[str]:
    """The names of the containers the engine created since ``since`` (its own event log)."""
    out = engine.cli(
        "events", "--since", str(int(since)), "--until", str(int(time.time()) + 1),
        "--filter", "type=container", "--filter", "event=create", "--format", "{{.Actor.Attributes.name}}",
    )  # fmt: skip
    return out.stdout.split()


@pytest.mark.parametrize("fallback", ["allowed", "forbidden"])
async def test_privileged_containers_are_probed_once_per_host_and_refused_saying_why(
    tmp_path: Path, docker_engine: DockerEngine, dind_image: str, monkeypatch: pytest.MonkeyPatch, fallback: str
) -> None:
    """The answer is found once per host and kept. Where ``--privileged`` fails, the agent tries every
    capability the host has instead; an agent with ``CORRAL_AGENT_PRIVILEGED_FALLBACK=false`` (the host
    where neither works, as far as the job can tell) refuses the job naming the engine's error."""
    monkeypatch.setenv("CORRAL_AGENT_PRIVILEGED_FALLBACK", "true" if fallback == "allowed" else "false")
    settings = make_settings(tmp_path, docker_host=docker_engine.host, dind_image=dind_image)
    privileged, engine_error = _privileged_containers_start(docker_engine)
    since = int(time.time()) + 1  # a whole second after what earlier tests' agents made (events are in seconds)
    await asyncio.sleep(since - time.time())
    async with running_server(settings) as s, s.client() as c:
        assert (await c.post("/api/project/main/fleets/apply", json=fleet_body())).status_code == 200
        subs = []
        for _ in range(2):
            r = await c.post("/api/project/main/runs/apply", json=task_body(["true"], docker=True))
            assert r.status_code == 200, r.text
            got = await finished_run(c, r.json()["run_spec"]["run_name"], timeout=120)
            subs.append((got["status"], got["latest_job_submission"]))
    created = _created_since(docker_engine, since)
    probes = [n for n in created if n.startswith("corral-privileged-probe-")]
    if privileged:
        assert len(probes) == 1, created  # once for the host, kept for the next job
        assert [status for status, _sub in subs] == ["done", "done"], subs
    elif fallback == "allowed":  # this machine: the engine's root lacks CAP_SYS_RESOURCE; the fallback runs
        assert "unable to apply caps" in engine_error, engine_error
        assert len(probes) == 2, created  # --privileged, then the fallback, once for the host
        assert [status for status, _sub in subs] == ["done", "done"], subs
    else:
        assert len(probes) == 1, created
        for status, sub in subs:
            message = sub["termination_reason_message"]
            assert status == "failed" and "This host cannot run a privileged container" in message, sub
            assert "unable to apply caps" in message and "remove `docker`" in message, message
            assert "CORRAL_AGENT_PRIVILEGED_FALLBACK=false" in message, message
        assert [n for n in created if n.startswith("corral-")] == probes  # no container of either job was made
    assert docker_engine.containers("corral.agent") == []
