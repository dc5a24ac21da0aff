"""A user's SSH key rotation as the runs see it: when ``users/refresh_ssh_key`` replaces a user's key, the
runs that were submitted with the old one (their ``run_spec.ssh_key_pub``) and may still be reached over
the SSH endpoint -- not finished, or finished within the endpoint's grace period -- carry the new one
instead, in the same transaction, so that the old key opens none of them from then on.

The rewrite reads the user's unfinished runs through the status index; the few finished within the grace
period are found by ``last_processed_at`` (a rare, user-initiated call, never on a hot path).
"""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.runs import FINISHED_RUN_STATUSES
from corral.store.tables import runs


def _same_key(a: Any, b: str) -> bool:
    """Two OpenSSH public keys are the same key when their type and base64 body are (comments aside)."""
    return isinstance(a, str) and a.split()[:2] == b.split()[:2]


async def replace_run_keys(conn: AsyncConnection, user_id: str, old_pub: str, new_pub: str | None, since: float) -> int:
    """Give the user's runs that carry ``old_pub`` (unfinished, or processed at or after ``since``)
    ``new_pub`` instead (None: no key of the run's own); how many were changed."""
    if not old_pub.strip():
        return 0
    body = old_pub.split()[1] if len(old_pub.split()) > 1 else old_pub.strip()
    reachable = sa.or_(
        runs.c.status.notin_(FINISHED_RUN_STATUSES),
        runs.c.last_processed_at >= since,
    )
    rows = (
        await conn.execute(
            sa.select(runs.c.id, runs.c.run_spec).where(
                runs.c.user_id == user_id,
                runs.c.deleted == sa.false(),
                reachable,
                runs.c.run_spec.contains(body, autoescape=True),
            )
        )
    ).all()
    changed = 0
    for run_id, text in rows:
        spec = orjson.loads(text)
        if not _same_key(spec.get("ssh_key_pub"), old_pub):
            continue
        spec["ssh_key_pub"] = new_pub
        await conn.execute(sa.update(runs).where(runs.c.id == run_id).values(run_spec=orjson.dumps(spec).decode()))
        changed += 1
    return changed
