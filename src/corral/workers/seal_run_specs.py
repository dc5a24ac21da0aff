"""At start-up, once per database: seal the ``registry_auth`` passwords that runs and jobs stored before
they were sealed (:mod:`corral.store.run_secrets` seals every new one; one found in clear is read as it
is meanwhile).

Unlike tokens and keys (``workers/seal_at_rest.py``), these sit in every run and job spec ever stored, so
looking for them costs a scan that grows with history. The pass therefore runs once: it records
:data:`MARKER` in ``server_state`` in the transaction that rewrites the rows, and every later start reads
that one row and stops. (Rows an older corral replica writes after the pass, during a rolling upgrade,
stay readable as they are.) Each row is rewritten only if it still holds what was read.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from corral.context import Context
from corral.store import secrets_in_clear as in_clear
from corral.store.fleets import dump
from corral.store.run_secrets import sealed_job_spec, sealed_run_spec
from corral.store.server_state import get_state, set_state

log = logging.getLogger("corral.secrets")

#: The ``server_state`` key recorded once the pass has run on this database.
MARKER = "sealed_run_registry_passwords"


def _resealed(text: str, seal: Any) -> str | None:
    doc = orjson.loads(text)
    if not isinstance(doc, dict):
        return None
    new = seal(doc)
    return None if new == doc else dump(new)


async def seal_run_specs(ctx: Context) -> int | None:
    """Seal the passwords in clear; how many rows were rewritten (None: the pass had run already)."""
    async with ctx.db.read() as conn:
        if await get_state(conn, MARKER) is not None:
            return None
        run_rows = await in_clear.run_specs_with_registry_auth(conn)
        job_rows = await in_clear.job_specs_with_registry_auth(conn)
    cipher = ctx.cipher()  # cheap: AES is loaded on the first encryption
    run_updates = [
        in_clear.Rewrite(r.row_id, r.text, new)
        for r in run_rows
        if (new := _resealed(r.text, lambda d: sealed_run_spec(cipher, d)))
    ]
    job_updates = [
        in_clear.Rewrite(r.row_id, r.text, new)
        for r in job_rows
        if (new := _resealed(r.text, lambda d: sealed_job_spec(cipher, d)))
    ]
    async with ctx.db.write() as conn:
        if await get_state(conn, MARKER) is not None:
            return None  # another replica ran it meanwhile
        rewritten = await in_clear.rewrite_run_specs(conn, run_updates)
        rewritten += await in_clear.rewrite_job_specs(conn, job_updates)
        await set_state(conn, MARKER, "1", time.time())
    if rewritten:
        log.info(
            "sealed the registry passwords of %d stored run and job spec(s) written before they were encrypted",
            rewritten,
        )
    return rewritten
