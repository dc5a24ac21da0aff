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

from corral.domain import access
from corral.domain import names as name_rules
from corral.domain.events import project_target, user_target
from corral.domain.records import MemberRec, ProjectRec, UserRec
from corral.services.credentials import sealed_key, token_values
from corral.services.errors import (
    AccessDenied,
    Forbidden,
    ProjectNotFound,
    ResourceExists,
    ResourceNotExists,
    ServiceError,
)
from corral.services.ssh_access import GRACE_S
from corral.store import accounts as store
from corral.store import events, project_state, run_ssh_keys
from corral.store.db import Database
from corral.store.encryption import Cipher

GLOBAL_ROLES = ("admin", "user")
BOOTSTRAP_LOCK = 0x626F6F74  # "boot": replicas starting together create admin and main once
PROJECT_ROLES = access.PROJECT_ROLES
#: How many projects a user who is not a global admin may own (dstack's ``USER_PROJECT_DEFAULT_QUOTA``).
USER_PROJECTS_QUOTA = 10


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


async def bootstrap(
    db: Database, admin_token: str | None, backends: list[dict[str, Any]] | None = None, *, cipher: Cipher
) -> Bootstrap:
    """Create ``admin`` and project ``main`` (local backend) on first start (the token and key sealed)."""
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
                **token_values(cipher, admin_token or str(uuid.uuid4())),
                "global_role": "admin",
                "email": None,
                "active": True,
                "created_at": now,
                "ssh_private_key": sealed_key(cipher, priv),
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
        await events.emit(conn, "User created", admin_id, [user_target(admin_id, "admin")])
        await events.emit(conn, "Project created", admin_id, [project_target(project_id, "main")])
        admin = await store.get_user(conn, "admin")
    assert admin is not None
    return Bootstrap(admin, True)


async def authenticate(db: Database, token: str) -> UserRec:
    async with db.read() as conn:
        user = await store.get_user_by_token(conn, token)
    if user is None or not user.active:
        raise Forbidden("Invalid token")
    return user


async def project_access(db: Database, user: UserRec, project_name: str, need: str = "member") -> ProjectRec:
    """The project if ``user`` passes the route rule ``need`` for it (:mod:`corral.domain.access`: dstack's
    permission dependencies); 404 for a project that does not exist, 403 otherwise."""
    async with db.read() as conn:
        project = await store.get_project(conn, project_name)
        if project is None:
            raise ProjectNotFound
        role = await store.get_member_role(conn, project.id, user.id)
    if not access.may_reach(_rule(need), user.global_role, role, project.is_public):
        raise Forbidden()
    return project


async def find_project(db: Database, project_name: str) -> ProjectRec:
    """The project by name, whoever asks (404 when there is none): for routes whose check is on the object."""
    async with db.read() as conn:
        project = await store.get_project(conn, project_name)
    if project is None:
        raise ProjectNotFound
    return project


def _rule(need: str) -> access.Rule:
    if need in access.RULES:
        return need  # type: ignore[return-value]
    raise ValueError(f"unknown access rule {need!r}")


def require_admin(user: UserRec) -> None:
    if user.global_role != "admin":
        raise Forbidden()


async def list_users(db: Database, user: UserRec) -> list[UserRec]:
    if user.global_role != "admin":
        return [user]
    async with db.read() as conn:
        return await store.list_users(conn)


async def user_names(db: Database, user: UserRec) -> list[str]:
    """The names of the users ``user`` may see (``list_users``' rule), without their records."""
    if user.global_role != "admin":
        return [user.name]
    async with db.read() as conn:
        return await store.user_names(conn)


async def get_user(db: Database, user: UserRec, username: str) -> UserRec:
    """A user with credentials: oneself, or anyone for a global admin; someone else's name is answered as
    dstack does, as if the user did not exist."""
    async with db.read() as conn:
        found = await store.get_user(conn, username)
    if found is None or (user.global_role != "admin" and found.id != user.id):
        raise ResourceNotExists("Resource not found")
    return found


async def find_user(db: Database, username: str) -> UserRec:
    """Any user by name (``runs/list``'s ``username`` filter: dstack looks it up for every caller)."""
    async with db.read() as conn:
        found = await store.get_user(conn, username)
    if found is None:
        raise ResourceNotExists("User not found")
    return found


async def create_user(
    db: Database,
    username: str,
    global_role: str,
    email: str | None,
    active: bool,
    *,
    cipher: Cipher,
    actor: UserRec | None = None,
) -> UserRec:
    bad = name_rules.username_error(username)
    if bad is not None:
        raise ServiceError(bad)
    priv, pub = generate_ssh_keypair()
    sealed = {**token_values(cipher, str(uuid.uuid4())), "ssh_private_key": sealed_key(cipher, priv)}
    async with db.write() as conn:
        if await store.get_user(conn, username) is not None:
            raise ResourceExists("User already exists")
        user_id = str(uuid.uuid4())
        await store.insert_user(
            conn,
            {
                "id": user_id,
                "name": username,
                **sealed,
                "global_role": global_role,
                "email": email,
                "active": active,
                "created_at": time.time(),
                "ssh_public_key": pub,
            },
        )
        await events.emit(conn, "User created", actor.id if actor else user_id, [user_target(user_id, username)])
        created = await store.get_user(conn, username)
    assert created is not None
    return created


async def update_user(
    db: Database, username: str, global_role: str, email: str | None, active: bool, actor: UserRec | None = None
) -> UserRec:
    async with db.write() as conn:
        found = await store.get_user(conn, username)
        if found is None:
            raise ResourceNotExists("User not found")
        await store.update_user(conn, found.id, {"global_role": global_role, "email": email, "active": active})
        # dstack's wording: the fields whose value changed
        changed = [
            f"{k}={v}"
            for k, v, old in (
                ("global_role", global_role, found.global_role),
                ("email", email, found.email),
                ("active", active, found.active),
            )
            if v != old
        ]
        await events.emit(
            conn,
            f"User updated. Updated fields: {', '.join(changed) or '<none>'}",
            actor.id if actor else None,
            [user_target(found.id, found.name)],
        )
        updated = await store.get_user(conn, username)
    assert updated is not None
    return updated


async def refresh_token(db: Database, user: UserRec, username: str, *, cipher: Cipher) -> UserRec:
    if user.global_role != "admin" and username != user.name:
        raise Forbidden()
    new_token = token_values(cipher, str(uuid.uuid4()))  # sealed before the transaction: no work under its lock
    async with db.write() as conn:
        found = await store.get_user(conn, username)
        if found is None:
            raise ResourceNotExists("User not found")
        await store.update_user(conn, found.id, new_token)
        await events.emit(conn, "User token refreshed", user.id, [user_target(found.id, found.name)])
        updated = await store.get_user(conn, username)
    assert updated is not None
    return updated


async def delete_users(db: Database, names: list[str], actor: UserRec | None = None) -> None:
    if "admin" in names:
        raise ServiceError("The admin user cannot be deleted")
    async with db.write() as conn:
        for name in names:
            found = await store.get_user(conn, name)
            if found is not None:
                await events.emit(conn, "User deleted", actor.id if actor else None, [user_target(found.id, name)])
        await store.delete_users(conn, names)


async def list_projects(db: Database, user: UserRec, include_not_joined: bool = True) -> list[ProjectRec]:
    """The projects ``user`` sees: every project for a global admin, else member projects, plus public ones
    when ``include_not_joined`` (dstack's ``list_user_accessible_projects``)."""
    async with db.read() as conn:
        if user.global_role == "admin":
            return await store.list_projects(conn, None)
        found = await store.list_projects(conn, user.id)
        if include_not_joined:
            return found
        ids = set(await project_state.member_project_ids(conn, user.id))
    return [p for p in found if p.id in ids]


async def member_project_ids(db: Database, user: UserRec, names: list[str] | None = None) -> list[str] | None:
    """Ids of the projects global lists (runs, fleets, instances, volumes) cover for ``user``: every project
    for a global admin (None when no ``names`` narrow it), else only member projects, public or not
    (dstack's ``list_user_project_models``)."""
    async with db.read() as conn:
        if user.global_role == "admin":
            return None if names is None else await project_state.all_project_ids(conn, names)
        return await project_state.member_project_ids(conn, user.id, names)


async def project_members(db: Database, project: ProjectRec) -> list[MemberRec]:
    async with db.read() as conn:
        return await store.list_members(conn, project.id)


async def create_project(db: Database, user: UserRec, name: str, is_public: bool, *, cipher: Cipher) -> ProjectRec:
    """A project made through the API: its creator is its admin, and it has no backend (as in dstack: only
    the server's ``config.yml`` gives a project one; an SSH fleet brings its own hosts)."""
    bad = name_rules.project_name_error(name)
    if bad is not None:
        raise ServiceError(bad)
    priv, pub = generate_ssh_keypair()  # before the write lock
    async with db.write() as conn:
        if await store.get_project(conn, name) is not None:
            raise ResourceExists("Project already exists")
        if (
            user.global_role != "admin"
            and await project_state.owned_project_count(conn, user.id) >= USER_PROJECTS_QUOTA
        ):
            raise ServiceError("User project quota exceeded")
        project_id = str(uuid.uuid4())
        await store.insert_project(
            conn,
            {
                "id": project_id,
                "name": name,
                "owner_id": user.id,
                "created_at": time.time(),
                "is_public": is_public,
                "backends": "[]",
                "ssh_private_key": sealed_key(cipher, priv),
                "ssh_public_key": pub,
            },
        )
        await store.upsert_member(conn, project_id, user.id, "admin")
        await events.emit(conn, "Project created", user.id, [project_target(project_id, name)])
        project = await store.get_project(conn, name)
    assert project is not None
    return project


async def update_project(
    db: Database, project: ProjectRec, is_public: bool | None, actor: UserRec | None = None
) -> ProjectRec:
    """``projects/{p}/update`` (the route admits project admins): visibility; corral has no templates repo."""
    async with db.write() as conn:
        changed = []
        if is_public is not None and is_public != project.is_public:
            await project_state.set_public(conn, project.id, is_public)
            changed.append(f"is_public={is_public}")
        await events.emit(
            conn,
            f"Project updated. Updated fields: {', '.join(changed) or '<none>'}",
            actor.id if actor else None,
            [project_target(project.id, project.name)],
        )
        updated = await store.get_project(conn, project.name)
    assert updated is not None
    return updated


async def projects_without_fleets(db: Database, user: UserRec) -> list[ProjectRec]:
    """``projects/list_only_no_fleets``: member projects (admins too need membership) with no active fleet."""
    async with db.read() as conn:
        ids = await project_state.member_projects_without_fleets(conn, user.id)
        by_id = {p.id: p for p in await store.list_projects(conn, user.id)}
    return [by_id[i] for i in ids if i in by_id]


async def delete_projects(db: Database, user: UserRec, names: list[str]) -> None:
    """dstack's ``delete_projects``: a non-admin deletes only member projects they administer (or own); every
    name must exist; a project with unfinished runs or live fleets is not deleted."""
    async with db.write() as conn:
        found = []
        for name in names:
            project = await store.get_project(conn, name)
            if user.global_role != "admin":
                role = None if project is None else await store.get_member_role(conn, project.id, user.id)
                if project is None or role is None:
                    raise AccessDenied()
                if role != "admin" and project.owner.id != user.id:
                    raise AccessDenied()
            if project is not None:
                found.append(project)
        if len(found) != len(names):
            raise ServiceError("Failed to delete non-existent projects")
        for project in found:
            run_names, fleet_names = await project_state.active_resources(conn, project.id)
            if run_names:
                raise ServiceError(f"Failed to delete project with active runs: {run_names}")
            if fleet_names:
                raise ServiceError(f"Failed to delete project with active fleets: {fleet_names}")
        for project in found:
            await store.delete_project(conn, project.id, project.name)
            await events.emit(conn, "Project deleted", user.id, [project_target(project.id, project.name)])


async def refresh_ssh_key(db: Database, user: UserRec, username: str | None, *, cipher: Cipher) -> UserRec:
    """A new SSH key pair for a user (oneself, or anyone for a global admin); the old one is gone at once:
    nothing corral hands out or authorizes afterwards carries it."""
    username = username or user.name
    if user.global_role != "admin" and username != user.name:
        raise Forbidden()
    priv, pub = generate_ssh_keypair()
    sealed = sealed_key(cipher, priv)  # the private key is stored sealed
    async with db.write() as conn:
        found = await store.get_user(conn, username)
        if found is None:
            raise ResourceNotExists("Resource not found")
        await store.update_user(conn, found.id, {"ssh_private_key": sealed, "ssh_public_key": pub})
        # the runs submitted with the old key carry the new one: the SSH endpoint lets the old one in nowhere
        since = time.time() - GRACE_S
        await run_ssh_keys.replace_run_keys(conn, found.id, found.ssh_public_key or "", pub, since)
        await events.emit(conn, "User SSH key refreshed", user.id, [user_target(found.id, found.name)])
        updated = await store.get_user(conn, username)
    assert updated is not None
    return updated


def new_token() -> str:
    return secrets.token_urlsafe(24)


async def apply_server_config(
    db: Database, admin: UserRec, projects: list[tuple[str, list[dict[str, Any]]]], *, cipher: Cipher
) -> None:
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
                        "ssh_private_key": sealed_key(cipher, priv),
                        "ssh_public_key": pub,
                    },
                )
                await store.upsert_member(conn, project_id, admin.id, "admin")
            else:
                await store.set_project_backends(conn, existing.id, json.dumps(backends))
