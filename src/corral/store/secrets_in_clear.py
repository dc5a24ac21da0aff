"""Rows written by an older corral that still hold a secret in clear, and their rewrite once sealed: the
statements of the start-up passes that seal them (``workers/seal_at_rest.py``, ``workers/ssh_keys.py``,
``workers/seal_run_specs.py``).

Only the rows that may hold a value in clear are read (the database filters on what a value in clear looks
like), so a start with nothing to seal reads next to nothing. A row is rewritten only while it still holds
what was read (:class:`Rewrite`): a concurrent write wins and is sealed on its own. Deciding what a value in
clear is, and sealing it, is the callers' part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.statuses import UNFINISHED_INSTANCE
from corral.store.encryption import SEALED_PREFIX
from corral.store.tables import fleets, instances, jobs, projects, runs, users

#: What a private key in clear contains: PEM and OpenSSH keys, PuTTY's.
KEY_IN_CLEAR = ("PRIVATE KEY", "PuTTY-User-Key-File")
#: How an agent's token sealed in an instance's ``agent`` JSON reads (``store.fleets.dump``: no spaces).
_SEALED_AGENT_TOKEN = f'"token":"{SEALED_PREFIX}'
#: How a spec that holds registry credentials reads (``store.fleets.dump``: no spaces).
_HAS_REGISTRY_AUTH = '"registry_auth":{'
#: The statuses of an instance whose agent (and so its token) is not gone.
_LIVE = UNFINISHED_INSTANCE


@dataclass(frozen=True)
class StoredText:
    """One text column of one row, as read."""

    row_id: str
    text: str


@dataclass(frozen=True)
class Rewrite:
    """A row's text column set to ``new`` only while it still holds ``old``."""

    row_id: str
    old: str
    new: str


@dataclass(frozen=True)
class UserSecrets:
    """A user's API token and SSH private key, as read."""

    user_id: str
    token: str
    ssh_private_key: str | None


def _key_in_clear(column: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    return sa.or_(*(column.contains(m) for m in KEY_IN_CLEAR))


async def _texts(
    conn: AsyncConnection, id_column: sa.Column[Any], column: sa.Column[Any], *where: Any
) -> list[StoredText]:
    return [StoredText(row_id, text) for row_id, text in await conn.execute(sa.select(id_column, column).where(*where))]


def _compare_and_set(column: sa.Column[Any]) -> sa.Update:
    """``UPDATE <table> SET <column> = :_new WHERE id = :_id AND <column> = :_old``."""
    table = column.table
    assert isinstance(table, sa.Table)
    return (
        sa.update(table)
        .where(table.c.id == sa.bindparam("_id"), column == sa.bindparam("_old", type_=column.type))
        .values({column: sa.bindparam("_new", type_=column.type)})
    )


_SET_FLEET_SPEC = _compare_and_set(fleets.c.spec)
_SET_INSTANCE_AGENT = _compare_and_set(instances.c.agent)
_SET_PROJECT_KEY = _compare_and_set(projects.c.ssh_private_key)
_SET_RUN_SPEC = _compare_and_set(runs.c.run_spec)
_SET_JOB_SPEC = _compare_and_set(jobs.c.job_spec)


async def _rewrite(conn: AsyncConnection, statement: sa.Update, rewrites: Sequence[Rewrite]) -> int:
    rewritten = 0
    for r in rewrites:
        rewritten += (await conn.execute(statement, {"_id": r.row_id, "_old": r.old, "_new": r.new})).rowcount
    return rewritten


async def users_with_secrets_in_clear(conn: AsyncConnection) -> list[UserSecrets]:
    """Users whose API token is not sealed, or whose SSH private key is in clear."""
    rows = await conn.execute(
        sa.select(users.c.id, users.c.token, users.c.ssh_private_key).where(
            sa.or_(sa.not_(users.c.token.startswith(SEALED_PREFIX)), _key_in_clear(users.c.ssh_private_key))
        )
    )
    return [UserSecrets(r.id, r.token, r.ssh_private_key) for r in rows]


async def rewrite_user_secrets(conn: AsyncConnection, was: UserSecrets, token: str, ssh_private_key: str | None) -> int:
    """Set a user's token and key, while they are still as read (``was``); how many rows were rewritten."""
    key = users.c.ssh_private_key
    q = (
        sa.update(users)
        .where(
            users.c.id == was.user_id,
            users.c.token == was.token,
            key.is_(None) if was.ssh_private_key is None else key == was.ssh_private_key,
        )
        .values(token=token, ssh_private_key=ssh_private_key)
    )
    return int((await conn.execute(q)).rowcount)


async def project_keys_in_clear(conn: AsyncConnection) -> list[StoredText]:
    """Projects' SSH private keys in clear."""
    return await _texts(conn, projects.c.id, projects.c.ssh_private_key, _key_in_clear(projects.c.ssh_private_key))


async def rewrite_project_keys(conn: AsyncConnection, rewrites: Sequence[Rewrite]) -> int:
    """Set projects' SSH private keys, each while still as read; how many rows were rewritten."""
    return await _rewrite(conn, _SET_PROJECT_KEY, rewrites)


async def live_agents_with_token_in_clear(conn: AsyncConnection) -> list[StoredText]:
    """The ``agent`` JSON of instances not terminated whose token is not sealed. A terminated instance's agent
    is gone, and its token with it: only live rows are read (by the status index), so a start does not scan
    every instance ever made."""
    return await _texts(
        conn,
        instances.c.id,
        instances.c.agent,
        instances.c.status.in_(_LIVE),
        instances.c.agent.is_not(None),
        sa.not_(instances.c.agent.contains(_SEALED_AGENT_TOKEN)),
    )


async def ssh_agents_with_keys_in_clear(conn: AsyncConnection) -> list[StoredText]:
    """The ``agent`` JSON of SSH host instances (deleted ones included) that holds a private key in clear."""
    return await _texts(
        conn, instances.c.id, instances.c.agent, instances.c.backend == "ssh", _key_in_clear(instances.c.agent)
    )


async def rewrite_instance_agents(conn: AsyncConnection, rewrites: Sequence[Rewrite]) -> int:
    """Set instances' ``agent`` JSON, each while still as read; how many rows were rewritten."""
    return await _rewrite(conn, _SET_INSTANCE_AGENT, rewrites)


async def fleet_specs_with_keys_in_clear(conn: AsyncConnection) -> list[StoredText]:
    """Fleet specs (deleted fleets included) that hold a private key in clear."""
    return await _texts(conn, fleets.c.id, fleets.c.spec, _key_in_clear(fleets.c.spec))


async def rewrite_fleet_specs(conn: AsyncConnection, rewrites: Sequence[Rewrite]) -> int:
    """Set fleet specs, each while still as read; how many rows were rewritten."""
    return await _rewrite(conn, _SET_FLEET_SPEC, rewrites)


async def run_specs_with_registry_auth(conn: AsyncConnection) -> list[StoredText]:
    """Run specs that hold registry credentials (sealed or not: every run ever stored is scanned)."""
    return await _texts(conn, runs.c.id, runs.c.run_spec, runs.c.run_spec.contains(_HAS_REGISTRY_AUTH))


async def job_specs_with_registry_auth(conn: AsyncConnection) -> list[StoredText]:
    """Job specs that hold registry credentials (sealed or not: every job ever stored is scanned)."""
    return await _texts(conn, jobs.c.id, jobs.c.job_spec, jobs.c.job_spec.contains(_HAS_REGISTRY_AUTH))


async def rewrite_run_specs(conn: AsyncConnection, rewrites: Sequence[Rewrite]) -> int:
    """Set run specs, each while still as read; how many rows were rewritten."""
    return await _rewrite(conn, _SET_RUN_SPEC, rewrites)


async def rewrite_job_specs(conn: AsyncConnection, rewrites: Sequence[Rewrite]) -> int:
    """Set job specs, each while still as read; how many rows were rewritten."""
    return await _rewrite(conn, _SET_JOB_SPEC, rewrites)
