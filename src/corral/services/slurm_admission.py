"""Runs with an image are refused where they could only land on Slurm.

On a Slurm cluster corral's agent runs as the cluster user and runs jobs as host processes: it cannot start
containers there (no root, no Docker; Pyxis or Apptainer would be the site's way, and corral does not drive
them yet). A run with an ``image`` (or ``docker: true``, or the server's default image) whose every possible
fleet places it on Slurm is refused at plan and apply time with that reason, instead of failing on the node.

May import: what ``corral.services`` may.
"""

from __future__ import annotations

from typing import Any

from corral.config.run_spec import RunSpec
from corral.context import Context
from corral.domain.records import ProjectRec
from corral.scheduler.types import FleetSlot
from corral.services.errors import ServiceError

BACKEND = "slurm"


def _backends(fleet: FleetSlot) -> set[str]:
    return {o.backend for o in fleet.offers} | {i.backend for i in fleet.instances}


async def check(ctx: Context, project: ProjectRec, spec: RunSpec, job_spec: dict[str, Any] | None) -> None:
    """Refuse (400) a run with an image that only Slurm fleets could take."""
    if BACKEND not in ctx.computes or job_spec is None:
        return
    if not (spec.conf.image or spec.conf.docker is True or ctx.settings.default_image):
        return
    from corral.services.plan_verdict import plan_screen

    screened = await plan_screen(ctx, project, spec, job_spec)
    reach = [_backends(f) for f in screened.fleets]
    if not reach or not any(BACKEND in r for r in reach) or any(r - {BACKEND} for r in reach):
        return
    raise ServiceError(
        "`image`: this run could only run on Slurm, where corral runs jobs as host processes of the cluster "
        "user and starts no container (neither Pyxis nor Apptainer is used): remove `image` (and `docker`) to run "
        "the commands on the nodes directly, with the site's modules, or name a fleet of another backend"
    )
