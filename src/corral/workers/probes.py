"""The probes worker: every running service replica is probed at its probes' ``interval`` (an HTTP request
to its port through the channel the server has to its host; without probes, a connection to the port) by
the one server replica that follows its job (holds its lease; another takes over with the lease, from the
recorded probe state),
and its readiness follows the results (``domain.probes``: ``ready_after`` successes to enter,
``probe_failure_threshold`` failures to leave, back when passing again).

Load (one narrow query a tick) -> probe (no transaction open) -> decide (pure) -> apply (one short
transaction, only when something the API shows or the proxy routes by changed). A change of readiness, or
a routed replica that stopped running, wakes ``services``: every replica's proxy drops its cached routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from corral.backends.http1 import Http1Error, simple_request
from corral.backends.replica_port import open_replica
from corral.context import Context
from corral.domain.probes import Streak, due, effective_probes, readiness
from corral.store import service_replicas as store

log = logging.getLogger("corral.probes")
#: How long a connection to a replica's port must stay open to count as accepted (a sandbox's relay
#: accepts at once and closes at once when nothing listens behind it).
PORT_SETTLE = 0.2
#: While ready, ``ready_at`` is refreshed this often (the service's failure clock, ``workers.runs``).
READY_AT_EVERY = 10.0


async def probe_once(ctx: Context, rep: store.Replica, spec: dict[str, Any]) -> bool:
    timeout = float(spec.get("timeout") or 10)
    try:
        reader, writer = await open_replica(ctx.computes, rep.instance, rep.host_port, timeout)
    except (OSError, asyncio.TimeoutError, ConnectionError):
        return False
    if spec.get("type") == "tcp":
        try:
            data = await asyncio.wait_for(reader.read(1), PORT_SETTLE)
            return bool(data)
        except asyncio.TimeoutError:
            return True  # open and quiet: something listens
        except (OSError, ConnectionError):
            return False
        finally:
            with contextlib.suppress(Exception):
                writer.close()
    headers = [(b"host", f"127.0.0.1:{rep.service_port}".encode()), (b"user-agent", b"corral-probe")]
    headers += [(str(h["name"]).encode(), str(h["value"]).encode()) for h in spec.get("headers") or ()]
    body = spec.get("body")
    try:
        status, _ = await simple_request(
            reader,
            writer,
            str(spec.get("method") or "get").upper(),
            str(spec.get("url") or "/"),
            headers,
            body.encode() if isinstance(body, str) else None,
            timeout,
        )
    except (Http1Error, OSError, asyncio.TimeoutError, ConnectionError):
        return False
    return 200 <= status < 300


def _shown(streaks: list[Streak], specs: list[dict[str, Any]], threshold: int) -> list[dict[str, int]]:
    """The streaks as recorded: capped where nothing more changes (so a steady replica writes nothing)."""
    return [
        Streak(min(s.success, int(p.get("ready_after") or 1)), min(s.failure, threshold)).to_json()
        for s, p in zip(streaks, specs, strict=True)
    ]


class Probes:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._streaks: dict[str, list[Streak]] = {}
        self._last: dict[tuple[str, int], float] = {}
        self._written: dict[str, tuple[bool, list[dict[str, int]], float | None]] = {}
        self._routed: set[str] = set()
        self._stopping = False

    async def run(self) -> None:
        while not self._stopping:
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not self.ctx.lacked_space("the probes pass", e):
                    log.exception("probes pass failed")
            else:
                self.ctx.went_through("the probes pass")
            await asyncio.sleep(self.ctx.settings.probe_tick)

    def stop(self) -> None:
        self._stopping = True

    async def pass_once(self) -> None:  # noqa: C901
        async with self.ctx.db.read() as conn:
            replicas = await store.running_replicas(conn, self.ctx.replica_id)  # the jobs this server follows
        now = time.time()
        live = {r.job_id for r in replicas}
        for key in [k for k in self._last if k[0] not in live]:
            del self._last[key]
        for job_id in [j for j in self._streaks if j not in live]:
            self._streaks.pop(job_id, None)
            self._written.pop(job_id, None)
        work: list[tuple[store.Replica, int, dict[str, Any]]] = []
        for rep in replicas:
            specs = effective_probes(rep.probe_specs)
            if rep.job_id not in self._streaks:
                recorded = [Streak.from_json(p) for p in rep.probes]
                self._streaks[rep.job_id] = recorded if len(recorded) == len(specs) else [Streak() for _ in specs]
                self._written[rep.job_id] = (rep.ready, list(rep.probes), rep.ready_at)
            for i, spec in enumerate(specs):
                if due(spec, rep.ready, self._last.get((rep.job_id, i)), now):
                    work.append((rep, i, spec))
                    self._last[(rep.job_id, i)] = now
        results = await asyncio.gather(*(probe_once(self.ctx, rep, spec) for rep, _, spec in work))
        for (rep, i, _), ok in zip(work, results, strict=True):
            self._streaks[rep.job_id][i] = self._streaks[rep.job_id][i].after(ok)
        threshold = self.ctx.settings.probe_failure_threshold
        updates: list[tuple[str, dict[str, Any]]] = []
        changed = False
        now = time.time()
        for rep in replicas:
            specs = effective_probes(rep.probe_specs)
            streaks = self._streaks[rep.job_id]
            ready = readiness(rep.ready, specs, streaks, threshold)
            shown = _shown(streaks, specs, threshold)
            was_ready, was_shown, ready_at = self._written[rep.job_id]
            values: dict[str, Any] = {}
            if ready != was_ready:
                values["ready"] = ready
                changed = True
                log.info(
                    "service %s/%s: replica %d %s",
                    rep.project_name,
                    rep.run_name,
                    rep.replica_num,
                    "is ready" if ready else "failed its probes: out of traffic",
                )
            if shown != was_shown:
                values["probes"] = shown
            if ready and (ready_at is None or now - ready_at >= READY_AT_EVERY or ready != was_ready):
                values["ready_at"] = ready_at = now
            if values:
                updates.append((rep.job_id, values))
                self._written[rep.job_id] = (ready, shown, ready_at)
        routed = {r.job_id for r in replicas if self._written[r.job_id][0]}
        if self._routed - routed:
            changed = True  # a replica the proxy routes to stopped running, or left traffic
        self._routed = routed
        if updates:
            async with self.ctx.db.write() as conn:
                await store.record_probes(conn, updates)
        if changed:
            self.ctx.wakeups.wake("services", "runs")
