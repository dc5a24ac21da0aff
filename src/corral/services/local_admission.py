"""Who may run host-process jobs on the local backend when its agents have no sandbox.

Without root the local backend's agents cannot give a job a sandbox (its own network, filesystem view and
uid): a job would run as the server's OS user and could read the server's state. So on such a server
only global admins' runs may land on it; anyone's runs still go to SSH fleets and into containers.
A run reaches the local backend through its own project's backends (the projects the server's
``config.yml`` names) or through a local fleet another project exports to its project: both are held to
the rule. The reason comes from :class:`corral.backends.local.LocalCompute` (``sandbox_reason``).
"""

from __future__ import annotations

from typing import Any

from corral.backends.base import sandbox_reason
from corral.config import fleet_spec
from corral.config.run_spec import RunSpec
from corral.context import Context
from corral.domain.records import ProjectRec, UserRec
from corral.scheduler.types import FleetSlot
from corral.services.errors import ServiceError
from corral.store import fleets as fleet_store


def reaches_local(fleet: FleetSlot) -> bool:
    """Whether a job placed in ``fleet`` could run on the local backend: it has a local instance, or may get
    one (its owner project has the local backend and the fleet's ``backends`` allow it)."""
    return any(o.backend == "local" for o in fleet.offers) or any(i.backend == "local" for i in fleet.instances)


async def _own_fleets_keep_off(ctx: Context, project: ProjectRec, conf: dict[str, Any]) -> bool:
    """For a project with the local backend: whether the run names only SSH fleets of its own."""
    names = [f if isinstance(f, str) else None for f in conf.get("fleets") or []]
    if not names or not all(n and "/" not in n for n in names):
        return False
    async with ctx.db.read() as conn:
        found = [await fleet_store.get_fleet(conn, project.id, name=n) for n in names]
    return all(f is not None and fleet_spec.is_ssh(f.spec) for f in found)


async def _imports_keep_off(ctx: Context, project: ProjectRec, spec: RunSpec, job_spec: dict[str, Any]) -> bool:
    """For a project without the local backend: whether no fleet the run could use (exported to the
    project by another) could place it on the local backend, as the scheduler sees the fleets now."""
    from corral.services.plan_verdict import plan_screen

    screened = await plan_screen(ctx, project, spec, job_spec)
    return not any(reaches_local(f) for f in screened.fleets)


async def check(
    ctx: Context, project: ProjectRec, user: UserRec, spec: RunSpec, job_spec: dict[str, Any] | None
) -> None:
    """Refuse (400) a run of a user who is not a global admin that could run without a sandbox here."""
    reason = sandbox_reason(ctx.computes.get("local"))
    if reason is None or user.global_role == "admin":
        return
    if spec.conf.image or spec.conf.docker is True or ctx.settings.default_image:
        return  # a container, not a host process
    conf = spec.configuration
    backends = conf.get("backends")
    if backends and not {"local", "remote"} & set(backends):
        return
    if any(b.get("type") == "local" for b in project.backends):
        if await _own_fleets_keep_off(ctx, project, conf):
            return
    elif job_spec is None or await _imports_keep_off(ctx, project, spec, job_spec):
        return
    raise ServiceError(
        f"This server's local backend runs jobs without a sandbox ({reason}), so only global admins may "
        "submit runs that can land on it (in this project's fleets or a local fleet exported to it). Name "
        "SSH fleets in `fleets`, set an `image`, ask a global admin, or run the server as root"
    )
