"""The ``gateways`` table: dstack's gateways, held on an SSH fleet's host.

Each change writes its event in the same transaction (dstack 0.22.5's texts). A status change is checked
against the gateway transition table (``domain/statuses.py``, through ``store/transitions.py``'s rule: an
illegal change raises under ``CORRAL_STRICT_TRANSITIONS``, else it is logged and not written). The host a
gateway takes is capacity: it is held and released by ``store/plan_apply.py`` (``hold_for_gateway``,
``release_gateway_hold``), never here.

What the gateway's operation uses: :func:`get`, :func:`to_operate` (gateways with something to do),
:func:`set_status`, :func:`set_connection`, :func:`delete` (after the host is released) and
:func:`by_secret_hash`. Imports the store's tables, events and transitions, and ``domain``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.documents import json_default
from corral.domain.events import gateway_target, status_change_message
from corral.domain.gateways import GatewayRec
from corral.domain.statuses import FINISHED_RUN, GATEWAY_STATUS, GatewayStatus
from corral.store import transitions
from corral.store.errors import Conflict
from corral.store.events import emit
from corral.store.tables import gateways, projects, runs


def _dump(value: Any) -> str:
    return orjson.dumps(value, default=json_default).decode()


def _rec(r: Any) -> GatewayRec:
    return GatewayRec(
        id=r.id,
        project_id=r.project_id,
        project_name=r.project_name,
        name=r.name,
        status=GATEWAY_STATUS[r.status],
        status_message=r.status_message,
        configuration=orjson.loads(r.configuration),
        wildcard_domain=r.wildcard_domain,
        is_default=bool(r.is_default),
        to_be_deleted=bool(r.to_be_deleted),
        created_at=r.created_at,
        instance_id=r.instance_id,
        hostname=r.hostname,
        secret_hash=r.secret_hash,
        secret_sealed=r.secret_sealed,
        connection=orjson.loads(r.connection) if r.connection else None,
        last_seen_at=r.last_seen_at,
    )


_SELECT = sa.select(gateways, projects.c.name.label("project_name")).join(
    projects, projects.c.id == gateways.c.project_id
)


def _target(g: GatewayRec) -> Any:
    return gateway_target(g.project_id, g.id, g.name)


async def create(
    conn: AsyncConnection,
    project_id: str,
    name: str,
    configuration: Mapping[str, Any],
    secret_hash: str,
    secret_sealed: str,
    now: float,
    actor_id: str | None,
) -> GatewayRec:
    """A new ``submitted`` gateway (not the project's default: :func:`set_default` makes it so);
    :class:`~corral.store.errors.Conflict` if the project has one named ``name``."""
    gid = str(uuid.uuid4())
    try:
        async with conn.begin_nested():
            await conn.execute(
                sa.insert(gateways).values(
                    id=gid, project_id=project_id, name=name, status=GatewayStatus.SUBMITTED.value,
                    configuration=_dump(configuration), wildcard_domain=configuration.get("domain"),
                    is_default=False, to_be_deleted=False, created_at=now, last_processed_at=now,
                    secret_hash=secret_hash, secret_sealed=secret_sealed,
                )
            )  # fmt: skip
    except sa.exc.IntegrityError as e:
        raise Conflict(str(e.orig)) from e
    made = await get(conn, gid)
    assert made is not None
    await emit(conn, "Gateway created. Status: SUBMITTED", actor_id, [_target(made)])
    return made


async def get(conn: AsyncConnection, gateway_id: str) -> GatewayRec | None:
    r = (await conn.execute(_SELECT.where(gateways.c.id == gateway_id))).first()
    return _rec(r) if r is not None else None


async def locked(conn: AsyncConnection, gateway_id: str) -> GatewayRec | None:
    """The gateway, its row locked for the rest of the transaction (Postgres; SQLite's write transaction
    excludes other writers already): a service published on it and its deletion are written one after the
    other, never both on a stale read."""
    r = (await conn.execute(_SELECT.where(gateways.c.id == gateway_id).with_for_update(of=gateways))).first()
    return _rec(r) if r is not None else None


async def by_name(conn: AsyncConnection, project_id: str, name: str) -> GatewayRec | None:
    q = _SELECT.where(gateways.c.project_id == project_id, gateways.c.name == name)
    r = (await conn.execute(q)).first()
    return _rec(r) if r is not None else None


async def by_names(conn: AsyncConnection, project_id: str, names: Sequence[str]) -> list[GatewayRec]:
    q = _SELECT.where(gateways.c.project_id == project_id, gateways.c.name.in_(list(names)))
    return [_rec(r) for r in await conn.execute(q.order_by(gateways.c.name))]


async def of_project(conn: AsyncConnection, project_id: str) -> list[GatewayRec]:
    """The project's gateways, oldest first."""
    q = _SELECT.where(gateways.c.project_id == project_id).order_by(gateways.c.created_at, gateways.c.id)
    return [_rec(r) for r in await conn.execute(q)]


async def by_ids(conn: AsyncConnection, ids: Sequence[str]) -> dict[str, GatewayRec]:
    if not ids:
        return {}
    return {r.id: _rec(r) for r in await conn.execute(_SELECT.where(gateways.c.id.in_(list(ids))))}


async def default_of(conn: AsyncConnection, project_id: str) -> GatewayRec | None:
    q = _SELECT.where(gateways.c.project_id == project_id, gateways.c.is_default == sa.true())
    r = (await conn.execute(q)).first()
    return _rec(r) if r is not None else None


async def names_in_use(conn: AsyncConnection, project_id: str) -> set[str]:
    q = sa.select(gateways.c.name).where(gateways.c.project_id == project_id)
    return {r[0] for r in await conn.execute(q)}


async def hostnames_in_use(conn: AsyncConnection) -> set[str]:
    """The addresses of every gateway's host (a host serves one gateway: it owns the host's ports 80 and 443)."""
    q = sa.select(gateways.c.hostname).where(gateways.c.hostname.is_not(None))
    return {r[0] for r in await conn.execute(q)}


async def by_secret_hash(conn: AsyncConnection, secret_hash: str) -> GatewayRec | None:
    """The gateway whose secret hashes to ``secret_hash`` (sha256, hex), if any."""
    r = (await conn.execute(_SELECT.where(gateways.c.secret_hash == secret_hash))).first()
    return _rec(r) if r is not None else None


async def to_operate(conn: AsyncConnection) -> list[GatewayRec]:
    """Gateways with something to do: not yet running (and not failed), or marked for deletion."""
    q = _SELECT.where(
        sa.or_(gateways.c.to_be_deleted == sa.true(), gateways.c.status.in_(("submitted", "provisioning")))
    )
    return [_rec(r) for r in await conn.execute(q.order_by(gateways.c.created_at))]


async def services_on(conn: AsyncConnection, gateway_id: str) -> list[str]:
    """The names of the unfinished runs published on the gateway."""
    q = sa.select(runs.c.run_name).where(
        runs.c.gateway_id == gateway_id,
        runs.c.deleted == sa.false(),
        runs.c.status.not_in([s.value for s in FINISHED_RUN]),
    )
    return sorted(r[0] for r in await conn.execute(q))


async def service_run_ids(conn: AsyncConnection, gateway_id: str) -> list[str]:
    """The ids of the unfinished runs published on the gateway."""
    q = sa.select(runs.c.id).where(
        runs.c.gateway_id == gateway_id,
        runs.c.deleted == sa.false(),
        runs.c.status.not_in([s.value for s in FINISHED_RUN]),
    )
    return [r[0] for r in await conn.execute(q)]


async def update_configuration(
    conn: AsyncConnection, g: GatewayRec, configuration: Mapping[str, Any], changed: Sequence[str], actor_id: str | None
) -> None:
    """An in-place update (``domain``, ``default``, ``replicas``): the configuration stored, the wildcard domain
    kept equal to its ``domain``; the event names the ``changed`` fields."""
    await conn.execute(
        sa.update(gateways)
        .where(gateways.c.id == g.id)
        .values(configuration=_dump(configuration), wildcard_domain=configuration.get("domain"))
    )
    await emit(conn, f"Gateway updated. Changed fields: {', '.join(changed)}", actor_id, [_target(g)])


async def set_default(conn: AsyncConnection, project_id: str, g: GatewayRec | None, actor_id: str | None) -> None:
    """Make ``g`` the project's default gateway (None: the project has none), each change an event."""
    old = await default_of(conn, project_id)
    if old is not None and (g is None or old.id != g.id):
        await conn.execute(sa.update(gateways).where(gateways.c.id == old.id).values(is_default=False))
        await emit(conn, "Gateway unset as project default", actor_id, [_target(old)])
    if g is not None and (old is None or old.id != g.id):
        await conn.execute(sa.update(gateways).where(gateways.c.id == g.id).values(is_default=True))
        await emit(conn, "Gateway set as project default", actor_id, [_target(g)])


async def mark_to_be_deleted(conn: AsyncConnection, found: Sequence[GatewayRec], actor_id: str | None) -> None:
    for g in found:
        if g.to_be_deleted:
            continue
        await conn.execute(sa.update(gateways).where(gateways.c.id == g.id).values(to_be_deleted=True))
        await emit(conn, "Gateway marked for deletion", actor_id, [_target(g)])


async def set_status(
    conn: AsyncConnection,
    gateway_id: str,
    new: GatewayStatus,
    now: float,
    message: str | None = None,
    expect: Sequence[GatewayStatus] | None = None,
) -> bool:
    """Move a gateway to ``new`` (with ``message`` as its status message) while it is in one of ``expect`` (if
    given); whether it was written. A change the transition table refuses is not (``store/transitions.py``)."""
    g = await get(conn, gateway_id)
    if g is None or (expect is not None and g.status not in expect):
        return False
    if not transitions.permit_kind("gateway", gateway_id, g.status.value, new.value):
        return False
    values = {"status": new.value, "status_message": message, "last_processed_at": now}
    await conn.execute(sa.update(gateways).where(gateways.c.id == gateway_id).values(**values))
    if new != g.status:
        text = status_change_message("gateway", g.status.value, new.value, None, message)
        await emit(conn, text, None, [_target(g)])
    return True


async def set_host(conn: AsyncConnection, gateway_id: str, instance_id: str | None, hostname: str | None) -> None:
    """Record the host the gateway is held on (written with the hold, in its transaction)."""
    await conn.execute(
        sa.update(gateways).where(gateways.c.id == gateway_id).values(instance_id=instance_id, hostname=hostname)
    )


async def set_connection(
    conn: AsyncConnection, gateway_id: str, connection: Mapping[str, Any] | None, last_seen_at: float | None
) -> None:
    """What the gateway's operation keeps to reach the gateway again, and when it last did."""
    await conn.execute(
        sa.update(gateways)
        .where(gateways.c.id == gateway_id)
        .values(connection=_dump(connection) if connection is not None else None, last_seen_at=last_seen_at)
    )


async def delete(conn: AsyncConnection, g: GatewayRec, actor_id: str | None = None) -> None:
    """Remove the gateway's row (its host released first, in the same transaction)."""
    await conn.execute(sa.delete(gateways).where(gateways.c.id == g.id))
    await emit(conn, "Gateway deleted", actor_id, [_target(g)])
