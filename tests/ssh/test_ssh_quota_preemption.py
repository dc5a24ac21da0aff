"""Quotas and preemption end to end on an SSH fleet of fake GPU hosts: two hosts with a fake ``nvidia-smi``
of 2 x A100 each, ``blocks: 2`` (four one-GPU slots), in main's fleet exported to team-b.

- team-b's ``quota.max`` of two A100s holds while 20 of its one-GPU runs are submitted at once: at no
  observed moment do more than two of its jobs hold GPUs, the others wait saying ``Waiting for quota``
  with the GPU quota named, ``quotas/usage`` never reports more than two GPUs used, all 20 end ``done``,
  and main's runs use the other two slots meanwhile; a run asking for three A100s is refused at apply.
- A priority-90 run needing a whole host preempts exactly the two low-priority runs it needs (those on
  the host of the most recently started one), which read their deadline (the grace period after the
  SIGTERM) from ``CORRAL_PREEMPTION_FILE``, end ``failed``/``interrupted_by_no_capacity`` naming it, are
  submitted again and finish ``done``; the other two run on untouched.
- team-b, below its nominal quota, takes an exported GPU back from main, which borrows them all: main's
  most recently started run is preempted (naming the reclaiming project) and finishes after, requeued.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from ssh_harness import SSH_SETTINGS, delete_all_fleets, fleet_settled, host_run, ssh_fleet

from fakehosts import FakeHosts
from server_harness import RunningServer, make_settings, running_server, wait_for

HOLDING = ("provisioning", "pulling", "running", "terminating")
FINISHED = ("done", "failed", "terminated", "aborted")
#: A file the test creates on both hosts to let the holding runs below end.
RELEASE = "/tmp/corral-quota-release"
#: Holds its GPU until released; on SIGTERM prints the preemption notice and when it came, and exits.
#: (One command: a job's commands are joined with ``&&``.)
HOLD = [
    f"if [ -f {RELEASE} ]; then exit 0; fi; "
    "trap 'cat \"$CORRAL_PREEMPTION_FILE\"; echo; echo TERM $(date +%s.%N); exit 0' TERM; "
    f"echo START $(date +%s.%N); while [ ! -f {RELEASE} ]; do sleep 0.1; done"
]


@asynccontextmanager
async def _serve(tmp_path: Path, config: str | None = None) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path, **SSH_SETTINGS)
    if config is not None:
        settings.server_dir.mkdir(parents=True)
        (settings.server_dir / "config.yml").write_text(config)
    async with running_server(settings) as s:
        try:
            yield s
        finally:
            async with s.client() as c:
                await delete_all_fleets(c)


async def _release(hosts: FakeHosts, ips: list[str], on: bool) -> None:
    names = [n for n in hosts.hosts if hosts.ip(n) in ips]
    command = f"touch {RELEASE}" if on else f"rm -f {RELEASE}"
    await asyncio.gather(*(host_run(hosts, n, command) for n in names))


async def _shared_fleet(c: httpx.AsyncClient, hosts: FakeHosts, ips: list[str]) -> None:
    """main's fleet of the two GPU hosts, exported to team-b (created first if config.yml did not)."""
    await c.post("/api/projects/create", json={"project_name": "team-b"})
    conf = ssh_fleet(hosts, "gpus", ips, blocks=2)
    body = {"force": False, "plan": {"spec": {"configuration": conf, "profile": {}}}}
    assert (await c.post("/api/project/main/fleets/apply", json=body)).status_code == 200
    await wait_for(lambda: fleet_settled(c, "gpus", 2), timeout=90)
    share = {"name": "share", "importer_projects": ["team-b"], "exported_fleets": ["gpus"]}
    assert (await c.post("/api/project/main/exports/create", json=share)).status_code == 200


def _task(name: str, commands: list[str], gpu: int | str = 1, priority: int | None = None) -> dict[str, Any]:
    configuration: dict[str, Any] = {
        "type": "task",
        "name": name,
        "commands": commands,
        "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": gpu},
    }
    if priority is not None:
        configuration["priority"] = priority
    return {"force": False, "plan": {"run_spec": {"configuration": configuration}}}


async def _submit(c: httpx.AsyncClient, project: str, name: str, commands: list[str], **kw: Any) -> None:
    r = await c.post(f"/api/project/{project}/runs/apply", json=_task(name, commands, **kw))
    assert r.status_code == 200, r.text


async def _run(c: httpx.AsyncClient, project: str, name: str) -> dict[str, Any]:
    r = await c.post(f"/api/project/{project}/runs/get", json={"run_name": name})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _runs(c: httpx.AsyncClient, project: str) -> list[dict[str, Any]]:
    r = await c.post(f"/api/project/{project}/runs/list", json={})
    assert r.status_code == 200, r.text
    return list(r.json())


async def _finished(c: httpx.AsyncClient, project: str, name: str) -> dict[str, Any] | None:
    run = await _run(c, project, name)
    return run if run["status"] in FINISHED else None


async def _logs(c: httpx.AsyncClient, project: str, run: dict[str, Any], submission: dict[str, Any]) -> str:
    body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": submission["id"], "limit": 1000}
    r = await c.post(f"/api/project/{project}/logs/poll", json=body)
    assert r.status_code == 200, r.text
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


def _submissions(run: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(x["status"], x["termination_reason"]) for x in run["jobs"][0]["job_submissions"]]


def _host(run: dict[str, Any]) -> str:
    """The instance the run's job is on."""
    jpd = run["latest_job_submission"]["job_provisioning_data"]
    return f"{jpd['instance_id']} {jpd.get('internal_ip')}"


async def _fill(c: httpx.AsyncClient, project: str, names: list[str]) -> dict[str, str]:
    """Start ``names`` (holding one GPU each) one after the other; the host each landed on."""
    where: dict[str, str] = {}
    for name in names:
        await _submit(c, project, name, HOLD, priority=0)

        async def started(name: str = name) -> dict[str, Any] | None:
            run = await _run(c, project, name)
            return run if run["status"] == "running" and "START" in await _logs(c, project, run, _latest(run)) else None

        where[name] = _host(await wait_for(started, timeout=30))
    return where


def _latest(run: dict[str, Any]) -> dict[str, Any]:
    return dict(run["latest_job_submission"])


async def test_a_gpu_quota_holds_under_20_concurrent_submitters(
    two_gpu_hosts: list[str], hosts: FakeHosts, tmp_path: Path
) -> None:
    async with _serve(tmp_path) as s, s.client() as c:
        await _shared_fleet(c, hosts, two_gpu_hosts)
        r = await c.post("/api/projects/team-b/quotas/set", json={"quota": {"max": {"gpu": {"A100": 2}}}})
        assert r.status_code == 200, r.text

        big = await c.post("/api/project/team-b/runs/apply", json=_task("big", ["true"], gpu="A100:3"))
        assert big.status_code == 400, big.text
        assert "exceeds the quota of project team-b on its own: it asks for gpu 3 of A100" in big.text, big.text
        assert "quota.max allows A100 2" in big.text, big.text

        names = [f"q-{i}" for i in range(20)]
        await asyncio.gather(*(_submit(c, "team-b", n, ["sleep 2"]) for n in names))
        for i in range(2):
            await _submit(c, "main", f"m-{i}", ["sleep 4"])

        most, used = 0, 0.0
        messages: set[str] = set()
        reasons: set[str] = set()
        main_beside = False  # main held the other two slots while team-b held its two and had more waiting

        async def drained() -> bool:
            nonlocal most, main_beside, used
            runs, mains, usage, queue = await asyncio.gather(
                _runs(c, "team-b"),
                _runs(c, "main"),
                c.post("/api/projects/team-b/quotas/usage", json={}),
                c.post("/api/scheduling/queue", json={}),
            )
            reasons.update(e["reason"] for e in queue.json() if e["project_name"] == "team-b" and e["status_message"])
            jobs = [x["latest_job_submission"] or {} for x in runs]
            holding = sum(j.get("status") in HOLDING for j in jobs)
            most = max(most, holding)
            waiting = [j.get("status_message") or "" for j in jobs if j.get("status") == "submitted"]
            messages.update(m for m in waiting if m != "submitted")  # "submitted": not yet seen by the scheduler
            used = max(used, float(usage.json()["used"].get("gpu", {}).get("any", 0)))
            main_running = sum(x["status"] == "running" for x in mains)
            main_beside = main_beside or (main_running == 2 and holding == 2 and bool(waiting))
            return all(x["status"] in FINISHED for x in runs + mains) and len(runs) == 20

        await wait_for(drained, timeout=120, interval=0.1)
        assert most == 2, most
        assert messages == {"Waiting for quota: gpu A100 2/2 in project team-b"}, messages
        assert reasons == {"quota"}, reasons  # scheduling/queue's reason for them
        assert 0 < used <= 2, used
        assert main_beside
        runs = await _runs(c, "team-b")
        assert sorted(x["run_spec"]["run_name"] for x in runs if x["status"] == "done") == sorted(names)
        assert all(x["status"] == "done" for x in await _runs(c, "main"))


PREEMPTION = """
projects:
  - name: team-b
    preemptible_max_priority: 50
scheduling:
  preemption: {enabled: true, min_priority_gap: 10, min_runtime: 0, grace_period: 2s}
"""


async def test_a_high_priority_run_preempts_what_it_needs_and_the_victims_finish(
    two_gpu_hosts: list[str], hosts: FakeHosts, tmp_path: Path
) -> None:
    await _release(hosts, two_gpu_hosts, on=False)
    async with _serve(tmp_path, PREEMPTION) as s, s.client() as c:
        await _shared_fleet(c, hosts, two_gpu_hosts)
        lows = [f"low-{i}" for i in range(4)]
        where = await _fill(c, "team-b", lows)
        # a whole host is needed: the newest run's host, the fewest and most recent runs that free one
        victims = {n for n in lows if where[n] == where[lows[-1]]}
        assert len(victims) == 2, where
        await _submit(c, "team-b", "high", ["sleep 3"], gpu=2, priority=90)

        high = await wait_for(lambda: _finished(c, "team-b", "high"), timeout=60)
        assert high["status"] == "done", _submissions(high)
        assert _host(high) == where[lows[-1]]

        async def requeued() -> list[dict[str, Any]] | None:
            runs = [await _run(c, "team-b", n) for n in sorted(victims)]
            return runs if all(len(_submissions(x)) == 2 and x["status"] == "running" for x in runs) else None

        await wait_for(requeued, timeout=60)
        await _release(hosts, two_gpu_hosts, on=True)
        runs = {n: await wait_for(lambda n=n: _finished(c, "team-b", n), timeout=30) for n in lows}
        for name in victims:
            run = runs[name]
            assert _submissions(run) == [("failed", "interrupted_by_no_capacity"), ("done", "done_by_runner")]
            first = run["jobs"][0]["job_submissions"][0]
            assert "Preempted by run high" in first["termination_reason_message"], first
            assert "Preempted by run high" in first["status_message"], first
            text = await _logs(c, "team-b", run, first)
            assert "CORRAL_PREEMPTION_MESSAGE='Preempted by run high" in text, text
            words = text.split()
            deadline = float(next(w for w in words if w.startswith("CORRAL_PREEMPTION_DEADLINE=")).split("=")[1])
            termed = float(words[words.index("TERM") + 1])
            assert termed - 1 <= deadline <= termed + 2 + 1, (termed, deadline)
        for name in set(lows) - victims:
            assert _submissions(runs[name]) == [("done", "done_by_runner")], runs[name]
    await _release(hosts, two_gpu_hosts, on=False)


RECLAIM = """
projects:
  - name: main
    quota: {nominal: {gpu: 0}}
    preemptible_max_priority: 50
  - name: team-b
    quota: {nominal: {gpu: 2}}
scheduling:
  preemption: {enabled: true, min_runtime: 0, grace_period: 2s}
"""


async def test_a_project_below_its_nominal_gpus_reclaims_one_from_a_borrowing_project(
    two_gpu_hosts: list[str], hosts: FakeHosts, tmp_path: Path
) -> None:
    await _release(hosts, two_gpu_hosts, on=False)
    async with _serve(tmp_path, RECLAIM) as s, s.client() as c:
        await _shared_fleet(c, hosts, two_gpu_hosts)
        mains = [f"main-{i}" for i in range(4)]
        await _fill(c, "main", mains)
        await _submit(c, "team-b", "back", ["sleep 1"])
        back = await wait_for(lambda: _finished(c, "team-b", "back"), timeout=60)
        assert back["status"] == "done", _submissions(back)

        async def requeued() -> dict[str, Any] | None:
            run = await _run(c, "main", mains[-1])
            return run if len(_submissions(run)) == 2 and run["status"] == "running" else None

        await wait_for(requeued, timeout=60)
        await _release(hosts, two_gpu_hosts, on=True)
        runs = {n: await wait_for(lambda n=n: _finished(c, "main", n), timeout=30) for n in mains}
        victim = runs[mains[-1]]
        assert _submissions(victim) == [("failed", "interrupted_by_no_capacity"), ("done", "done_by_runner")]
        why = "Preempted by run back of project team-b (a project reclaiming its quota)"
        assert why in victim["jobs"][0]["job_submissions"][0]["termination_reason_message"], victim
        for name in mains[:-1]:
            assert _submissions(runs[name]) == [("done", "done_by_runner")], runs[name]
    await _release(hosts, two_gpu_hosts, on=False)
