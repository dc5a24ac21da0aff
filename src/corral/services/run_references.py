"""The ``${{ ... }}`` references of a run configuration, checked when it is planned and applied
(:mod:`corral.domain.interpolation` has the grammar): in ``env`` values and ``registry_auth`` only
``secrets.NAME`` is resolved by the server, when the job is sent to its host, so anything else there (an
``env.X`` the client did not fill in, a namespace dstack does not have, an illegal name) and any secret
the project does not have is refused here, with a 400 naming the field and the missing names, before
anything is written. The stored spec keeps the references; values are never read here.
"""

from __future__ import annotations

from typing import Any

from corral.context import Context
from corral.domain.interpolation import InterpolationError, interpolate, references
from corral.domain.records import ProjectRec
from corral.services import secrets
from corral.services.errors import ServiceError


def referencing_fields(configuration: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, value)`` of every value the server interpolates: ``env`` values and ``registry_auth``."""
    out: list[tuple[str, str]] = []
    env = configuration.get("env")
    if isinstance(env, dict):
        out += [(f"env.{k}", v) for k, v in env.items() if isinstance(v, str)]
    auth = configuration.get("registry_auth")
    if isinstance(auth, dict):
        out += [(f"registry_auth.{k}", auth[k]) for k in ("username", "password") if isinstance(auth.get(k), str)]
    return out


async def check(ctx: Context, project: ProjectRec, configuration: dict[str, Any]) -> None:
    fields = referencing_fields(configuration)
    wanted: dict[str, list[str]] = {}
    for field, value in fields:
        try:
            refs = references(value)
        except InterpolationError as e:
            raise ServiceError(f"`{field}`: {e}") from None
        for ref in refs:
            ns, _, name = ref.partition(".")
            if ns == "secrets":
                wanted.setdefault(name, []).append(field)
    have = await secrets.existing_names(ctx, project.id, list(wanted)) if wanted else set()
    for field, value in fields:
        try:
            # every secret the project has stands in as itself: what remains missing is named
            interpolate(value, {"secrets": {n: "" for n in have}})
        except InterpolationError as e:
            hint = ""
            if any(field in wanted.get(n, ()) and n not in have for n in wanted):
                hint = f" (add it with `corral secret set NAME VALUE` or `dstack secret set` in project {project.name})"
            raise ServiceError(f"`{field}`: {e}{hint}") from None
