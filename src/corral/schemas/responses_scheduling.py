"""Response bodies of the REST API for the projects' scheduling policies, their usage and the queue
(corral's own routes): pydantic models for the OpenAPI document (see :mod:`corral.schemas.responses`,
whose base model they share and whose :func:`~corral.schemas.responses.model` finds them by name).
Imports: ``domain`` and pydantic.
"""

from __future__ import annotations

from typing import Optional

from pydantic import RootModel

from corral.schemas.responses import AnyObject, Out


class QuotaPolicy(Out):
    """A project's scheduling policy (``quotas/get``, ``quotas/set``)."""

    name: str
    weight: float
    quota: AnyObject
    preemptible_max_priority: Optional[int] = None
    preemptible_run_types: Optional[list[str]] = None


class QuotaUsage(Out):
    """What a project holds against its policy (``quotas/usage``)."""

    project_name: str
    weight: float
    nominal: AnyObject
    max: AnyObject
    used: AnyObject
    borrowed: AnyObject
    entitlement: AnyObject
    weighted_share: float
    capacity: AnyObject


class QueueEntry(Out):
    position: int
    project_name: str
    run_name: str
    priority: int
    submitted_at: float
    jobs: int
    reason: str
    status_message: Optional[str] = None


class SchedulingQueue(RootModel[list[QueueEntry]]):
    pass
