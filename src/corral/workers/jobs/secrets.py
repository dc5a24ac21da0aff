"""A job's secrets, filled in only when it is sent to its host: the ``${{ secrets.NAME }}`` references of
its ``env`` values and ``registry_auth`` resolved from the project's secrets in memory (the stored specs
keep the references, so no value reaches the database), and the values its output is masked for
(:mod:`corral.domain.log_masking`) before it is stored.

A reference that cannot be resolved (the secret was deleted while the job waited) ends the job
``terminated_by_server`` with dstack's "Secrets interpolation error: ...". May import: the domain's
interpolation, the store's secrets and encryption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.context import Context
from corral.domain.interpolation import InterpolationError, interpolate, secret_names
from corral.store import secrets as store
from corral.store.encryption import open_sealed


@dataclass(frozen=True)
class Filled:
    env: dict[str, str]
    registry_auth: dict[str, Any] | None
    #: The values of the secrets the job was given (what its output is masked for).
    values: tuple[str, ...]


def _strings(env: Mapping[str, Any], auth: Any) -> list[str]:
    values = [v for v in env.values() if isinstance(v, str)]
    if isinstance(auth, dict):
        values += [auth[k] for k in ("username", "password") if isinstance(auth.get(k), str)]
    return values


async def _values(ctx: Context, project_id: str, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    async with ctx.db.read() as conn:
        found = await store.get_by_names(conn, project_id, names)
    return {s.name: open_sealed(ctx.cipher, s.value) for s in found}


async def fill(ctx: Context, project_id: str, env: Mapping[str, Any], auth: Any) -> Filled:
    """``env`` and ``auth`` (its password already in clear) with their secrets filled in; raises
    :class:`InterpolationError` (its message names what is missing, never a value)."""
    names = secret_names(_strings(env, auth))
    found = await _values(ctx, project_id, names)
    ns = {"secrets": found}
    out_env = {k: interpolate(v, ns) if isinstance(v, str) else v for k, v in env.items()}
    out_auth = auth
    if isinstance(auth, dict):
        out_auth = {
            k: interpolate(v, ns) if k in ("username", "password") and isinstance(v, str) else v
            for k, v in auth.items()
        }
    return Filled(out_env, out_auth, tuple(found[n] for n in names if n in found))


async def mask_values(ctx: Context, project_id: str, env: Mapping[str, Any], auth: Any) -> tuple[str, ...]:
    """The values of the secrets a job refers to, as they are now (a follower that starts after the
    submission: another replica, or this one after a restart)."""
    try:
        names = secret_names(_strings(env, auth))
    except InterpolationError:
        return ()
    found = await _values(ctx, project_id, names)
    return tuple(found[n] for n in names if n in found)
