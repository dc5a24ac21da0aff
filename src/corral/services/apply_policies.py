"""The server's apply policies (``config.yml``'s ``plugins``, :mod:`corral.policies`) asked at the edge of a use
case: a run's, fleet's or volume's spec, once validated, goes to each policy before anything is written; what
comes back is validated again as the spec to apply, and a refusal is a 400 naming the policy
(docs/policies.md). As in dstack, ``get_plan`` asks too, so that a plan shows the spec the apply would apply.

May import ``domain``, ``config``, ``schemas``, ``context``, ``policies``, ``services.errors`` and
``services.run_specs``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from corral.config.run_spec import RunSpec
from corral.context import Context
from corral.domain.records import ProjectRec, UserRec
from corral.policies.rest import PolicyError, SpecKind, apply_all
from corral.services import run_specs
from corral.services.errors import InvalidConfiguration, ServiceError

log = logging.getLogger("corral.policies")

T = TypeVar("T")

#: Where a 422 of the answer's spec points: the policy's response body.
ANSWER = ("policy", "spec")


async def ask(
    ctx: Context, kind: SpecKind, project: ProjectRec, user: str, document: Mapping[str, object]
) -> dict[str, object] | None:
    """The spec ``document`` as the server's policies answer it, or None when there is no policy or they keep
    it as it is; a :class:`ServiceError` (400) naming the policy when one refuses it or cannot be asked."""
    if not ctx.policies:
        return None
    try:
        out = await apply_all(ctx.policies, kind, user, project.name, document)
    except PolicyError as e:
        log.warning(
            "%s apply refused in project %s for %s: %s",
            kind,
            project.name,
            user,
            e.msg,
            extra={"event": "policy_refused", "project": project.name, "user": user},
        )
        raise ServiceError(e.msg) from None
    return None if out == dict(document) else out


def reparsed(ctx: Context, kind: SpecKind, parse: Callable[[], T]) -> T:
    """``parse()`` of the spec a policy answered; its errors say that the policy's spec is the one at fault."""
    who = ", ".join(f"{p.name} ({p.uri})" for p in ctx.policies)
    try:
        return parse()
    except InvalidConfiguration as e:
        first = e.errors[0]
        where = ".".join(str(p) for p in first.get("loc", ())[len(ANSWER) + 1 :]) or "spec"
        msg = f"{where}: {first.get('msg')}"
    except ServiceError as e:
        msg = e.msg
    raise ServiceError(f"The {kind} spec that the policy service {who} answered is not valid: {msg}")


async def run(ctx: Context, project: ProjectRec, user: UserRec, spec: RunSpec) -> RunSpec:
    """``spec`` as the policies answer it (``spec`` itself when there are none or they keep it)."""
    answered = await ask(ctx, "run", project, user.name, spec.document)
    if answered is None:
        return spec

    def parse() -> RunSpec:
        raw = run_specs.from_document(answered, ANSWER)
        return run_specs.normalize(raw, ANSWER, user, ctx.settings)

    return reparsed(ctx, "run", parse)


__all__ = ["ANSWER", "ask", "reparsed", "run"]
