"""The scheduling policy's shape, in the server's ``config.yml`` and as the body of
``POST /api/projects/{project}/quotas/set``: a project's ``weight``, ``quota`` (``nominal`` and ``max``)
and ``preemptible_max_priority``, and the server-wide ``scheduling.preemption`` block.

An omitted key means no limit. ``gpu`` is a count of any model or a map of models (``{H100: 8, any:
16}``); ``memory`` is in GB (``512GB``, ``2TB``); ``price_per_hour`` in dollars. Imports only pydantic,
``corral.config.common`` and ``corral.domain``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.config.common import Duration, Memory
from corral.domain.quotas import Limits, QuotaPolicy, limits_from_doc


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


RunType = Literal["task", "service", "dev-environment"]
GpuLimit = Union[int, dict[str, int]]


def _check_gpu(value: GpuLimit | None) -> GpuLimit | None:
    if isinstance(value, dict):
        for model, count in value.items():
            if not model.strip():
                raise ValueError("a GPU model name must not be empty (e.g. `{H100: 8, any: 16}`)")
            if count < 0:
                raise ValueError(f"the count for {model} must be 0 or more")
    elif value is not None and value < 0:
        raise ValueError("must be 0 or more")
    return value


class NominalQuota(_Strict):
    gpu: Optional[GpuLimit] = None
    cpu: Optional[int] = Field(default=None, ge=0)
    memory: Optional[Memory] = None
    instances: Optional[int] = Field(default=None, ge=0)

    _gpu = field_validator("gpu")(_check_gpu)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: float | None) -> float | None:
        if v is not None and v < 0:
            raise ValueError("must be 0 or more")
        return v


class MaxQuota(NominalQuota):
    price_per_hour: Optional[float] = Field(default=None, ge=0)


class Quota(_Strict):
    nominal: NominalQuota = Field(default_factory=NominalQuota)
    max: MaxQuota = Field(default_factory=MaxQuota)


class ProjectPolicy(_Strict):
    """A project's policy: the body of ``quotas/set``, the answer of ``quotas/get`` (with ``name``)."""

    weight: float = Field(default=1.0, gt=0)
    quota: Quota = Field(default_factory=Quota)
    preemptible_max_priority: Optional[int] = Field(default=None, ge=0, le=100)
    #: The run types ``preemptible_max_priority`` covers (omitted: tasks only).
    preemptible_run_types: Optional[list[RunType]] = None

    def to_policy(self) -> QuotaPolicy:
        return QuotaPolicy(
            weight=float(self.weight),
            nominal=_limits(self.quota.nominal),
            max=_limits(self.quota.max),
            preemptible_max_priority=self.preemptible_max_priority,
            preemptible_run_types=tuple(dict.fromkeys(self.preemptible_run_types or ())),
        )


def _limits(model: NominalQuota) -> Limits:
    return limits_from_doc(model.model_dump(exclude_none=True))


class Preemption(_Strict):
    enabled: bool = False
    min_priority_gap: int = Field(default=10, ge=0, le=100)
    min_runtime: Duration = 600
    grace_period: Duration = 120
    #: At most this many gangs are preempted in one scheduling pass.
    max_victims_per_cycle: int = Field(default=8, ge=1, le=1000)


class Scheduling(_Strict):
    preemption: Preemption = Field(default_factory=Preemption)


POLICY_KEYS = ("weight", "quota", "preemptible_max_priority", "preemptible_run_types")


def policy_doc(policy: QuotaPolicy) -> dict[str, Any]:
    """The document form of a stored policy (what ``quotas/get`` answers, less the name)."""
    from corral.domain.quotas import limits_to_doc

    return {
        "weight": int(policy.weight) if float(policy.weight).is_integer() else policy.weight,
        "quota": {"nominal": limits_to_doc(policy.nominal), "max": limits_to_doc(policy.max)},
        "preemptible_max_priority": policy.preemptible_max_priority,
        "preemptible_run_types": list(policy.preemptible_run_types) or None,
    }


def parse_policy(data: Any) -> QuotaPolicy:
    """A policy document checked (pydantic's ``ValidationError`` names the field otherwise)."""
    return ProjectPolicy.model_validate(data).to_policy()
