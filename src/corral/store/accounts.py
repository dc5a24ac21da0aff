"""Users, projects and project members."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.records import MemberRec, ProjectRec, UserRec
from corral.store.tables import members, projects, secrets, users


def token_hash(token: str) -> str:
    """The lookup key of a token (the ``token`` column holds its sealed copy, ``services/credentials.py``)."""
    return hashlib.sha256(token.encode()).hexdigest()


def _user(row: Any) -> UserRec:
    return UserRec(
        id=row.id,
        name=row.name,
        token=row.token,
        global_role=row.global_role,
        email=row.email,
        active=row.active,
        created_at=row.created_at,
        ssh_private_key=row.ssh_private_key,
        ssh_public_key=row.ssh_public_key,
    )


async def get_user_by_token(conn: AsyncConnection, token: str) -> UserRec | None:
    wanted = token_hash(token)
    row = (
        await conn.execute(sa.select(users).where(users.c.token_hash == wanted, users.c.deleted == sa.false()))
    ).first()
    return _user(row) if row is not None and hmac.compare_digest(row.token_hash, wanted) else None


async def get_user(conn: AsyncConnection, name: str) -> UserRec | None:
    row = (await conn.execute(sa.select(users).where(users.c.name == name, users.c.deleted == sa.false()))).first()
    return _user(row) if row is not None else None


async def get_user_by_id(conn: AsyncConnection, user_id: str) -> UserRec | None:
    row = (await conn.execute(sa.select(users).where(users.c.id == user_id))).first()
    return _user(row) if row is not None else None


async def list_users(conn: AsyncConnection) -> list[UserRec]:
    rows = await conn.execute(sa.select(users).where(users.c.deleted == sa.false()).order_by(users.c.created_at.desc()))
    return [_user(r) for r in rows]


async def user_names(conn: AsyncConnection) -> list[str]:
    """The names of the users not deleted, in ``list_users``' order (a filter's choices: no record built)."""
    q = sa.select(users.c.name).where(users.c.deleted == sa.false()).order_by(users.c.created_at.desc())
    return list((await conn.execute(q)).scalars())


async def insert_user(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """``values`` carry the token as stored: ``token`` (sealed) and ``token_hash``."""
    await conn.execute(sa.insert(users).values(deleted=False, **values))


async def update_user(conn: AsyncConnection, user_id: str, values: dict[str, Any]) -> None:
    await conn.execute(sa.update(users).where(users.c.id == user_id).values(**values))


async def delete_users(conn: AsyncConnection, names: Sequence[str]) -> None:
    rows = (await conn.execute(sa.select(users.c.id, users.c.name).where(users.c.name.in_(names)))).all()
    for r in rows:
        await conn.execute(
            sa.update(users)
            .where(users.c.id == r.id)
            .values(deleted=True, active=False, name=f"_deleted_{r.id}_{r.name}", token_hash=f"deleted-{r.id}")
        )
        await conn.execute(sa.delete(members).where(members.c.user_id == r.id))


def _project(row: Any, owner: UserRec) -> ProjectRec:
    return ProjectRec(
        id=row.id,
        name=row.name,
        owner=owner,
        created_at=row.created_at,
        is_public=row.is_public,
        backends=tuple(json.loads(row.backends or "[]")),
        ssh_public_key=row.ssh_public_key,
        ssh_private_key=row.ssh_private_key,
    )


_owners = users.alias("owners")


def _project_select() -> sa.Select[Any]:
    return sa.select(projects, *[c.label(f"o_{c.name}") for c in _owners.c]).join(
        _owners, _owners.c.id == projects.c.owner_id
    )


def _owner_of(row: Any) -> UserRec:
    m = row._mapping
    return UserRec(
        id=m["o_id"],
        name=m["o_name"],
        token=m["o_token"],
        global_role=m["o_global_role"],
        email=m["o_email"],
        active=m["o_active"],
        created_at=m["o_created_at"],
        ssh_private_key=None,
        ssh_public_key=m["o_ssh_public_key"],
    )


async def get_project(conn: AsyncConnection, name: str) -> ProjectRec | None:
    row = (
        await conn.execute(_project_select().where(projects.c.name == name, projects.c.deleted == sa.false()))
    ).first()
    return _project(row, _owner_of(row)) if row is not None else None


async def list_projects(conn: AsyncConnection, member_user_id: str | None) -> list[ProjectRec]:
    q = _project_select().where(projects.c.deleted == sa.false())
    if member_user_id is not None:
        sub = sa.select(members.c.project_id).where(members.c.user_id == member_user_id)
        q = q.where(sa.or_(projects.c.id.in_(sub), projects.c.is_public.is_(True)))
    rows = await conn.execute(q.order_by(projects.c.created_at.desc()))
    return [_project(r, _owner_of(r)) for r in rows]


async def insert_project(conn: AsyncConnection, values: dict[str, Any]) -> None:
    await conn.execute(sa.insert(projects).values(deleted=False, **values))


async def delete_project(conn: AsyncConnection, project_id: str, name: str) -> None:
    await conn.execute(
        sa.update(projects)
        .where(projects.c.id == project_id)
        .values(deleted=True, name=f"_deleted_{project_id}_{name}")
    )
    # a deleted project's secrets go with it (dstack's rows cascade); nothing could read them again
    await conn.execute(sa.delete(secrets).where(secrets.c.project_id == project_id))


async def list_members(conn: AsyncConnection, project_id: str) -> list[MemberRec]:
    rows = await conn.execute(
        sa.select(users, members.c.project_role)
        .join(members, members.c.user_id == users.c.id)
        .where(members.c.project_id == project_id, users.c.deleted == sa.false())
        .order_by(members.c.member_num)
    )
    return [MemberRec(_user(r), r.project_role) for r in rows]


async def get_member_role(conn: AsyncConnection, project_id: str, user_id: str) -> str | None:
    row = (
        await conn.execute(
            sa.select(members.c.project_role).where(members.c.project_id == project_id, members.c.user_id == user_id)
        )
    ).first()
    return row.project_role if row is not None else None


async def set_members(conn: AsyncConnection, project_id: str, entries: Sequence[tuple[str, str]]) -> None:
    """Replace the members with ``(user_id, role)`` pairs."""
    await conn.execute(sa.delete(members).where(members.c.project_id == project_id))
    for num, (user_id, role) in enumerate(entries):
        await conn.execute(
            sa.insert(members).values(project_id=project_id, user_id=user_id, project_role=role, member_num=num)
        )


async def upsert_member(conn: AsyncConnection, project_id: str, user_id: str, role: str) -> None:
    existing = await get_member_role(conn, project_id, user_id)
    if existing is not None:
        await conn.execute(
            sa.update(members)
            .where(members.c.project_id == project_id, members.c.user_id == user_id)
            .values(project_role=role)
        )
        return
    num = (
        await conn.execute(sa.select(sa.func.count()).select_from(members).where(members.c.project_id == project_id))
    ).scalar_one()
    await conn.execute(
        sa.insert(members).values(project_id=project_id, user_id=user_id, project_role=role, member_num=num)
    )


async def remove_members(conn: AsyncConnection, project_id: str, user_ids: Sequence[str]) -> None:
    await conn.execute(sa.delete(members).where(members.c.project_id == project_id, members.c.user_id.in_(user_ids)))


async def set_project_ssh_key_if_none(
    conn: AsyncConnection, project_id: str, private_key: str, public_key: str
) -> None:
    """Give the project a key pair (the private key as the caller sealed it) unless it has one already."""
    await conn.execute(
        sa.update(projects)
        .where(projects.c.id == project_id, projects.c.ssh_public_key.is_(None))
        .values(ssh_private_key=private_key, ssh_public_key=public_key)
    )


async def set_project_backends(conn: AsyncConnection, project_id: str, backends_json: str) -> None:
    await conn.execute(sa.update(projects).where(projects.c.id == project_id).values(backends=backends_json))


async def get_user_by_email(conn: AsyncConnection, email: str) -> UserRec | None:
    """dstack matches member names against emails too (``set_members``, ``add_members``, ...)."""
    row = (await conn.execute(sa.select(users).where(users.c.email == email, users.c.deleted == sa.false()))).first()
    return _user(row) if row is not None else None
