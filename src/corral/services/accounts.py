"""Users, projects, members, tokens and roles; the first-start bootstrap (``admin`` and ``main``)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from corral.domain.records import MemberRec, ProjectRec, UserRec
from corral.services.errors import Forbidden, ProjectNotFound, ResourceExists, ResourceNotExists, ServiceError
from corral.store import accounts as store
from corral.store.db import Database

GLOBAL_ROLES = ("admin", "user")
BOOTSTRAP_LOCK = 0x626F6F74  # "boot": replicas starting together create admin and main once
PROJECT_ROLES = ("admin", "manager", "user")


def generate_ssh_keypair() -> tuple[str | None, str | None]:
    """An ed25519 key pair via ``ssh-keygen`` (private, public); (None, None) where it is missing."""
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "key")
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "corral", "-f", path],
                check=True,
                capture_output=True,
                timeout=10,
            )
            with open(path) as f1, open(path + ".pub") as f2:
                return f1.read(), f2.read().strip()
    except (OSError, subprocess.SubprocessError):
        return None, None


@dataclass(frozen=True)
class Bootstrap:
    admin: UserRec
    created: bool


async def bootstrap(db: Database, admin_token: str | None, backends: list[dict[str, Any]] | None = None) -> Bootstrap:
    """Create ``admin`` and project ``main`` (local backend) on first start."""
    async with db.write() as conn:
        await db.serialize(conn, BOOTSTRAP_LOCK)
        existing = await store.get_user(conn, "admin")
        if existing is not None:
            return Bootstrap(existing, False)
        now = time.time()
        priv, pub = generate_ssh_keypair()
        admin_id = str(uuid.uuid4())
        await store.insert_user(
            conn,
            {
                "id": admin_id,
                "name": "admin",
                "token": admin_token or str(uuid.uuid4()),
                "global_role": "admin",
                "email": None,
                "active": True,
                "created_at": now,
                "ssh_private_key": priv,
                "ssh_public_key": pub,
            },
        )
        project_id = str(uuid.uuid4())
        await store.insert_project(
            conn,
            {
                "id": project_id,
                "name": "main",
                "owner_id": admin_id,
                "created_at": now,
                "is_public": False,
                "backends": json.dumps(backends if backends is not None else [{"type": "local"}]),
            },
        )
        await store.upsert_member(conn, project_id, admin_id, "admin")
        admin = await store.get_user(conn, "admin")
    assert admin is not None
    return Bootstrap(admin, True)


async def authenticate(db: Database, token: str) -> UserRec:
    async with db.read() as conn:
        user = await store.get_user_by_token(conn, token)
    if user is None or not user.active:
        raise Forbidden("Invalid token")
    return user


async def project_access(db: Database, user: UserRec, project_name: str, need: str = "user") -> ProjectRec:
    """The project if ``user`` holds at least role ``need`` in it (global admins hold every role)."""
    async with db.read() as conn:
        project = await store.get_project(conn, project_name)
        if project is None:
            raise ProjectNotFound
        role = await store.get_member_role(conn, project.id, user.id)
    if user.global_role == "admin":
        return project
    if role is None:
        if need == "user" and project.is_public:
            return project
        raise Forbidden()
    if PROJECT_ROLES.index(role) > PROJECT_ROLES.index(need):
        raise Forbidden()
    return project


def require_admin(user: UserRec) -> None:
    if user.global_role != "admin":
        raise Forbidden()


async def list_users(db: Database, user: UserRec) -> list[UserRec]:
    if user.global_role != "admin":
        return [user]
    async with db.read() as conn:
        return await store.list_users(conn)


async def get_user(db: Database, user: UserRec, username: str) -> UserRec:
    if user.global_role != "admin" and username != user.name:
        raise Forbidden()
    async with db.read() as conn:
        found = await store.get_user(conn, username)
    if found is None:
        raise ResourceNotExists("User not found")
    return found


async def create_user(db: Database, username: str, global_role: str, email: str | None, active: bool) -> UserRec:
    if not username or not username.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ServiceError("Username should contain only latin letters, digits, hyphens, underscores and dots")
    priv, pub = generate_ssh_keypair()
    async with db.write() as conn:
        if await store.get_user(conn, username) is not None:
            raise ResourceExists("User already exists")
        await store.insert_user(
            conn,
            {
                "id": str(uuid.uuid4()),
                "name": username,
                "token": str(uuid.uuid4()),
                "global_role": global_role,
                "email": email,
                "active": active,
                "created_at": time.time(),
                "ssh_private_key": priv,
                "ssh_public_key": pub,
            },
        )
        created = await store.get_user(conn, username)
    assert created is not None
    return created


async def update_user(db: Database, username: str, global_role: str, email: str | None, active: bool) -> UserRec:
    async with db.write() as conn:
        found = await store.get_user(conn, username)
        if found is None:
            raise ResourceNotExists("User not found")
        await store.update_user(conn, found.id, {"global_role": global_role, "email": email, "active": active})
        updated = await store.get_user(conn, username)
    assert updated is not None
    return updated


async def refresh_token(db: Database, user: UserRec, username: str) -> UserRec:
    if user.global_role != "admin" and username != user.name:
        raise Forbidden()
    async with db.write() as conn:
        found = await store.get_user(conn, username)
        if found is None:
            raise ResourceNotExists("User not found")
        await store.update_user(conn, found.id, {"token": str(uuid.uuid4())})
        updated = await store.get_user(conn, username)
    assert updated is not None
    return updated


async def delete_users(db: Database, names: list[str]) -> None:
    if "admin" in names:
        raise ServiceError("The admin user cannot be deleted")
    async with db.write() as conn:
        await store.delete_users(conn, names)


async def list_projects(db: Database, user: UserRec) -> list[ProjectRec]:
    async with db.read() as conn:
        return await store.list_projects(conn, None if user.global_role == "admin" else user.id)


async def project_members(db: Database, project: ProjectRec) -> list[MemberRec]:
    async with db.read() as conn:
        return await store.list_members(conn, project.id)


async def create_project(db: Database, user: UserRec, name: str, is_public: bool) -> ProjectRec:
    if not name or not all(c.isalnum() or c in "-_" for c in name) or len(name) > 50:
        raise ServiceError("Project name should match regex '^[a-zA-Z0-9-_]{1,50}$'")
    async with db.write() as conn:
        if await store.get_project(conn, name) is not None:
            raise ResourceExists("Project already exists")
        priv, pub = generate_ssh_keypair()
        project_id = str(uuid.uuid4())
        await store.insert_project(
            conn,
            {
                "id": project_id,
                "name": name,
                "owner_id": user.id,
                "created_at": time.time(),
                "is_public": is_public,
                "backends": json.dumps([{"type": "local"}]),
                "ssh_private_key": priv,
                "ssh_public_key": pub,
            },
        )
        await store.upsert_member(conn, project_id, user.id, "admin")
        project = await store.get_project(conn, name)
    assert project is not None
    return project


async def delete_projects(db: Database, user: UserRec, names: list[str]) -> None:
    async with db.write() as conn:
        for name in names:
            project = await store.get_project(conn, name)
            if project is None:
                raise ResourceNotExists(f"Project {name} not found")
            role = await store.get_member_role(conn, project.id, user.id)
            if user.global_role != "admin" and role != "admin":
                raise Forbidden()
            await store.delete_project(conn, project.id, project.name)


async def _resolve_members(conn: Any, members: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for m in members:
        found = await store.get_user(conn, m["username"])
        if found is None:
            raise ResourceNotExists(f"User {m['username']} not found")
        if m["project_role"] not in PROJECT_ROLES:
            raise ServiceError(f"Unknown project role {m['project_role']!r}")
        out.append((found.id, m["project_role"]))
    return out


async def set_members(db: Database, project: ProjectRec, members: list[dict[str, Any]]) -> None:
    async with db.write() as conn:
        await store.set_members(conn, project.id, await _resolve_members(conn, members))


async def add_members(db: Database, project: ProjectRec, members: list[dict[str, Any]]) -> None:
    async with db.write() as conn:
        for user_id, role in await _resolve_members(conn, members):
            await store.upsert_member(conn, project.id, user_id, role)


async def remove_members(db: Database, project: ProjectRec, usernames: list[str]) -> None:
    async with db.write() as conn:
        ids = []
        for name in usernames:
            found = await store.get_user(conn, name)
            if found is None:
                raise ResourceNotExists(f"User {name} not found")
            ids.append(found.id)
        await store.remove_members(conn, project.id, ids)


def new_token() -> str:
    return secrets.token_urlsafe(24)


async def apply_server_config(db: Database, admin: UserRec, projects: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Create the projects that the server's ``config.yml`` lists (owned by ``admin``) and set their backends."""
    async with db.write() as conn:
        await db.serialize(conn, BOOTSTRAP_LOCK)
        for name, backends in projects:
            existing = await store.get_project(conn, name)
            if existing is None:
                priv, pub = generate_ssh_keypair()
                project_id = str(uuid.uuid4())
                await store.insert_project(
                    conn,
                    {
                        "id": project_id,
                        "name": name,
                        "owner_id": admin.id,
                        "created_at": time.time(),
                        "is_public": False,
                        "backends": json.dumps(backends),
                        "ssh_private_key": priv,
                        "ssh_public_key": pub,
                    },
                )
                await store.upsert_member(conn, project_id, admin.id, "admin")
            else:
                await store.set_project_backends(conn, existing.id, json.dumps(backends))
