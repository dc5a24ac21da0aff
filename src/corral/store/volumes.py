"""The ``volumes`` table: network volumes, their provisioning, attachment and deletion.

Rows are claimed with leases (``store.leases``) by the volumes worker; an attachment is written by the
jobs worker once AttachVolume answered, and cleared once DetachVolume did. Imports the store's tables and
the domain's volume record only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.volumes import SUBMITTED, VolumeRec
from corral.store.errors import Conflict
from corral.store.tables import projects, users, volumes

_COLUMNS = (volumes, projects.c.name.label("project_name"), users.c.name.label("user_name"))


def _select() -> sa.Select[Any]:
    return (
        sa.select(*_COLUMNS)
        .join(projects, projects.c.id == volumes.c.project_id)
        .join(users, users.c.id == volumes.c.user_id)
    )


def _rec(r: Any) -> VolumeRec:
    return VolumeRec(
        id=r.id,
        project_id=r.project_id,
        project_name=r.project_name,
        user_name=r.user_name,
        name=r.name,
        status=r.status,
        status_message=r.status_message,
        configuration=json.loads(r.configuration),
        provisioning=json.loads(r.provisioning) if r.provisioning else None,
        instance_id=r.instance_id,
        attachment=json.loads(r.attachment) if r.attachment else None,
        to_be_deleted=bool(r.to_be_deleted),
        deleted=bool(r.deleted),
        created_at=r.created_at,
        deleted_at=r.deleted_at,
        last_processed_at=r.last_processed_at,
    )


async def create(
    conn: AsyncConnection, project_id: str, user_id: str, name: str, configuration: dict[str, Any], now: float
) -> str:
    """A new volume's id; :class:`~corral.store.errors.Conflict` if the project has a live one named ``name``."""
    vid = str(uuid.uuid4())
    try:
        await conn.execute(
            sa.insert(volumes).values(
                id=vid, project_id=project_id, user_id=user_id, name=name, status=SUBMITTED,
                configuration=json.dumps(configuration), to_be_deleted=False, deleted=False, created_at=now,
                last_processed_at=now,
            )
        )  # fmt: skip
    except sa.exc.IntegrityError as e:
        raise Conflict(str(e.orig)) from e
    return vid


async def get(conn: AsyncConnection, volume_id: str) -> VolumeRec | None:
    r = (await conn.execute(_select().where(volumes.c.id == volume_id))).first()
    return _rec(r) if r is not None else None


async def by_names(conn: AsyncConnection, project_id: str, names: Sequence[str]) -> list[VolumeRec]:
    """The live (not deleted) volumes of the project named ``names``."""
    q = _select().where(volumes.c.project_id == project_id, volumes.c.name.in_(list(names)), ~volumes.c.deleted)
    return [_rec(r) for r in await conn.execute(q.order_by(volumes.c.name))]


async def names_in_use(conn: AsyncConnection, project_id: str) -> set[str]:
    q = sa.select(volumes.c.name).where(volumes.c.project_id == project_id, ~volumes.c.deleted)
    return {r[0] for r in await conn.execute(q)}


async def list_volumes(
    conn: AsyncConnection,
    project_ids: Sequence[str] | None,
    include_deleted: bool = False,
    only_active: bool = False,
    ascending: bool = False,
    limit: int | None = None,
) -> list[VolumeRec]:
    """Volumes of ``project_ids`` (None: every project), newest first (``ascending``: oldest first)."""
    q = _select()
    if project_ids is not None:
        q = q.where(volumes.c.project_id.in_(list(project_ids)))
    if not include_deleted:
        q = q.where(~volumes.c.deleted)
    if only_active:
        q = q.where(volumes.c.status.in_(("submitted", "provisioning", "active")))
    order = (volumes.c.created_at, volumes.c.id)
    q = q.order_by(*(order if ascending else (c.desc() for c in order)))
    if limit:
        q = q.limit(limit)
    return [_rec(r) for r in await conn.execute(q)]


async def pending(conn: AsyncConnection) -> list[VolumeRec]:
    """Volumes the worker has something to do with: submitted ones, and those whose deletion was asked."""
    q = _select().where(~volumes.c.deleted, sa.or_(volumes.c.status == SUBMITTED, volumes.c.to_be_deleted))
    return [_rec(r) for r in await conn.execute(q)]


async def mark_to_be_deleted(conn: AsyncConnection, ids: Sequence[str]) -> None:
    if ids:
        await conn.execute(sa.update(volumes).where(volumes.c.id.in_(list(ids))).values(to_be_deleted=True))


def _guarded(vid: str, token: str) -> sa.Update:
    return sa.update(volumes).where(volumes.c.id == vid, volumes.c.lock_token == token)


async def set_status(
    conn: AsyncConnection,
    vid: str,
    token: str,
    status: str,
    now: float,
    message: str | None = None,
    provisioning: dict[str, Any] | None = None,
) -> bool:
    values: dict[str, Any] = {"status": status, "status_message": message, "last_processed_at": now}
    if provisioning is not None:
        values["provisioning"] = json.dumps(provisioning)
    res = await conn.execute(_guarded(vid, token).values(**values, lock_token=None, lock_expires_at=None))
    return bool(res.rowcount)


async def mark_deleted(conn: AsyncConnection, vid: str, token: str, now: float) -> bool:
    res = await conn.execute(
        _guarded(vid, token).values(
            deleted=True, deleted_at=now, last_processed_at=now, lock_token=None, lock_expires_at=None
        )
    )
    return bool(res.rowcount)


async def attach(conn: AsyncConnection, vid: str, instance_id: str, attachment: dict[str, Any]) -> None:
    await conn.execute(
        sa.update(volumes).where(volumes.c.id == vid).values(instance_id=instance_id, attachment=json.dumps(attachment))
    )


async def detach(conn: AsyncConnection, vid: str) -> None:
    await conn.execute(sa.update(volumes).where(volumes.c.id == vid).values(instance_id=None, attachment=None))


async def attached(conn: AsyncConnection, instance_id: str | None = None) -> list[VolumeRec]:
    """Volumes attached to an instance (to ``instance_id``, if given)."""
    q = _select().where(volumes.c.instance_id.is_not(None))
    if instance_id is not None:
        q = q.where(volumes.c.instance_id == instance_id)
    return [_rec(r) for r in await conn.execute(q)]
