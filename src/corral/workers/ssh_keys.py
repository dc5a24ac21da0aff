"""At start-up: seal the SSH private keys that rows written before keys were sealed still hold in clear.

Since SSH fleets' keys are sealed at rest (:mod:`corral.backends.ssh_secrets`), every new fleet spec
and host connection is written sealed, and a key found in clear is still used as it is. This pass
closes the gap for rows from before: SSH fleets' specs and SSH host instances' ``agent`` JSON, deleted
ones included (a deleted row still holds its keys), are rewritten with their keys sealed.

It runs in the application, not as an Alembic migration, because sealing needs the server's key
(``CORRAL_SERVER_ENCRYPTION_KEY`` or the key file), which migrations do not have; and because a row
an older replica writes during a rolling upgrade is sealed at the next start all the same. Each row is
rewritten only if it still holds what was read (a concurrent write wins and is sealed on its own).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from corral.backends.ssh_secrets import is_sealed, seal_connection, seal_spec
from corral.context import Context
from corral.domain.ssh_keys import connection_private_keys, spec_private_keys
from corral.store import secrets_in_clear as in_clear
from corral.store.encryption import Cipher, cipher_for
from corral.store.fleets import dump

log = logging.getLogger("corral.ssh")


def _in_clear(keys: list[str]) -> bool:
    return any(not is_sealed(k) for k in keys)


def _sealed_spec(cipher: Cipher, text: str) -> str | None:
    spec = orjson.loads(text)
    if not isinstance(spec, dict) or not _in_clear(spec_private_keys(spec)):
        return None
    return dump(seal_spec(cipher, spec))


def _sealed_agent(cipher: Cipher, text: str) -> str | None:
    agent: Any = orjson.loads(text)
    connection = agent.get("connection") if isinstance(agent, dict) else None
    if not isinstance(connection, dict) or not _in_clear(connection_private_keys(connection)):
        return None
    return dump({**agent, "connection": seal_connection(cipher, connection)})


async def seal_stored_keys(ctx: Context) -> int:
    """Seal every SSH private key stored in clear; returns how many rows were rewritten. A failure is
    logged and leaves the rows as they are (keys in clear still work): it never stops the server."""
    try:
        return await _seal_stored_keys(ctx)
    except Exception:
        log.exception("could not seal the SSH private keys stored in clear; trying again at the next start")
        return 0


async def _seal_stored_keys(ctx: Context) -> int:
    async with ctx.db.read() as conn:
        # Only rows with a key in clear are read (a sealed key is base64 after `enc:v1:`): the database
        # filters, so a start costs no more as fleets and instances accumulate.
        specs = await in_clear.fleet_specs_with_keys_in_clear(conn)
        agents = await in_clear.ssh_agents_with_keys_in_clear(conn)
    cipher = cipher_for(ctx.settings)
    fleet_updates = [
        in_clear.Rewrite(r.row_id, r.text, new) for r in specs if (new := _sealed_spec(cipher, r.text)) is not None
    ]
    instance_updates = [
        in_clear.Rewrite(r.row_id, r.text, new) for r in agents if (new := _sealed_agent(cipher, r.text)) is not None
    ]
    if not fleet_updates and not instance_updates:
        return 0
    async with ctx.db.write() as conn:
        rewritten = await in_clear.rewrite_fleet_specs(conn, fleet_updates)
        rewritten += await in_clear.rewrite_instance_agents(conn, instance_updates)
    log.info("sealed the SSH private keys of %d stored row(s) written before keys were encrypted", rewritten)
    return rewritten
