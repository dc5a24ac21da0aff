"""Profile parameters (`retry`, `idle_duration`, `fleets`, `instances`, `spot_policy`, ...) usable in
run and fleet configurations and `.dstack/profiles.yml`, the `Profile` object dstack sends as
`run_spec.profile`, and `effective_profile` (configuration fields override the profile's).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator, model_validator
from typing_extensions import Self

from corral.config.common import (
    BackendType,
    CoreModel,
    Duration,
    EntityReference,
    IdleDuration,
    OffableDuration,
    Tags,
    validate_cron,
)

DEFAULT_RETRY_DURATION = 3600
DEFAULT_RUN_TERMINATION_IDLE_TIME = 5 * 60
DEFAULT_FLEET_TERMINATION_IDLE_TIME = 72 * 60 * 60
DEFAULT_STOP_DURATION = 300
MIN_UTILIZATION_TIME_WINDOW = 300
#: The validation-context key that lowers ``utilization_policy.time_window``'s minimum (the server's
#: ``CORRAL_UTILIZATION_MIN_WINDOW``, for checks that cannot wait five minutes; stored specs were checked when
#: they were submitted, and are read again with 0).
UTILIZATION_MIN_WINDOW_KEY = "utilization_min_window"


class SpotPolicy(str, Enum):
    SPOT = "spot"
    ONDEMAND = "on-demand"
    AUTO = "auto"


class CreationPolicy(str, Enum):
    REUSE = "reuse"
    REUSE_OR_CREATE = "reuse-or-create"


class StartupOrder(str, Enum):
    ANY = "any"
    MASTER_FIRST = "master-first"
    WORKERS_FIRST = "workers-first"


class StopCriteria(str, Enum):
    ALL_DONE = "all-done"
    MASTER_DONE = "master-done"


class RetryEvent(str, Enum):
    NO_CAPACITY = "no-capacity"
    INTERRUPTION = "interruption"
    ERROR = "error"


class RetrySpec(CoreModel):
    """`retry: {on_events: [...], duration: 1h}`; omitted `on_events` means all events."""

    on_events: Optional[list[RetryEvent]] = None
    duration: Optional[Duration] = None

    @model_validator(mode="after")
    def _non_empty_events(self) -> Self:
        if self.on_events is not None and not self.on_events:
            raise ValueError("`on_events` cannot be empty: omit it to retry on all events")
        return self


ProfileRetry = RetrySpec


class UtilizationPolicy(CoreModel):
    min_gpu_utilization: Annotated[int, Field(ge=0, le=100)]
    time_window: Duration

    @field_validator("time_window")
    @classmethod
    def _min_window(cls, value: int, info: ValidationInfo) -> int:
        context = info.context if isinstance(info.context, dict) else {}
        least = context.get(UTILIZATION_MIN_WINDOW_KEY, MIN_UTILIZATION_TIME_WINDOW)
        if value < least:
            shown = "5m" if least == MIN_UTILIZATION_TIME_WINDOW else f"{least:g}s"
            raise ValueError(f"Minimum time_window is {shown}")
        return value


class Schedule(CoreModel):
    """`schedule: {cron: "0 * * * *"}` or a list of crons (UTC); always serialised as a list."""

    cron: Union[list[str], str]

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: Union[list[str], str]) -> list[str]:
        values = [value] if isinstance(value, str) else value
        if not values:
            raise ValueError("At least one cron expression must be specified")
        for item in values:
            validate_cron(item)
        return values

    @property
    def crons(self) -> list[str]:
        return [self.cron] if isinstance(self.cron, str) else list(self.cron)


class InstanceNameSelector(CoreModel):
    name: Annotated[str, Field(min_length=1)]


class InstanceHostnameSelector(CoreModel):
    hostname: Annotated[str, Field(min_length=1)]


class FleetInstanceSelector(CoreModel):
    fleet: EntityReference
    instance: Annotated[int, Field(ge=0)]

    @field_validator("fleet", mode="before")
    @classmethod
    def _fleet(cls, value: Any) -> Any:
        return EntityReference.parse(value) if isinstance(value, str) else value


InstanceSelector = Union[InstanceNameSelector, InstanceHostnameSelector, FleetInstanceSelector]


def _instance_shorthand(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


def _fleet_reference(value: Union[EntityReference, str]) -> EntityReference:
    return EntityReference.parse(value)


FleetReference = Annotated[Union[EntityReference, str], AfterValidator(_fleet_reference)]
InstanceSelectorOrShorthand = Annotated[InstanceSelector, BeforeValidator(_instance_shorthand)]


class VastAIOfferOrder(str, Enum):
    SCORE = "score"
    PRICE = "price"


class VastAIProfileOptions(CoreModel):
    type: Literal["vastai"] = "vastai"
    offer_order: Optional[VastAIOfferOrder] = None
    min_reliability: Annotated[Optional[float], Field(ge=0, le=1)] = None
    min_score: Annotated[Optional[int], Field(ge=0)] = None


BackendProfileOptions = VastAIProfileOptions


def check_backend_options(
    value: Optional[list[BackendProfileOptions]],
) -> Optional[list[BackendProfileOptions]]:
    seen: set[str] = set()
    for option in value or []:
        if option.type in seen:
            raise ValueError(f"backend_options contains duplicate entry for backend '{option.type}'")
        seen.add(option.type)
    return value


class ProfileParams(CoreModel):
    backends: Optional[list[BackendType]] = None
    regions: Optional[list[str]] = None
    availability_zones: Optional[list[str]] = None
    instance_types: Optional[list[str]] = None
    reservation: Optional[str] = None
    spot_policy: Optional[SpotPolicy] = None
    retry: Optional[Union[RetrySpec, bool]] = None
    max_duration: OffableDuration = None
    stop_duration: OffableDuration = None
    max_price: Annotated[Optional[float], Field(gt=0.0)] = None
    creation_policy: Optional[CreationPolicy] = None
    idle_duration: IdleDuration = None
    utilization_policy: Optional[UtilizationPolicy] = None
    startup_order: Optional[StartupOrder] = None
    stop_criteria: Optional[StopCriteria] = None
    schedule: Optional[Schedule] = None
    fleets: Optional[list[FleetReference]] = None
    #: An explicit empty list means "existing instances only" (as the seed PR settled; dstack 0.22.5
    #: rejects it -- a deliberate divergence).
    instances: Optional[list[InstanceSelectorOrShorthand]] = None
    tags: Tags = None
    backend_options: Optional[list[BackendProfileOptions]] = None

    _check_backend_options = field_validator("backend_options")(check_backend_options)


PROFILE_PARAM_NAMES: tuple[str, ...] = tuple(ProfileParams.model_fields)


class Profile(ProfileParams):
    """A named set of profile parameters (`profiles.yml` entries, `run_spec.profile`)."""

    name: str = ""
    default: bool = False


class ProfilesConfig(CoreModel):
    profiles: list[Profile]

    def default(self) -> Optional[Profile]:
        return next((p for p in self.profiles if p.default), None)


def effective_profile(profile: Optional[ProfileParams], conf: object) -> ProfileParams:
    """The profile parameters that apply: `conf`'s own non-null values override `profile`'s.

    `creation_policy` defaults to `reuse-or-create` (as dstack's merged run profile).
    """
    merged: dict[str, Any] = {}
    for key in PROFILE_PARAM_NAMES:
        value = getattr(conf, key, None)
        if value is None and profile is not None:
            value = getattr(profile, key)
        merged[key] = value
    if merged["creation_policy"] is None:
        merged["creation_policy"] = CreationPolicy.REUSE_OR_CREATE
    return ProfileParams.model_validate(merged)
