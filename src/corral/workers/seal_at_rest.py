"""At start-up: seal the secrets that rows written by an older corral still hold in clear.

Every new value is written sealed (users' tokens and generated SSH private keys, projects' SSH private
keys: ``services/credentials.py``; agents' tokens: ``workers/instances.py``, ``services/ssh_fleets.py``;
SSH fleets' keys have a pass of their own, ``workers/ssh_keys.py``, run first), and a value found in
clear is still read as it is. This pass
closes the gap for rows from before: it reads only the rows that still hold a value in clear (the
database filters, so a start with nothing to seal costs a few indexed-table scans and no decryption)
and rewrites each one if it still holds what was read (a concurrent write wins and is sealed on its
own). Agents' tokens are sealed in the rows of instances not yet terminated (a terminated instance's
agent, and so its token, is gone). Users' token hashes (the lookup key) were always written, so old
tokens keep working throughout.

On SQLite, rewriting a row leaves its old version in the file's free pages and in the WAL: after the
pass has rewritten anything, the database is vacuumed and its WAL truncated, once, so that a copy of
the files holds no value in clear. (On Postgres nothing SQL can read holds one; the dead row versions
stay in the table files until vacuuming and later writes reuse their space.)

It runs in the application, not in an Alembic migration, because sealing needs the server's key, which
migrations do not have, and because rows an older replica writes during a rolling upgrade are sealed at
the next start all the same. A failure is logged and never stops the server. Runs' and jobs' registry
passwords have a pass of their own that runs once per database (``workers/seal_run_specs.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import sqlalchemy as sa

from corral.context import Context
from corral.domain.statuses import UNFINISHED_INSTANCE
from corral.store.encryption import SEALED_PREFIX, Cipher, is_sealed, seal
from corral.store.fleets import dump
from corral.store.tables import instances, projects, users
from corral.workers.seal_run_specs import seal_run_specs
from corral.workers.ssh_keys import seal_stored_keys

log = logging.getLogger("corral.secrets")

_CLEAR_KEY = ("PRIVATE KEY", "PuTTY-User-Key-File")
#: How an agent's token sealed in an instance's ``agent`` JSON reads (``store.fleets.dump``: no spaces).
_SEALED_AGENT_TOKEN = f'"token":"{SEALED_PREFIX}'
_LIVE = UNFINISHED_INSTANCE


def _key_in_clear(column: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    return sa.or_(*(column.contains(m) for m in _CLEAR_KEY))


async def seal_stored_secrets(ctx: Context) -> int:
    """Seal every secret stored in clear; returns how many rows were rewritten."""
    rewritten = await seal_stored_keys(ctx)
    try:
        rewritten += await _seal_accounts_and_agents(ctx)
    except Exception:
        log.exception("could not seal the tokens and keys stored in clear; trying again at the next start")
    try:
        rewritten += await seal_run_specs(ctx) or 0
    except Exception:
        log.exception("could not seal the registry passwords stored in clear; trying again at the next start")
    if rewritten and ctx.db.is_sqlite:
        try:
            await _wipe_sqlite(ctx)
        except Exception:
            log.exception("could not vacuum the database after sealing; old values may remain in its free pages")
    return rewritten


def _sealed_agent(cipher: Cipher, text: str) -> str | None:
    agent: Any = orjson.loads(text)
    if not isinstance(agent, dict) or not isinstance(agent.get("token"), str) or is_sealed(agent["token"]):
        return None
    return dump({**agent, "token": cipher.encrypt(agent["token"])})


async def _seal_accounts_and_agents(ctx: Context) -> int:
    async with ctx.db.read() as conn:
        user_rows = (
            await conn.execute(
                sa.select(users.c.id, users.c.token, users.c.ssh_private_key).where(
                    sa.or_(sa.not_(users.c.token.startswith(SEALED_PREFIX)), _key_in_clear(users.c.ssh_private_key))
                )
            )
        ).all()
        project_rows = (
            await conn.execute(
                sa.select(projects.c.id, projects.c.ssh_private_key).where(_key_in_clear(projects.c.ssh_private_key))
            )
        ).all()
        agent_rows = (
            await conn.execute(
                sa.select(instances.c.id, instances.c.agent).where(
                    # a terminated instance's agent is gone, and its token with it: only live rows are read
                    # (by the status index), so a start does not scan every instance ever made
                    instances.c.status.in_(_LIVE),
                    instances.c.agent.is_not(None),
                    sa.not_(instances.c.agent.contains(_SEALED_AGENT_TOKEN)),
                )
            )
        ).all()
    if not user_rows and not project_rows and not agent_rows:
        return 0
    cipher = ctx.cipher()
    agent_updates = [(r.id, r.agent, new) for r in agent_rows if (new := _sealed_agent(cipher, r.agent)) is not None]
    rewritten = 0
    async with ctx.db.write() as conn:
        for r in user_rows:
            key = r.ssh_private_key
            q = (
                sa.update(users)
                .where(users.c.id == r.id, users.c.token == r.token, _same(users.c.ssh_private_key, key))
                .values(token=seal(cipher, r.token), ssh_private_key=seal(cipher, key) if key is not None else None)
            )
            rewritten += (await conn.execute(q)).rowcount
        for p in project_rows:
            q = (
                sa.update(projects)
                .where(projects.c.id == p.id, projects.c.ssh_private_key == p.ssh_private_key)
                .values(ssh_private_key=seal(cipher, p.ssh_private_key))
            )
            rewritten += (await conn.execute(q)).rowcount
        for row_id, old, new in agent_updates:
            q = sa.update(instances).where(instances.c.id == row_id, instances.c.agent == old).values(agent=new)
            rewritten += (await conn.execute(q)).rowcount
    if rewritten:
        log.info("sealed the tokens and private keys of %d stored row(s) written before they were encrypted", rewritten)
    return rewritten


def _same(column: sa.ColumnElement[Any], value: str | None) -> sa.ColumnElement[bool]:
    return column.is_(None) if value is None else column == value


async def _wipe_sqlite(ctx: Context) -> None:
    """Rebuild the SQLite file without the free pages that held the old values, and empty the WAL."""
    async with ctx.db.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        await driver.execute("VACUUM")
        await driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    log.info("vacuumed the database: no value sealed at this start is left in clear in its files")
