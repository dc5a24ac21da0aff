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

from corral.context import Context
from corral.store import secrets_in_clear as in_clear
from corral.store.encryption import Cipher, is_sealed, seal
from corral.store.fleets import dump
from corral.workers.seal_run_specs import seal_run_specs
from corral.workers.ssh_keys import seal_stored_keys

log = logging.getLogger("corral.secrets")


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
        user_rows = await in_clear.users_with_secrets_in_clear(conn)
        project_rows = await in_clear.project_keys_in_clear(conn)
        # a terminated instance's agent is gone, and its token with it: only live rows are read
        agent_rows = await in_clear.live_agents_with_token_in_clear(conn)
    if not user_rows and not project_rows and not agent_rows:
        return 0
    cipher = ctx.cipher()
    agent_updates = [
        in_clear.Rewrite(r.row_id, r.text, new)
        for r in agent_rows
        if (new := _sealed_agent(cipher, r.text)) is not None
    ]
    project_updates = [in_clear.Rewrite(p.row_id, p.text, seal(cipher, p.text)) for p in project_rows]
    rewritten = 0
    async with ctx.db.write() as conn:
        for u in user_rows:
            key = u.ssh_private_key
            rewritten += await in_clear.rewrite_user_secrets(
                conn, u, seal(cipher, u.token), seal(cipher, key) if key is not None else None
            )
        rewritten += await in_clear.rewrite_project_keys(conn, project_updates)
        rewritten += await in_clear.rewrite_instance_agents(conn, agent_updates)
    if rewritten:
        log.info("sealed the tokens and private keys of %d stored row(s) written before they were encrypted", rewritten)
    return rewritten


async def _wipe_sqlite(ctx: Context) -> None:
    """Rebuild the SQLite file without the free pages that held the old values, and empty the WAL."""
    await ctx.db.vacuum()
    log.info("vacuumed the database: no value sealed at this start is left in clear in its files")
