"""``runs/apply`` (and ``runs/get_plan``'s verdict) refuses a run that exceeds its project's ``quota.max``
on its own (the least it asks for: GPUs, CPUs, memory, instances for its nodes), naming the quota.
A run that fits alone but not beside what the project holds is admitted and waits in the queue."""

from __future__ import annotations

from typing import Any

from corral.context import Context
from corral.domain.records import ProjectRec
from corral.services.errors import ServiceError
from corral.store.db import Connection


async def check(ctx: Context, project: ProjectRec, nodes: int, job_spec: dict[str, Any] | None) -> None:
    """Refuse (400) a run of ``nodes`` jobs like ``job_spec`` that alone exceeds the project's max."""
    if job_spec is None:
        return
    async with ctx.db.read() as conn:
        await check_in(conn, project, nodes, job_spec)


async def check_in(conn: Connection, project: ProjectRec, nodes: int, job_spec: dict[str, Any] | None) -> None:
    """:func:`check`, with the project's policy read on ``conn`` (the transaction that submits the run)."""
    if job_spec is None:
        return
    from corral.store import quotas as store

    policy = await store.get_policy(conn, project.id)
    if policy is None or policy.max.is_empty():
        return
    from corral.config.job_facts import requirements_of
    from corral.scheduler.quota_gate import request_exceeds

    # parsed once per distinct resources, as the job's facts derived for the same job spec
    req = requirements_of(job_spec["requirements"]["resources"])
    over = request_exceeds(req, nodes, policy.max)
    if over is not None:
        raise ServiceError(f"The run exceeds the quota of project {project.name} on its own: it asks for {over}")
