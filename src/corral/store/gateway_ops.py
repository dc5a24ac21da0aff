"""What the gateways' operation reads and writes beyond ``store.gateways``: the gateways to look after each
pass (running ones too, which ``to_operate`` leaves out), every gateway's secret hash at once (what the
in-server proxy trusts, read once per cache period rather than per request), the gateway's lease, and the
status message of a running gateway (liveness, certificate errors) without a status change; the ACME account
key (sealed) and when the ACME server was last found to have lost the account (its reset), each host's
certificate validity, issuance time and last failure, and the gateways that hold certificates; the requests
recorded from a gateway's stats (``service_request_stats`` rows under the gateway's own name, which the
autoscaler sums with the in-server proxy's).

Imports the store's tables, leases and ``domain``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import Target
from corral.domain.gateway_ops import CertificateState
from corral.domain.gateways import (
    GatewayRec,
    GatewayService,
    https_refusal,
    publication,
    rate_limits,
    service_host,
    service_https,
    service_model,
)
from corral.domain.statuses import FINISHED_RUN
from corral.store import gateways as store
from corral.store import leases
from corral.store.events import emit
from corral.store.tables import acme_accounts, gateway_certificates, gateways, instances, runs, service_request_stats

#: How long a pass may hold a gateway (longer than a deploy: connect, upload, start, configure).
LEASE_S = 120.0


async def live(conn: AsyncConnection) -> list[GatewayRec]:
    """Every gateway that is not failed, or that is marked for deletion (oldest first)."""
    q = sa.select(gateways.c.id).where(sa.or_(gateways.c.to_be_deleted == sa.true(), gateways.c.status != "failed"))
    ids = [r[0] for r in await conn.execute(q.order_by(gateways.c.created_at, gateways.c.id))]
    found = await store.by_ids(conn, ids)
    return [found[i] for i in ids if i in found]


async def statuses(conn: AsyncConnection, ids: Sequence[str]) -> dict[str, str]:
    """The statuses of the gateways of ``ids`` that exist (the orphan reaper reads a gateway VM's row here)."""
    if not ids:
        return {}
    q = sa.select(gateways.c.id, gateways.c.status).where(gateways.c.id.in_(list(ids)))
    return {str(r.id): str(r.status) for r in await conn.execute(q)}


async def secret_hashes(conn: AsyncConnection) -> frozenset[str]:
    """The secret hashes of every gateway (sha256, hex)."""
    q = sa.select(gateways.c.secret_hash).where(gateways.c.secret_hash.is_not(None))
    return frozenset(str(r[0]) for r in await conn.execute(q))


async def claim(conn: AsyncConnection, gateway_id: str, owner: str, now: float) -> str | None:
    """A lease on the gateway for one pass (None: another server replica holds it)."""
    return await leases.claim(conn, gateways, gateway_id, owner, now, LEASE_S)


async def release(conn: AsyncConnection, gateway_id: str, token: str) -> bool:
    return await leases.release(conn, gateways, gateway_id, token)


async def set_message(conn: AsyncConnection, gateway_id: str, token: str, message: str | None) -> bool:
    """The status message of a gateway whose status stays (written while ``token`` holds its lease)."""
    res = await conn.execute(
        sa.update(gateways).where(leases.guard(gateways, gateway_id, token)).values(status_message=message)
    )
    return bool(res.rowcount)


async def instance_connection(conn: AsyncConnection, instance_id: str) -> dict[str, Any] | None:
    """How the server reaches the host of instance ``instance_id`` (its stored SSH connection, keys sealed)."""
    r = (await conn.execute(sa.select(instances.c.agent).where(instances.c.id == instance_id))).first()
    if r is None or not r[0]:
        return None
    connection = orjson.loads(r[0]).get("connection")
    return dict(connection) if isinstance(connection, dict) else None


async def instance_backend(conn: AsyncConnection, instance_id: str) -> str | None:
    """The backend of instance ``instance_id`` (``ssh``, ``local``, ...; None when it is gone)."""
    r = (await conn.execute(sa.select(instances.c.backend).where(instances.c.id == instance_id))).first()
    return str(r[0]) if r is not None and r[0] else None


async def acme_account(conn: AsyncConnection, directory_url: str) -> str | None:
    """The sealed ACME account key for ``directory_url``, if the server has one."""
    q = sa.select(acme_accounts.c.key_sealed).where(acme_accounts.c.directory_url == directory_url)
    r = (await conn.execute(q)).first()
    return str(r[0]) if r is not None else None


async def save_acme_account(conn: AsyncConnection, directory_url: str, key_sealed: str, now: float) -> None:
    """Keep the account key (the first one kept wins: another replica may have registered meanwhile)."""
    if await acme_account(conn, directory_url) is None:
        await conn.execute(
            sa.insert(acme_accounts).values(directory_url=directory_url, key_sealed=key_sealed, created_at=now)
        )


async def acme_reset_at(conn: AsyncConnection, directory_url: str) -> float | None:
    """When the ACME server at ``directory_url`` was last found to have lost this server's account (None: never)."""
    q = sa.select(acme_accounts.c.reset_at).where(acme_accounts.c.directory_url == directory_url)
    r = (await conn.execute(q)).first()
    return float(r[0]) if r is not None and r[0] is not None else None


async def record_acme_reset(conn: AsyncConnection, directory_url: str, at: float) -> None:
    """The ACME server at ``directory_url`` no longer knew the account at ``at`` (kept if a replica recorded a
    later one)."""
    row = acme_accounts.c.directory_url == directory_url
    later = sa.or_(acme_accounts.c.reset_at.is_(None), acme_accounts.c.reset_at < at)
    await conn.execute(sa.update(acme_accounts).where(row, later).values(reset_at=at))


async def certified_gateways(conn: AsyncConnection) -> list[GatewayRec]:
    """The gateways that hold a certificate the server got (oldest first)."""
    held = sa.select(gateway_certificates.c.gateway_id).where(gateway_certificates.c.not_after.is_not(None))
    q = sa.select(gateways.c.id).where(gateways.c.id.in_(held)).order_by(gateways.c.created_at, gateways.c.id)
    ids = [r[0] for r in await conn.execute(q)]
    found = await store.by_ids(conn, ids)
    return [found[i] for i in ids if i in found]


async def certificates(conn: AsyncConnection, gateway_id: str) -> dict[str, CertificateState]:
    q = sa.select(gateway_certificates).where(gateway_certificates.c.gateway_id == gateway_id)
    return {
        r.host: CertificateState(r.host, r.not_before, r.not_after, r.failed_at, r.error, r.issued_at)
        for r in await conn.execute(q)
    }


async def _upsert_certificate(conn: AsyncConnection, gateway_id: str, host: str, values: dict[str, Any]) -> None:
    where = sa.and_(gateway_certificates.c.gateway_id == gateway_id, gateway_certificates.c.host == host)
    res = await conn.execute(sa.update(gateway_certificates).where(where).values(**values))
    if not res.rowcount:
        await conn.execute(sa.insert(gateway_certificates).values(gateway_id=gateway_id, host=host, **values))


async def certificate_issued(
    conn: AsyncConnection, gateway_id: str, host: str, not_before: float, not_after: float, issued_at: float
) -> None:
    """The certificate of ``host`` got (``issued_at``: when its issuance began)."""
    values = {"not_before": not_before, "not_after": not_after, "failed_at": None, "error": None}
    values["issued_at"] = issued_at
    await _upsert_certificate(conn, gateway_id, host, values)


async def certificate_failed(conn: AsyncConnection, gateway_id: str, host: str, now: float, error: str) -> None:
    await _upsert_certificate(conn, gateway_id, host, {"failed_at": now, "error": error})


async def forget(conn: AsyncConnection, gateway_id: str) -> None:
    """What the operation kept of a gateway being deleted."""
    await conn.execute(sa.delete(gateway_certificates).where(gateway_certificates.c.gateway_id == gateway_id))


async def recorded_requests(conn: AsyncConnection, server: str, run_ids: Sequence[str], since: int) -> dict[str, int]:
    """The requests recorded for each service from second ``since`` on under ``server`` (a gateway's name in
    the request counts: ``gateway:<id>``)."""
    if not run_ids:
        return {}
    q = (
        sa.select(service_request_stats.c.run_id, sa.func.sum(service_request_stats.c.requests))
        .where(
            service_request_stats.c.run_id.in_(list(run_ids)),
            service_request_stats.c.server == server,
            service_request_stats.c.second >= since,
        )
        .group_by(service_request_stats.c.run_id)
    )
    return {row[0]: int(row[1] or 0) for row in await conn.execute(q)}


async def event(conn: AsyncConnection, text: str, targets: Sequence[Target]) -> None:
    """An event of the gateways' operation (by the system)."""
    await emit(conn, text, None, targets)


async def services_to_register(conn: AsyncConnection, g: GatewayRec) -> list[GatewayService]:
    """The services that should be registered on ``g``: its project's services published on it that are not
    finished (at zero replicas too: the gateway takes their requests and counts them, and the in-server proxy
    holds them until a replica is ready)."""
    q = sa.select(runs.c.id, runs.c.run_name, runs.c.run_spec).where(
        runs.c.gateway_id == g.id,
        runs.c.deleted == sa.false(),
        runs.c.service_templates.is_not(None),
        runs.c.status.not_in(list(FINISHED_RUN)),
    )
    out = []
    for r in await conn.execute(q.order_by(runs.c.run_name)):
        conf = (orjson.loads(r.run_spec) or {}).get("configuration") or {}
        if https_refusal(conf.get("https"), g.has_certificate) is not None:
            continue
        https = service_https(conf.get("https"), g.has_certificate)
        raw_model = conf.get("model")
        model = service_model({"name": raw_model} if isinstance(raw_model, str) else raw_model)
        out.append(
            GatewayService(
                project_name=g.project_name,
                run_name=r.run_name,
                run_id=r.id,
                host=service_host(r.run_name, publication(g), g.project_name),
                https=https,
                auth=conf.get("auth", True) is not False,
                rate_limits=rate_limits(conf.get("rate_limits") or []),
                model=model,
                upstream_path=f"/proxy/services/{g.project_name}/{r.run_name}/",
            )
        )
    return out
