"""Runs with an image are refused where they could only land on Slurm, saying what each cluster has.

On a Slurm cluster corral's agent runs as the cluster user and runs jobs as host processes: it cannot start
containers there (no root, no Docker). The site's way would be Pyxis or Apptainer/Singularity; each cluster is
looked at for them when it is configured and when the server starts (``SlurmCluster.detect_runtimes``), but
corral does not drive them yet. A run with an ``image`` (or ``docker: true``, or the server's default image) whose
every possible fleet places it on Slurm is refused at plan and apply time with that reason -- what was looked for,
and what each cluster it could land on has -- instead of failing on the node.

May import: what ``corral.services`` may.
"""

from __future__ import annotations

from typing import Any

from corral.backends.slurm.parse import RUNTIME_LOOKED_FOR
from corral.config.run_spec import RunSpec
from corral.context import Context
from corral.domain.records import ProjectRec
from corral.scheduler.types import FleetSlot
from corral.services.errors import ServiceError

BACKEND = "slurm"
_NAMES = {"pyxis": "Pyxis", "apptainer": "Apptainer", "singularity": "Singularity"}


def _backends(fleet: FleetSlot) -> set[str]:
    return {o.backend for o in fleet.offers} | {i.backend for i in fleet.instances}


def _regions(fleets: list[FleetSlot]) -> list[str]:
    return sorted({o.region for f in fleets for o in f.offers if o.backend == BACKEND and o.region})


def runtimes_said(ctx: Context, project: str, regions: list[str]) -> str:
    """What each cluster has: ``cluster hpc has neither``, ``cluster hpc has Pyxis``, ``... was not looked at``."""
    known = {c.name: c for c in ctx.slurm.clusters()} | {c.name: c for c in ctx.slurm.of(project)}
    said = []
    for name in regions:
        cluster = known.get(name)
        found = cluster.runtimes if cluster is not None else None
        if found is None:
            said.append(f"cluster {name} has not been looked at (its login node has not answered)")
        elif not found:
            said.append(f"cluster {name} has neither")
        else:
            said.append(f"cluster {name} has {' and '.join(_NAMES[r] for r in found)}, which corral does not drive yet")
    return "; ".join(said) or "no cluster"


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
    found = runtimes_said(ctx, project.name, _regions(list(screened.fleets)))
    raise ServiceError(
        "`image`: this run could only run on Slurm, where corral runs jobs as host processes of the cluster "
        f"user and starts no container. corral looked for {RUNTIME_LOOKED_FOR}: {found}. Remove `image` (and "
        "`docker`) to run the commands on the nodes directly, with the site's modules, or name a fleet of another "
        "backend"
    )
