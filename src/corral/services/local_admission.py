"""Who may run host-process jobs on the local backend when its agents have no sandbox.

Without root the local backend's agents cannot give a job a sandbox (its own network, filesystem view and
uid): a job would run as the server's OS user and could read the server's state. So on such a server
only global admins' runs may land on it; anyone's runs still go to SSH fleets and into containers.
The reason comes from :class:`corral.backends.local.LocalCompute` (``sandbox_reason``).
"""

from __future__ import annotations

from typing import Any

from corral.domain.records import ProjectRec, UserRec
from corral.services.errors import ServiceError
from corral.store import fleets as fleet_store
from corral.workers.context import Context


async def check(ctx: Context, project: ProjectRec, user: UserRec, conf: dict[str, Any]) -> None:
    """Refuse (400) a run of a user who is not a global admin that could run without a sandbox here."""
    reason = getattr(ctx.computes.get("local"), "sandbox_reason", None)
    if reason is None or user.global_role == "admin":
        return
    if not any(b.get("type") == "local" for b in project.backends):
        return  # the project cannot reach the local backend at all
    if conf.get("image") or ctx.settings.default_image:
        return  # a container, not a host process
    backends = conf.get("backends")
    if backends and not {"local", "remote"} & set(backends):
        return
    names = [f if isinstance(f, str) else None for f in conf.get("fleets") or []]
    if names and all(n and "/" not in n for n in names):
        async with ctx.db.read() as conn:
            found = [await fleet_store.get_fleet(conn, project.id, name=n) for n in names]
        if all(f is not None and f.spec.get("configuration", {}).get("ssh_config") for f in found):
            return
    raise ServiceError(
        f"This server's local backend runs jobs without a sandbox ({reason}), so only global admins may "
        "submit runs that can land on it. Name SSH fleets in `fleets`, set an `image`, ask a global admin, "
        "or run the server as root"
    )
