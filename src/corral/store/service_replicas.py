"""Service replicas as the proxy and the probes see them: the running replicas of every service (their
port on their host, their probes and readiness), one service's route (auth, ``strip_prefix`` and its
ready replicas), and the probes' results written back.

Reads are narrow (the columns needed, documents only of running replicas); imports ``domain`` and the
store's tables only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import InstanceRec
from corral.domain.statuses import ENDING_RUN
from corral.store.fleets import instance_from_row
from corral.store.tables import ACTIVE_RUN_WHERE, instances, jobs, projects, runs

#: Statuses of a run that is gone or going (the proxy answers 404 for them, as dstack).
_ENDED = ENDING_RUN


@dataclass(frozen=True)
class Replica:
    job_id: str
    run_id: str
    project_name: str
    run_name: str
    replica_num: int
    submission_num: int
    ready: bool
    #: ``[{"success_streak", "failure_streak"}]`` as last recorded (empty: never probed).
    probes: tuple[dict[str, int], ...]
    ready_at: float | None
    #: The probes of its job spec (dstack's ``ProbeSpec`` dicts) and its service port.
    probe_specs: tuple[dict[str, Any], ...]
    service_port: int
    #: Where the replica's port is on its host's loopback (a sandbox's or a bridged container's relay).
    host_port: int
    instance: InstanceRec


@dataclass(frozen=True)
class Route:
    run_id: str
    project_id: str
    auth: bool
    strip_prefix: bool
    replicas: tuple[Replica, ...]
    #: Some replica group may run at zero replicas (``replicas: 0..N``): a request then waits for one.
    scales_from_zero: bool = False
    #: The run's OpenAI model name (``model``), if any: ``/proxy/models/<project>/`` routes by it.
    model: str | None = None
    #: Where the service serves the OpenAI API (the model's ``prefix``, dstack's default ``/v1``).
    model_prefix: str = "/v1"


def _loads(text: str | None) -> Any:
    return orjson.loads(text) if text else None


def _host_port(spec: dict[str, Any], runtime: dict[str, Any] | None) -> int:
    port = int(spec.get("service_port") or 0)
    mapped = ((runtime or {}).get("ports") or {}).get(str(port))
    return int(mapped) if mapped else port


async def _replicas(conn: AsyncConnection, where: Any) -> list[Replica]:
    q = (
        sa.select(
            jobs.c.id,
            jobs.c.run_id,
            jobs.c.run_name,
            jobs.c.replica_num,
            jobs.c.submission_num,
            jobs.c.ready,
            jobs.c.probes,
            jobs.c.ready_at,
            jobs.c.job_spec,
            jobs.c.job_runtime_data,
            jobs.c.instance_id,
            projects.c.name.label("project_name"),
        )
        .join(runs, runs.c.id == jobs.c.run_id)
        .join(projects, projects.c.id == jobs.c.project_id)
        .where(
            jobs.c.status == "running",
            jobs.c.ready.is_not(None),
            jobs.c.instance_id.is_not(None),
            runs.c.deleted == sa.false(),
            where,
        )
    )
    rows = (await conn.execute(q)).all()
    if not rows:
        return []
    inst_rows = await conn.execute(sa.select(instances).where(instances.c.id.in_({r.instance_id for r in rows})))
    insts = {i.id: instance_from_row(i, "", None) for i in inst_rows}
    out = []
    for r in rows:
        spec = orjson.loads(r.job_spec)
        inst = insts.get(r.instance_id)
        if inst is None or not spec.get("service_port"):
            continue
        out.append(
            Replica(
                job_id=r.id,
                run_id=r.run_id,
                project_name=r.project_name,
                run_name=r.run_name,
                replica_num=r.replica_num,
                submission_num=r.submission_num,
                ready=bool(r.ready),
                probes=tuple(_loads(r.probes) or ()),
                ready_at=r.ready_at,
                probe_specs=tuple(spec.get("probes") or ()),
                service_port=int(spec["service_port"]),
                host_port=_host_port(spec, _loads(r.job_runtime_data)),
                instance=inst,
            )
        )
    return out


async def running_replicas(conn: AsyncConnection, follower: str | None = None) -> list[Replica]:
    """The running replicas of every service -- with ``follower``, only those whose job that server replica
    follows (holds the lease of): what its probes visit, so that each replica is probed by one server."""
    return await _replicas(conn, sa.true() if follower is None else jobs.c.lock_owner == follower)


async def route(conn: AsyncConnection, project_name: str, run_name: str) -> Route | None:
    """The live service ``run_name`` of ``project_name`` and its ready replicas (None: no such service)."""
    row = (
        await conn.execute(
            sa.select(runs.c.id, runs.c.project_id, runs.c.run_spec, runs.c.status)
            .join(projects, projects.c.id == runs.c.project_id)
            .where(
                projects.c.name == project_name,
                projects.c.deleted == sa.false(),
                runs.c.run_name == run_name,
                runs.c.deleted == sa.false(),
                runs.c.status.notin_(_ENDED),
            )
            .order_by(runs.c.submitted_at.desc())
            .limit(1)
        )
    ).first()
    if row is None:
        return None
    conf = (orjson.loads(row.run_spec) or {}).get("configuration") or {}
    if conf.get("type") != "service":
        return None
    # a replica leaving rotation (``drain_at``: rollout, scale-down) keeps its requests but gets no new one
    in_rotation = sa.and_(jobs.c.run_id == row.id, jobs.c.drain_at.is_(None), jobs.c.stop_requested.is_(None))
    ready = [r for r in await _replicas(conn, in_rotation) if r.ready]
    return Route(
        run_id=row.id,
        project_id=row.project_id,
        auth=conf.get("auth", True) is not False,
        strip_prefix=conf.get("strip_prefix", True) is not False,
        replicas=tuple(sorted(ready, key=lambda r: r.replica_num)),
        scales_from_zero=_scales_from_zero(conf),
        model=_model_name(conf),
        model_prefix=str((conf.get("model") or {}).get("prefix") or "/v1") if conf.get("model") else "/v1",
    )


def _scales_from_zero(conf: dict[str, Any]) -> bool:
    raw = conf.get("groups")
    groups: list[Any] = raw if isinstance(raw, list) else [conf]
    return any(
        isinstance(g.get("replicas"), dict) and not g["replicas"].get("min") and (g["replicas"].get("max") or 0) > 0
        for g in groups
    )


def _model_name(conf: dict[str, Any]) -> str | None:
    model = conf.get("model")
    return str(model["name"]) if isinstance(model, dict) and model.get("format", "openai") == "openai" else None


async def record_probes(conn: AsyncConnection, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Write each running replica's probe results (``ready``, ``probes`` as a list, ``ready_at``)."""
    for job_id, values in updates:
        vals = dict(values)
        if "probes" in vals:
            vals["probes"] = orjson.dumps(vals["probes"]).decode()
        await conn.execute(sa.update(jobs).where(jobs.c.id == job_id, jobs.c.status == "running").values(**vals))


async def models(conn: AsyncConnection, project_name: str) -> list[tuple[str, str, float]]:
    """The OpenAI models the live services of a project serve: ``(model name, run name, submitted_at)``,
    one per name (the newest run, as dstack resolves duplicates)."""
    rows = (
        await conn.execute(
            sa.select(runs.c.run_name, runs.c.run_spec, runs.c.submitted_at)
            .join(projects, projects.c.id == runs.c.project_id)
            .where(
                projects.c.name == project_name,
                projects.c.deleted == sa.false(),
                runs.c.deleted == sa.false(),
                sa.text(ACTIVE_RUN_WHERE),  # implied by the next: it lets the project's active runs' index serve
                runs.c.status.notin_(_ENDED),
                runs.c.service_templates.is_not(None),
            )
            .order_by(runs.c.submitted_at)
        )
    ).all()
    found: dict[str, tuple[str, str, float]] = {}
    for r in rows:
        name = _model_name((orjson.loads(r.run_spec) or {}).get("configuration") or {})
        if name is not None:
            found[name] = (name, r.run_name, float(r.submitted_at))
    return list(found.values())
