"""``SlurmCompute`` against the real test cluster: an allocation per instance (a gang: one allocation of N nodes),
its agent reached through the login node, Slurm's pending reason said while it waits, a job Slurm can never start
refused, termination by ``scancel``, the reaper, allocations that end outside corral reported lost, and the sweep of
the files ended allocations leave on the login node."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.agent.zipapp import content_hash
from corral.backends.base import GangLauncher, InterruptionSource, PortOpener, ProvisioningError
from corral.backends.slurm.batch import SiteOptions, agent_path
from corral.backends.slurm.cluster import SlurmCluster
from corral.backends.slurm.compute import Cluster, Hooks, SlurmCompute
from corral.backends.slurm.model import SlurmClusterConfig
from corral.domain.records import InstanceRec
from corral.domain.statuses import InstanceStatus
from skip_policy import needs_root
from slurm_harness import CLUSTER_NAME, CPU_NODES, HOME, USER, SlurmTestCluster

pytestmark = needs_root("the Slurm cluster runs in network namespaces")

SERVER = "srv-test"
#: Seconds a file of an ended job is kept after its last write, in these tests.
SWEEP_GRACE = 1.0
CPU_OFFER = {"cpus": 1, "memory_mib": 1000, "gpus": []}


@dataclass
class Rows:
    """The instance rows' statuses as the server would answer, and what the backend said on their jobs."""

    statuses: dict[str, str] = field(default_factory=dict)
    notes: list[tuple[list[str], str]] = field(default_factory=list)

    async def server_id(self) -> str:
        return SERVER

    async def row_statuses(self, ids: list[str]) -> Mapping[str, str]:
        return {i: self.statuses[i] for i in ids if i in self.statuses}

    async def note(self, ids: list[str], message: str) -> None:
        self.notes.append((ids, message))


class OneCluster:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster

    async def get(self, project: str, cluster: str) -> tuple[Cluster, SiteOptions]:
        assert cluster == CLUSTER_NAME
        return self.cluster, SiteOptions()

    async def all(self) -> Sequence[Cluster]:
        return [self.cluster]


@dataclass
class Backend:
    compute: SlurmCompute
    rows: Rows
    cluster: SlurmCluster


@pytest.fixture
async def backend(slurm: SlurmTestCluster, tmp_path: Path) -> AsyncIterator[Backend]:
    config = SlurmClusterConfig(name=CLUSTER_NAME, hostname=slurm.login_ip, user=USER)
    cluster = SlurmCluster(config, slurm.key_pem())
    rows = Rows()
    hooks = Hooks(rows.server_id, rows.row_statuses, rows.note)
    compute = SlurmCompute(OneCluster(cluster), hooks, tmp_path, max_pending=60.0, poll=0.5, sweep_grace=SWEEP_GRACE)
    try:
        yield Backend(compute, rows, cluster)
    finally:
        await compute.aclose()
        await cluster.aclose()


def _row(rows: Rows, partition: str = "cpu", resources: dict[str, Any] | None = None, num: int = 0) -> InstanceRec:
    rid = str(uuid.uuid4())
    rows.statuses[rid] = "pending"
    offer = {"backend": "slurm", "instance_type": "node", "region": CLUSTER_NAME, "price": 0.0, "zone": partition}
    offer["resources"] = resources or CPU_OFFER
    return InstanceRec(
        id=rid, project_id="p", project_name="main", fleet_id="f", fleet_name="fl", name=f"fl-{num}",
        instance_num=num, status=InstanceStatus.PENDING, unreachable=False, backend="slurm", region=CLUSTER_NAME,
        price=0.0, offer=offer, total_blocks=1, busy_blocks=0, hostname=None, agent=None, created_at=time.time(),
        started_at=None, finished_at=None, last_job_finished_at=None, idle_duration=None,
        termination_reason=None, termination_reason_message=None,
    )  # fmt: skip


def _provisioned_row(row: InstanceRec, agent: dict[str, Any]) -> InstanceRec:
    return dataclasses.replace(row, status=InstanceStatus.BUSY, agent=agent)


def _files(slurm: SlurmTestCluster) -> set[str]:
    """The names in the cluster user's ``~/.corral/slurm``."""
    return set(slurm.as_user(f"ls {HOME}/.corral/slurm").split())


def _corral_jobs(slurm: SlurmTestCluster) -> list[dict[str, str]]:
    return [j for j in slurm.squeue() if j["name"].startswith("corral-") and j["state"] in ("PENDING", "RUNNING")]


async def _run_job(url: str, token: str, command: str) -> str:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=20) as http:
        body = {"job_id": "j1", "run_name": "r", "commands": [command]}
        assert (await http.post("/jobs", json=body)).status_code == 200
        deadline = time.monotonic() + 20
        while (state := (await http.get("/jobs/j1")).json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.1)
        assert state["state"] == "done", state
        entries = (await http.get("/jobs/j1/logs")).json()["entries"]
    return "".join(base64.b64decode(e["message_b64"]).decode() for e in entries)


async def test_an_instance_is_an_allocation_its_agent_runs_jobs_and_scancel_ends_it(
    slurm: SlurmTestCluster, backend: Backend
) -> None:
    row = _row(backend.rows)
    p = await backend.compute.create_instance(row)
    node = p.addresses[0]
    assert node in CPU_NODES and p.hostname == p.internal_ip == slurm.hosts.ip(node) and p.agent.connection
    [job] = _corral_jobs(slurm)
    assert job["name"] == f"corral-{row.id}" and job["state"] == "RUNNING" and job["nodes"] == node
    live = _provisioned_row(row, p.agent.to_json())
    url = backend.compute.agent_url(live)
    assert url.startswith("http://127.0.0.1:")
    logs = await _run_job(url, p.agent.token, "echo hello from $(hostname) as $(id -un)")
    assert f"hello from {node} as {USER}" in logs
    assert await backend.compute.lost_instances([live]) == []
    t0 = time.monotonic()
    await backend.compute.terminate_instance(row.id, p.agent)
    assert not _corral_jobs(slurm) and time.monotonic() - t0 < 15
    # the job's endpoint dir and output removed (a cancellation line the node's step daemon appends late is
    # removed by the sweep); other tests' jobs may have left theirs, which are not this one's
    mine = {str(job["id"]), f"{job['id']}.out"}
    deadline = time.monotonic() + 10
    while left := mine & _files(slurm):
        assert time.monotonic() < deadline, (left, slurm.as_user(f"ls -l {HOME}/.corral/slurm"))
        await asyncio.sleep(0.5)
        await backend.compute.sweep_files([], force=True)


async def test_a_gang_is_one_allocation_in_rank_order(slurm: SlurmTestCluster, backend: Backend) -> None:
    rows = [_row(backend.rows, num=i) for i in range(2)]
    ps = await backend.compute.create_gang(rows, True, None)
    [job] = _corral_jobs(slurm)
    assert job["name"] == f"corral-{rows[0].id}"
    hostnames = [p.addresses[0] for p in ps]
    assert len(set(hostnames)) == 2
    order = slurm.as_user(f"scontrol show hostnames {job['nodes']}").split()
    assert hostnames == order  # rank 0 first: the order of the allocation's node list
    await backend.compute.terminate_instance(rows[0].id, ps[0].agent)
    assert not _corral_jobs(slurm)


async def test_pending_reason_is_said_and_an_unwanted_row_cancels_its_job(
    slurm: SlurmTestCluster, backend: Backend
) -> None:
    for _ in CPU_NODES:  # the cpu partition full
        slurm.as_user("sbatch -p cpu -N1 --exclusive --wrap 'sleep 300' -o /dev/null")
    # Once they all run, a new job waits for Resources (while one still pends, Slurm says Priority).
    deadline = time.monotonic() + 30
    while sum(j["state"] == "RUNNING" for j in slurm.squeue()) < len(CPU_NODES):
        assert time.monotonic() < deadline, slurm.squeue()
        await asyncio.sleep(0.2)
    row = _row(backend.rows)
    task = asyncio.create_task(backend.compute.create_instance(row))
    deadline = time.monotonic() + 20
    while not backend.rows.notes:
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.1)
    ids, message = backend.rows.notes[0]
    assert ids == [row.id] and "pending: Resources" in message
    backend.rows.statuses[row.id] = "terminated"  # the fleet was deleted meanwhile
    with pytest.raises(ProvisioningError, match="no longer wanted"):
        await asyncio.wait_for(task, 30)
    assert not _corral_jobs(slurm)


async def test_a_job_slurm_can_never_start_fails_with_slurms_reason(slurm: SlurmTestCluster, backend: Backend) -> None:
    row = _row(backend.rows, resources={"cpus": 64, "memory_mib": 1000, "gpus": []})  # more than any cpu node
    with pytest.raises(ProvisioningError, match="Slurm says the job can never start: PartitionConfig"):
        await backend.compute.create_instance(row)
    assert not _corral_jobs(slurm)
    gpus = [{"name": "A100", "memory_mib": 81920}]
    row = _row(backend.rows, resources={"cpus": 1, "memory_mib": 1000, "gpus": gpus})  # GPUs from the cpu partition
    with pytest.raises(ProvisioningError, match=r"sbatch refused the allocation: .*not available"):
        await backend.compute.create_instance(row)
    assert not _corral_jobs(slurm)


async def test_reaper_and_lost_allocations(slurm: SlurmTestCluster, backend: Backend) -> None:
    kept, orphan = _row(backend.rows), _row(backend.rows)
    p_kept = await backend.compute.create_instance(kept)
    await backend.compute.create_instance(orphan)
    assert len(_corral_jobs(slurm)) == 2
    assert len(await backend.compute.reap_unknown({kept.id})) == 1
    [job] = _corral_jobs(slurm)
    assert job["name"] == f"corral-{kept.id}"
    slurm.root("login", f"scancel {job['id']}")  # ended outside corral
    live = _provisioned_row(kept, p_kept.agent.to_json())
    deadline = time.monotonic() + 15
    while not (lost := await backend.compute.lost_instances([live])):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.5)
    assert lost[0].row_id == kept.id and f"Slurm job {job['id']}" in lost[0].message


async def test_the_capabilities_it_has(backend: Backend) -> None:
    assert isinstance(backend.compute, GangLauncher)  # a multi-node run is one allocation
    assert isinstance(backend.compute, InterruptionSource)  # allocations ended outside corral
    assert isinstance(backend.compute, PortOpener)  # services' replicas on the nodes


async def _until_ended(slurm: SlurmTestCluster, *job_ids: str) -> None:
    """Until Slurm lists none of ``job_ids`` as holding or waiting for nodes."""
    deadline = time.monotonic() + 30
    while any(j["id"] in job_ids and j["state"] in ("PENDING", "RUNNING", "COMPLETING") for j in slurm.squeue()):
        assert time.monotonic() < deadline, slurm.squeue()
        await asyncio.sleep(0.2)


def _job_id(p: Any) -> str:
    return str(p.agent.connection["job_id"])


async def test_the_sweep_removes_the_files_of_jobs_the_reaper_and_the_time_limit_cancelled_never_a_live_ones(
    slurm: SlurmTestCluster, backend: Backend
) -> None:
    kept, orphan, ending = _row(backend.rows), _row(backend.rows), _row(backend.rows)
    p_kept, p_orphan, p_ending = [await backend.compute.create_instance(r) for r in (kept, orphan, ending)]
    live_kept = _provisioned_row(kept, p_kept.agent.to_json())
    ended = {_job_id(p_orphan), f"{_job_id(p_orphan)}.out", _job_id(p_ending), f"{_job_id(p_ending)}.out"}
    assert ended <= _files(slurm)
    assert await backend.compute.reap_unknown({kept.id, ending.id}) == [_job_id(p_orphan)]  # by the reaper
    soon = {**(p_ending.agent.connection or {}), "ends_early": True, "ends_at": time.time() + 1, "limit": 60}
    live_ending = _provisioned_row(ending, {**p_ending.agent.to_json(), "connection": soon})
    [gone] = await backend.compute.lost_instances([live_kept, live_ending])  # ahead of its time limit
    assert gone.row_id == ending.id
    # cancelled only once its row is recorded lost (the worker's ``forget``): its jobs end with the reason, not
    # with what its agent, stopped by the cancellation, would report first
    assert [j["state"] for j in slurm.squeue() if j["id"] == _job_id(p_ending)] == ["RUNNING"]
    await backend.compute.forget(ending.id)
    await _until_ended(slurm, _job_id(p_orphan), _job_id(p_ending))
    await asyncio.sleep(SWEEP_GRACE)
    removed = await backend.compute.sweep_files([live_kept], force=True)
    assert not ended & _files(slurm) and set(removed) <= ended, (removed, _files(slurm))
    # the running job's files are its agent's: never touched, and its agent still answers
    assert {_job_id(p_kept), f"{_job_id(p_kept)}.out"} <= _files(slurm)
    assert await backend.compute.lost_instances([live_kept]) == []
    # a job that ended outside corral keeps its files while a live row records it
    slurm.root("login", f"scancel {_job_id(p_kept)}")
    await _until_ended(slurm, _job_id(p_kept))
    await asyncio.sleep(SWEEP_GRACE)
    await backend.compute.sweep_files([live_kept], force=True)
    assert f"{_job_id(p_kept)}.out" in _files(slurm)
    assert f"{_job_id(p_kept)}.out" in await backend.compute.sweep_files([], force=True)
    assert not {_job_id(p_kept), f"{_job_id(p_kept)}.out"} & _files(slurm)


async def test_the_sweep_removes_what_a_failed_provisioning_left(slurm: SlurmTestCluster, backend: Backend) -> None:
    # an agent that cannot start (a broken zipapp in the shared home): the allocation runs, writes its output,
    # and provisioning fails and cancels it
    agent = agent_path(HOME, content_hash())
    slurm.as_user(f"mkdir -p $(dirname {agent}) && echo broken > {agent}")
    try:
        with pytest.raises(ProvisioningError, match=r"Slurm job \d+ ended .*its output") as failed:
            await backend.compute.create_instance(_row(backend.rows))
    finally:
        slurm.as_user(f"rm -f {agent}")
    job_id = str(failed.value).split()[3]
    await _until_ended(slurm, job_id)
    assert f"{job_id}.out" in _files(slurm)
    await asyncio.sleep(SWEEP_GRACE)
    assert f"{job_id}.out" in await backend.compute.sweep_files([], force=True)
    assert not {job_id, f"{job_id}.out"} & _files(slurm)


async def test_a_late_write_is_swept_after_the_grace_in_one_command_and_nothing_to_do_is_quiet(
    slurm: SlurmTestCluster, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    row = _row(backend.rows)
    p = await backend.compute.create_instance(row)
    job_id, node = _job_id(p), p.addresses[0]
    await backend.compute.terminate_instance(row.id, p.agent)
    await _until_ended(slurm, job_id)
    assert not {job_id, f"{job_id}.out"} & _files(slurm)
    # the node's step daemon writing its cancellation line after Slurm stopped listing the job brings the file back
    out = f"{HOME}/.corral/slurm/{job_id}.out"
    slurm.as_user(f"echo 'slurmstepd: error: *** JOB {job_id} ON {node} CANCELLED ***' >> {out}", host=node)
    assert await backend.compute.sweep_files([], force=True) == []  # written within the grace: kept
    assert f"{job_id}.out" in _files(slurm)
    await asyncio.sleep(SWEEP_GRACE)
    before = sum(backend.cluster.calls_per_minute().values())
    assert await backend.compute.sweep_files([], force=True) == [f"{job_id}.out"]
    assert sum(backend.cluster.calls_per_minute().values()) == before + 1  # one command on the login node
    assert not _files(slurm) & {job_id, f"{job_id}.out"}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="corral.slurm"):
        assert await backend.compute.sweep_files([], force=True) == []
        assert await backend.compute.sweep_files([]) == []  # within sweep_every of the last: not run
    # corral's own log says nothing (another component's lines, an HTTP server's in this process, may come meanwhile)
    assert not [r for r in caplog.records if r.name.startswith("corral.")], caplog.text
    assert sum(backend.cluster.calls_per_minute().values()) == before + 2


async def test_nothing_is_removed_while_slurm_cannot_say_which_jobs_live(
    slurm: SlurmTestCluster, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    d = f"{HOME}/.corral/slurm"
    job_id = slurm.as_user(f"mkdir -p {d} && sbatch --parsable -p cpu -o {d}/%j.out --wrap 'echo done'").strip()
    await _until_ended(slurm, job_id)
    await asyncio.sleep(SWEEP_GRACE)
    slurm.stop_controller()
    try:
        with caplog.at_level(logging.WARNING, logger="corral.slurm"):
            assert await backend.compute.sweep_files([], force=True) == []
    finally:
        slurm.start_controller()
    assert f"{job_id}.out" in _files(slurm)
    assert any("squeue failed" in r.getMessage() for r in caplog.records), caplog.text
    assert await backend.compute.sweep_files([], force=True) == [f"{job_id}.out"]
