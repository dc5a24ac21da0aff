"""``SlurmCompute``: instances that are nodes of Slurm allocations running corral's agent.

Provisioning a reserved instance row (or a gang's rows: one allocation of N nodes, all or none) goes: find a job
this server already submitted for the rows (a server restarted meanwhile adopts it), else upload the agent
zipapp to the cluster user's home once per build and ``sbatch`` the script of :mod:`.batch` through the login
node; wait for Slurm to run it, writing Slurm's pending reason on the rows' jobs as it changes (the pending rule
of :mod:`.states`: cancelled when Slurm says it can never start, or after ``max_pending``); then read each node's
endpoint file (``{url, token}``, in the allocation's node order: rank 0 first) and ask each agent what it is.

The server reaches an agent through a local port forwarded over the cluster's one SSH connection
(:class:`~corral.backends.local_forward.LocalForward`, opening a channel to the node's agent through the
login node); ``open_port`` reaches a replica's port on the node the same way. Terminating an instance
``scancel``s its allocation (a run's graceful stop -- the agent's SIGTERM to the job and its ``stop_duration`` --
happened before, when the jobs worker stopped the job) and waits until Slurm no longer runs it. The reaper
cancels this server's jobs whose rows are gone; :meth:`lost_instances` reports rows whose allocation ended or
whose node failed under them, and then sweeps (:meth:`sweep_files`, :mod:`.sweep`) the files that allocations
ended by any way but termination left on the login node.

May import: what ``corral.backends`` may, and the agent's zipapp builder (it ships the agent).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corral.agent.zipapp import build_zipapp, content_hash
from corral.backends.agent_client import AgentClient, AgentError, AgentUnreachable
from corral.backends.base import AgentEndpoint, Provisioned, ProvisioningError
from corral.backends.local_forward import LocalForward
from corral.backends.slurm import batch, parse, states, sweep
from corral.domain.records import InstanceRec
from corral.scheduler.codec import resources_from_json
from corral.scheduler.types import Offer

log = logging.getLogger("corral.slurm")

#: The statuses of the instance rows of the ids given (a missing id: no such row), read when called.
RowStatuses = Callable[[list[str]], Awaitable[Mapping[str, str]]]
#: Say on the jobs of these rows why they wait (Slurm's pending reason).
Note = Callable[[list[str], str], Awaitable[None]]
#: The shortest ``max_duration`` (seconds) of the jobs these rows are for; None: none has one.
MaxDuration = Callable[[list[str]], Awaitable[float | None]]


async def _no_max_duration(ids: list[str]) -> float | None:
    return None


class Cluster(Protocol):
    """What this module asks of a cluster's connection (``backends.slurm.cluster.SlurmCluster``)."""

    async def run(self, cmd: str, input: str | None = None, timeout: float = 30) -> Any: ...

    async def snapshot(self, max_age: float = 2.0) -> Any: ...

    async def open_connection(self, host: str, port: int) -> tuple[Any, Any]: ...


class Clusters(Protocol):
    """The configured clusters (``backends.slurm.registry``)."""

    async def get(self, project: str, cluster: str) -> tuple[Cluster, batch.SiteOptions]:
        """The cluster named ``cluster`` of ``project``'s backend and its site options (raises
        ``ProvisioningError`` when there is none)."""
        ...

    async def all(self) -> Sequence[Cluster]:
        """Every configured cluster (the reaper looks at each)."""
        ...


@dataclass(frozen=True)
class Hooks:
    """What the server lends the backend: its id (in every job's comment), the rows' statuses, a way to say
    why rows wait, the rows' jobs' ``max_duration``."""

    server_id: Callable[[], Awaitable[str]]
    row_statuses: RowStatuses
    note: Note
    max_duration: MaxDuration = _no_max_duration


@dataclass(frozen=True)
class Lost:
    row_id: str
    message: str


@dataclass(frozen=True)
class _Bound:
    """What the allocation's time limit is made of, and the limit."""

    max_duration: float | None
    partition_limit: str | None
    bound: batch.TimeBound


@dataclass(frozen=True)
class _Limit:
    """A running allocation's end (unix time; None: no limit), its limit in seconds, the limit described, and
    whether the server ends it before Slurm does (not when the limit is the run's own ``max_duration``)."""

    ends_at: float | None
    seconds: int | None
    said: str
    ends_early: bool


@dataclass
class _Home:
    home: str
    python: str
    agent_hash: str


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _tail(text: str, limit: int = 600) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


def _job(snapshot: Any, job_id: str) -> Any | None:
    return next((j for j in snapshot.jobs if str(j.id) == job_id), None)


class SlurmCompute:
    name = "slurm"
    owns_hosts = True

    def __init__(
        self,
        clusters: Clusters,
        hooks: Hooks,
        cache_dir: Path,
        offers: Callable[[], list[Offer]] = list,
        max_pending: float = 1800.0,
        start_timeout: float = 120.0,
        poll: float = 1.0,
        request_timeout: float = 5.0,
        sweep_grace: float = sweep.GRACE_S,
        sweep_every: float = sweep.EVERY_S,
    ) -> None:
        self._clusters = clusters
        self.hooks = hooks
        self.cache_dir = cache_dir
        self._offers = offers
        self.max_pending = max_pending
        self.start_timeout = start_timeout
        self.poll = poll
        self.request_timeout = request_timeout
        self._homes: dict[int, _Home] = {}
        self._uploading: dict[int, asyncio.Lock] = {}
        self._tunnels: dict[str, LocalForward] = {}
        self.sweep_grace = sweep_grace
        self.sweep_every = sweep_every
        self._swept_at: dict[int, float] = {}
        #: Allocations about to reach their time limit, by the row reported lost for it: cancelled once that row
        #: is recorded lost (:meth:`forget`), so that its jobs end with the reason and not with what the agents,
        #: stopped by the cancellation, would report first.
        self._ending: dict[str, tuple[Cluster, str]] = {}

    def offers(self) -> list[Offer]:
        return self._offers()

    # ---- the agent on the cluster ------------------------------------------------------------
    async def _home(self, cluster: Cluster) -> _Home:
        """The cluster user's home and python3, with this build of the agent uploaded there (once: concurrent
        provisionings wait for the first)."""
        known = self._homes.get(id(cluster))
        if known is not None:
            return known
        lock = self._uploading.setdefault(id(cluster), asyncio.Lock())
        async with lock:
            known = self._homes.get(id(cluster))
            return known if known is not None else await self._upload(cluster)

    async def _upload(self, cluster: Cluster) -> _Home:
        digest = content_hash()
        probe = await cluster.run('echo "home=$HOME"; echo "python=$(command -v python3)"', timeout=30)
        facts = dict(line.split("=", 1) for line in _text(probe.stdout).splitlines() if "=" in line)
        home, python = facts.get("home", "").strip(), facts.get("python", "").strip()
        if not home.startswith("/"):
            raise ProvisioningError(f"slurm: the login node did not say the user's home: {_tail(_text(probe.stderr))}")
        path = batch.agent_path(home, digest)
        data = base64.b64encode(build_zipapp(self.cache_dir / "agent.pyz").read_bytes()).decode()
        q = shlex.quote(path)
        tmp = shlex.quote(f"{path}.tmp") + ".$$"  # another server may upload the same build at the same time
        # An agent already there still reads its input to the end: the login node does not close the channel while
        # the upload is still being written.
        command = (
            f"if test -s {q}; then cat > /dev/null; "
            f"else mkdir -p $(dirname {q}) && base64 -d > {tmp} && mv -f {tmp} {q}; fi"
        )
        result = await cluster.run(command, input=data, timeout=120)
        if result.exit_status != 0:
            raise ProvisioningError(f"slurm: cannot upload the agent to {path}: {_tail(_text(result.stderr))}")
        known = _Home(home, python or "python3", digest)
        self._homes[id(cluster)] = known
        return known

    # ---- provisioning ------------------------------------------------------------------------
    async def create_instance(self, instance: InstanceRec) -> Provisioned:
        return (await self.create_gang([instance], False, None))[0]

    async def create_gang(self, rows: list[InstanceRec], cluster: bool, reservation: str | None) -> list[Provisioned]:
        """One allocation of ``len(rows)`` nodes, its agents up: all of them, or the job is cancelled."""
        lead = rows[0]
        conn, site = await self._clusters.get(lead.project_name, lead.region or "")
        home = await self._home(conn)
        ids = [r.id for r in rows]
        bound = await self._bound(conn, site, rows)
        job_id = await self._find(conn, tuple(ids)) or await self._submit(conn, site, home, rows, bound)
        try:
            await self._wait_running(conn, job_id, ids, home)
            nodes = await self._wait_endpoints(conn, job_id, len(rows), home)
            limit = await self._limit(conn, job_id, bound)
            out = []
            for row, node in zip(rows, nodes, strict=True):
                out.append(await self._provisioned(conn, lead.region or "", row, job_id, node, limit))
            return out
        except asyncio.CancelledError:
            # not given back: the row stays pending, and whoever provisions it next (this server started again,
            # or another replica once this one's lease has expired) adopts the job by its comment
            raise
        except BaseException:
            await self._cancel(conn, job_id)
            raise

    async def _bound(self, conn: Cluster, site: batch.SiteOptions, rows: list[InstanceRec]) -> _Bound:
        """The time limit the allocation is asked with: the run's ``max_duration``, the cluster's ``time_limit``,
        the partition's (``sinfo %l``), the smallest."""
        partition = str((rows[0].offer or {}).get("zone") or "").split(",")[0]
        snap = await conn.snapshot()
        limit = next((p.time_limit for p in snap.partitions if p.name == partition), None)
        max_duration = await self.hooks.max_duration([r.id for r in rows])
        return _Bound(max_duration, limit, batch.time_bound(max_duration, site.time_limit, partition, limit))

    async def _limit(self, conn: Cluster, job_id: str, bound: _Bound) -> _Limit:
        """The running job's time limit as Slurm has it (``squeue %l``, ``%L``: the time left): when it ends."""
        result = await conn.run(f"squeue -h -j {job_id} -o '{parse.TIME_LEFT_FORMAT}'")
        try:
            seen = parse.parse_time_left(_text(result.stdout))
        except ValueError as e:
            log.warning("Slurm job %s: its time limit is not known: %s", job_id, e)
            return _Limit(None, bound.bound.seconds, batch.describe(bound.bound), False)
        ends_at = time.time() + seen.left if seen.left is not None else None
        source = bound.bound.source if bound.bound.sbatch is not None else f"partition {seen.partition}'s time limit"
        said = batch.describe(batch.TimeBound(seen.limit, None, source))
        return _Limit(ends_at, seen.limit, said, source != batch.RUN_SOURCE)

    async def _find(self, conn: Cluster, ids: tuple[str, ...]) -> str | None:
        """The allocation this server submitted for ``ids`` before (a restart between sbatch and record)."""
        server = await self.hooks.server_id()
        for job in (await conn.snapshot(max_age=0)).jobs:
            if batch.parse_comment(job.comment or "") == (server, ids) and job.state in states.ACTIVE:
                log.info("adopting Slurm job %s of instance(s) %s", job.id, ", ".join(ids))
                return str(job.id)
        return None

    async def _submit(
        self, conn: Cluster, site: batch.SiteOptions, home: _Home, rows: list[InstanceRec], bound: _Bound
    ) -> str:
        offer = rows[0].offer or {}
        res = resources_from_json(offer.get("resources") or {"cpus": 1, "memory_mib": 1024})
        zone = str(offer.get("zone") or "")
        if not zone:
            raise ProvisioningError("slurm: the offer names no partition", "refused")
        req = batch.BatchRequest(
            row_ids=tuple(r.id for r in rows), server_id=await self.hooks.server_id(),
            partitions=tuple(zone.split(",")),
            cpus=res.cpus, memory_mib=res.memory_mib, gpus=len(res.gpus), gpu_type=None, home=home.home,
            agent_hash=home.agent_hash, site=site, python=home.python, max_duration=bound.max_duration,
            partition_limit=bound.partition_limit,
        )  # fmt: skip
        result = await conn.run(
            f"mkdir -p {shlex.quote(batch.slurm_dir(home.home))} && sbatch --parsable", input=batch.script(req)
        )
        job_id = _text(result.stdout).strip().split(";")[0]
        if result.exit_status != 0 or not job_id.isdigit():
            said = _tail(_text(result.stderr) or _text(result.stdout)) or f"exit status {result.exit_status}"
            raise ProvisioningError(f"slurm: sbatch refused the allocation: {said}", "refused")
        log.info("submitted Slurm job %s for %s", job_id, ", ".join(r.name for r in rows))
        return job_id

    async def _wait_running(self, conn: Cluster, job_id: str, ids: list[str], home: _Home) -> None:
        """Until Slurm runs the job; its pending reason said on the rows' jobs as it changes."""
        started, said = time.monotonic(), None
        while True:
            snap = await conn.snapshot(max_age=self.poll)
            job = _job(snap, job_id)
            if job is None and snap.taken_at < started:  # a pass from before the job was submitted
                await asyncio.sleep(self.poll)
                continue
            if job is None or job.state not in states.ACTIVE:
                why = await self._output(conn, home, job_id)
                raise ProvisioningError(f"slurm: {states.ended_message(job_id, job and job.state)}{why}", "refused")
            if job.state in ("RUNNING", "COMPLETING"):
                return
            reason = "" if job.reason in ("None", "(null)") else str(job.reason or "")
            verdict = states.pending_verdict(reason, time.monotonic() - started, self.max_pending)
            if verdict is not None:
                raise ProvisioningError(f"slurm: job {job_id} {verdict}", "no_capacity")
            statuses = await self.hooks.row_statuses(ids)
            if any(statuses.get(i) != "pending" for i in ids):
                raise ProvisioningError(f"slurm: job {job_id} cancelled: its instance is no longer wanted", "refused")
            if reason != said:
                await self.hooks.note(ids, f"Slurm job {job_id} pending: {reason or 'queued'}")
                said = reason
            await asyncio.sleep(self.poll)

    async def _wait_endpoints(self, conn: Cluster, job_id: str, count: int, home: _Home) -> list[states.NodeEndpoint]:
        """Each node of the running allocation with its agent's endpoint, rank order (waits for the agents)."""
        d = shlex.quote(f"{batch.slurm_dir(home.home)}/{job_id}")
        command = (
            f'nl=$(squeue -h -j {job_id} -o %N); for n in $(scontrol show hostnames "$nl"); do '
            'a=$(scontrol show -o node "$n" | tr " " "\\n" | sed -n "s/^NodeAddr=//p"); printf "%s %s " "$n" "$a"; '
            f'cat {d}/"$n".json 2>/dev/null || printf -- -; echo; done'
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            nodes = states.parse_endpoints(_text((await conn.run(command)).stdout))
            if states.all_written(nodes, count):
                return nodes
            job = _job(await conn.snapshot(max_age=self.poll), job_id)
            if job is None or job.state not in states.ACTIVE or time.monotonic() > deadline:
                what = "did not start its agents in time" if job is not None else "ended"
                raise ProvisioningError(f"slurm: job {job_id} {what}{await self._output(conn, home, job_id)}")
            await asyncio.sleep(self.poll)

    async def _output(self, conn: Cluster, home: _Home, job_id: str) -> str:
        """The end of the job's own output (it says why a job died before its agents started)."""
        path = shlex.quote(f"{batch.slurm_dir(home.home)}/{job_id}.out")
        said = _tail(_text((await conn.run(f"tail -n 20 {path} 2>/dev/null")).stdout))
        return f"; its output: {said}" if said else ""

    async def _provisioned(
        self, conn: Cluster, cluster_name: str, row: InstanceRec, job_id: str, node: states.NodeEndpoint, limit: _Limit
    ) -> Provisioned:
        assert node.url is not None and node.token is not None
        port = int(node.url.rsplit(":", 1)[1])
        connection = {
            "project": row.project_name,
            "cluster": cluster_name,
            "job_id": job_id,
            "node": node.node,
            "host": node.addr,
            "port": port,
            "ends_at": limit.ends_at,
            "limit": limit.seconds,
            "limit_said": limit.said,
            "ends_early": limit.ends_early,
        }
        endpoint = AgentEndpoint(url=node.url, token=node.token, connection=connection)
        tunnel = self._tunnel(row.id, conn, node.addr, port)
        client = AgentClient(tunnel.local_url(), node.token, timeout=self.request_timeout)
        try:
            await client.info()
        except (AgentUnreachable, AgentError) as e:
            raise ProvisioningError(f"slurm: the agent on {node.node} (job {job_id}) does not answer: {e}") from None
        finally:
            await client.aclose()
        offer = row.offer or {}
        resources = resources_from_json(offer.get("resources") or {"cpus": 1, "memory_mib": 1024})
        return Provisioned(
            agent=endpoint,
            hostname=node.addr,  # what jobs see as the instance's address (DSTACK_MASTER_NODE_IP...)
            resources=resources,
            internal_ip=node.addr,
            addresses=(node.node, node.addr),
            status_message=states.running_message(job_id, node.node, limit.ends_at, limit.said),
        )

    # ---- reaching agents ---------------------------------------------------------------------
    def _tunnel(self, instance_id: str, conn: Cluster, host: str, port: int) -> LocalForward:
        tunnel = self._tunnels.get(instance_id)
        if tunnel is None:

            async def opener() -> tuple[Any, Any]:
                return await conn.open_connection(host, port)

            tunnel = LocalForward(opener, f"{host}:{port}")
            self._tunnels[instance_id] = tunnel
        return tunnel

    def _connection(self, instance: InstanceRec) -> dict[str, Any]:
        connection = (instance.agent or {}).get("connection") or {}
        if not connection.get("host") or not connection.get("port"):
            raise ProvisioningError(f"instance {instance.name} has no Slurm node recorded")
        return dict(connection)

    def agent_url(self, instance: InstanceRec) -> str:
        tunnel = self._tunnels.get(instance.id)
        if tunnel is None:
            c = self._connection(instance)
            host, port = str(c["host"]), int(c["port"])
            project, cluster = instance.project_name, str(c.get("cluster") or instance.region or "")

            async def opener() -> tuple[Any, Any]:
                conn, _site = await self._clusters.get(project, cluster)
                return await conn.open_connection(host, port)

            tunnel = LocalForward(opener, f"{host}:{port}")
            self._tunnels[instance.id] = tunnel
        return tunnel.local_url()

    async def open_port(self, instance: InstanceRec, port: int) -> tuple[Any, Any]:
        """A stream to ``port`` on the instance's node, through the login node (a replica's port)."""
        c = self._connection(instance)
        conn, _site = await self._clusters.get(instance.project_name, str(c.get("cluster") or instance.region or ""))
        try:
            return await conn.open_connection(str(c["host"]), port)
        except Exception as e:  # asyncssh's ChannelOpenError: nothing listens there
            raise ConnectionRefusedError(f"{instance.name}: port {port}: {e}") from None

    async def recover(self, instance: InstanceRec) -> None:
        """Nothing to start again: an agent that died ended its allocation's step (the job is then lost)."""

    # ---- termination -------------------------------------------------------------------------
    async def _cancel(self, conn: Cluster, job_id: str, wait: float = 0.0) -> None:
        """``scancel`` the job; with ``wait``, until Slurm no longer runs it (raises past that, to be retried).

        A job in ``COMPLETING`` is waited for too, within ``wait``, but never raised for: its step daemon writes
        the cancellation line into the job's output file on its way out, which would bring back a file removed
        before it is done; a node stuck completing only delays the removal.
        """
        result = await conn.run(f"scancel {job_id}")
        if result.exit_status != 0 and "Invalid job id" not in _text(result.stderr):
            raise RuntimeError(f"scancel {job_id} failed: {_tail(_text(result.stderr))}")
        deadline = time.monotonic() + wait
        while wait > 0:
            job = _job(await conn.snapshot(max_age=0), job_id)
            running = job is not None and job.state in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED")
            if job is None or not (running or job.state == "COMPLETING"):
                return
            if time.monotonic() > deadline:
                if running:
                    raise RuntimeError(f"Slurm job {job_id} is still {job.state} after scancel")
                return
            await asyncio.sleep(0.5)

    async def terminate_instance(self, instance_id: str, agent: AgentEndpoint | None) -> None:
        """Cancel the instance's allocation (all its nodes: a gang ends together) and remove its files."""
        await self._forget(instance_id)
        c = (agent.connection if agent is not None else None) or {}
        job_id = str(c.get("job_id") or "")
        if not job_id.isdigit():
            return  # never submitted: nothing on the cluster
        project = str(c.get("project") or "")
        conn, _site = await self._clusters.get(project, str(c.get("cluster") or ""))
        await self._cancel(conn, job_id, wait=30.0)
        home = await self._home(conn)
        base = batch.slurm_dir(home.home)
        # a line the node's step daemon writes late brings the output file back: the sweep removes it then
        await conn.run(f"rm -rf {shlex.quote(f'{base}/{job_id}')} {shlex.quote(f'{base}/{job_id}.out')}")

    async def _forget(self, instance_id: str) -> None:
        tunnel = self._tunnels.pop(instance_id, None)
        if tunnel is not None:
            await tunnel.close()

    async def forget(self, instance_id: str) -> None:
        """Drop a lost row's tunnel; an allocation reported ending is cancelled now, its row recorded lost (one that
        fails to be is cancelled by the reaper: no live row owns it)."""
        await self._forget(instance_id)
        ending = self._ending.pop(instance_id, None)
        if ending is not None:
            await self._cancel(*ending)

    async def reap_unknown(self, known_instance_ids: set[str]) -> list[str]:
        """Cancel this server's Slurm jobs none of whose rows is live (the AWS reaper's rule)."""
        for instance_id in [i for i in self._tunnels if i not in known_instance_ids]:
            await self._forget(instance_id)
        return await self.reap_jobs(known_instance_ids)

    async def reap_jobs(self, known_instance_ids: set[str]) -> list[str]:
        reaped: list[str] = []
        server = await self.hooks.server_id()
        for conn in await self._all_clusters():
            for job in (await conn.snapshot(max_age=0)).jobs:
                parsed = batch.parse_comment(job.comment or "")
                if parsed is None or parsed[0] != server or job.state not in states.ACTIVE:
                    continue
                if not set(parsed[1]) & known_instance_ids:
                    log.warning("cancelling Slurm job %s: no live instance owns it", job.id)
                    await self._cancel(conn, str(job.id))
                    reaped.append(str(job.id))
        return reaped

    async def _all_clusters(self) -> Sequence[Cluster]:
        return await self._clusters.all()

    # ---- interruptions -----------------------------------------------------------------------
    async def lost_instances(self, live: list[InstanceRec]) -> Sequence[Lost]:
        """Rows whose allocation ended without corral (or whose node failed under them), and rows whose allocation
        is about to reach its time limit (``states.ending``: cancelled ahead of Slurm, by :meth:`forget`)."""
        lost: list[Lost] = []
        now = time.time()
        self._ending = {}  # a row reported ending but not recorded lost (corral terminates it) is not cancelled here
        by_cluster: dict[tuple[str, str], list[InstanceRec]] = {}
        for inst in live:
            c = (inst.agent or {}).get("connection") or {}
            by_cluster.setdefault((inst.project_name, str(c.get("cluster") or inst.region or "")), []).append(inst)
        for (project, name), rows in by_cluster.items():
            conn, _site = await self._clusters.get(project, name)
            snap = await conn.snapshot()
            node_state = {n.name: str(n.state) for n in snap.nodes}
            for inst in rows:
                c = (inst.agent or {}).get("connection") or {}
                job_id, node = str(c.get("job_id") or ""), str(c.get("node") or "")
                job = _job(snap, job_id)
                ends_at, limit = c.get("ends_at"), c.get("limit")
                if job is None or job.state not in states.ACTIVE:
                    lost.append(Lost(inst.id, states.ended_message(job_id, job and job.state, c.get("limit_said"))))
                elif states.node_lost(node_state.get(node, "")):
                    lost.append(Lost(inst.id, f"node {node} of Slurm job {job_id} is {node_state[node]}"))
                elif c.get("ends_early") and isinstance(ends_at, (int, float)) and states.ending(now, ends_at, limit):
                    self._ending[inst.id] = (conn, job_id)  # cancelled once its row is recorded lost: ``forget``
                    lost.append(Lost(inst.id, states.ending_message(job_id, ends_at, str(c.get("limit_said")))))
        await self.sweep_files(live)
        return lost

    async def sweep_files(self, live: Sequence[InstanceRec], force: bool = False) -> list[str]:
        """Remove on each cluster's login node the files of the jobs that ended and that no row of ``live`` records
        (:mod:`.sweep`), each cluster at most every ``sweep_every`` seconds unless ``force``; the names removed."""
        keep = sweep.keep_input(str(((i.agent or {}).get("connection") or {}).get("job_id") or "") for i in live)
        removed: list[str] = []
        now = time.monotonic()
        for conn in await self._all_clusters():
            last = self._swept_at.get(id(conn))
            if not force and last is not None and now - last < self.sweep_every:
                continue
            self._swept_at[id(conn)] = now
            try:
                result = await conn.run(sweep.command(self.sweep_grace), input=keep)
            except Exception as e:  # the login node unreachable: the next pass sweeps
                log.warning("sweeping corral's Slurm files failed: %s", e)
                continue
            swept = sweep.parse(result.exit_status, _text(result.stdout), _text(result.stderr))
            if swept.error is not None:
                log.warning("sweeping corral's Slurm files failed: %s", swept.error)
            elif swept.removed:
                log.info("removed the files of ended Slurm jobs: %s", ", ".join(swept.removed))
            removed.extend(swept.removed)
        return removed

    async def aclose(self) -> None:
        for instance_id in list(self._tunnels):
            await self._forget(instance_id)
