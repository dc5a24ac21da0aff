"""The `service` run type: port, gateway, model mapping, auth, replicas and autoscaling, rate
limits, probes, and replica groups (also written as a list-valued `replicas`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, ValidationInfo, field_serializer, field_validator, model_validator
from typing_extensions import Self

from corral.config.common import CoreModel, Duration, EntityReference
from corral.config.profiles import ProfileParams, SpotPolicy
from corral.config.resources import IntRange, ResourcesSpec
from corral.config.runs import (
    BaseRunConfiguration,
    PortMapping,
    PythonVersion,
    ValidPort,
    _CommandsParams,
    check_group_name,
    check_group_names,
    coerce_python,
)

SCALING_WINDOWS = (30, 60, 300)
MAX_INT64 = 2**63 - 1


class ScalingSpec(CoreModel):
    metric: Literal["rps"]
    target: Annotated[float, Field(gt=0)]
    window: Optional[Duration] = None
    scale_up_delay: Duration = 300
    scale_down_delay: Duration = 600

    @field_validator("window")
    @classmethod
    def _window(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value not in SCALING_WINDOWS:
            raise ValueError("Window must be one of: `30s`, `60s`, `300s`")
        return value


class IPAddressPartitioningKey(CoreModel):
    type: Literal["ip_address"] = "ip_address"


class HeaderPartitioningKey(CoreModel):
    type: Literal["header"] = "header"
    header: Annotated[str, Field(pattern=r"^[a-zA-Z0-9-_]+$", max_length=500)]


class RateLimit(CoreModel):
    prefix: Annotated[str, Field(max_length=4094, pattern=r"^/[^\s\\{}]*$")] = "/"
    key: Annotated[Union[IPAddressPartitioningKey, HeaderPartitioningKey], Field(discriminator="type")] = Field(
        default_factory=IPAddressPartitioningKey
    )
    rps: Annotated[float, Field(ge=1 / 60, le=MAX_INT64 // 60)]
    burst: Annotated[int, Field(ge=0, le=MAX_INT64)] = 0


class HTTPHeaderSpec(CoreModel):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    value: Annotated[str, Field(min_length=1, max_length=2048)]


class ProbeConfig(CoreModel):
    type: Literal["http"]
    url: Optional[str] = None
    method: Optional[Literal["get", "post", "put", "delete", "patch", "head"]] = None
    headers: Annotated[list[HTTPHeaderSpec], Field(max_length=16)] = []
    body: Annotated[Optional[str], Field(min_length=1, max_length=2048)] = None
    timeout: Optional[Duration] = None
    interval: Optional[Duration] = None
    ready_after: Annotated[Optional[int], Field(ge=1)] = None
    until_ready: Optional[bool] = None

    @field_validator("timeout", "interval")
    @classmethod
    def _at_least_1s(cls, value: Optional[int], info: ValidationInfo) -> Optional[int]:
        if value is not None and value < 1:
            raise ValueError(f"Probe {info.field_name} cannot be shorter than 1s")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        if not value.startswith("/"):
            raise ValueError("Must start with `/`")
        if len(value) > 2048:
            raise ValueError("Cannot be longer than 2048 characters")
        if not value.isprintable():
            raise ValueError("Cannot contain non-printable characters")
        return value

    @model_validator(mode="after")
    def _body_and_method(self) -> Self:
        if self.body is not None and self.method in ("get", "head"):
            raise ValueError(f"Cannot set request body for the `{self.method}` method")
        return self


class TGIChatModel(CoreModel):
    type: Literal["chat"] = "chat"
    name: str
    format: Literal["tgi"]
    chat_template: Optional[str] = None
    eos_token: Optional[str] = None


class OpenAIChatModel(CoreModel):
    type: Literal["chat"] = "chat"
    name: str
    format: Literal["openai"]
    prefix: str = "/v1"


AnyModel = Annotated[Union[TGIChatModel, OpenAIChatModel], Field(discriminator="format")]


class RouterType(str, Enum):
    SMG = "smg"
    DYNAMO = "dynamo"


class ReplicaGroupRouterConfig(CoreModel):
    """`router: {type: smg | dynamo}`; `sglang` is the legacy name of `smg` (and still what's sent)."""

    type: RouterType = RouterType.SMG

    @field_validator("type", mode="before")
    @classmethod
    def _legacy(cls, value: Any) -> Any:
        return RouterType.SMG if value == "sglang" else value

    @field_serializer("type", when_used="json")
    def _serialize_type(self, value: RouterType) -> str:
        return "sglang" if value == RouterType.SMG else value.value


def _replica_range(value: IntRange) -> IntRange:
    if value.max is None:
        raise ValueError("The maximum number of replicas is required")
    if value.min is None:
        value.min = 0
    if value.min < 0:
        raise ValueError("The minimum number of replicas must be greater than or equal to 0")
    return value


def _check_scaling(replicas: Optional[IntRange], scaling: Optional[ScalingSpec]) -> None:
    if replicas is None:
        return
    if replicas.min != replicas.max and not scaling:
        raise ValueError("When you set `replicas` to a range, ensure to specify `scaling`.")
    if replicas.min == replicas.max and scaling:
        raise ValueError("To use `scaling`, `replicas` must be set to a range.")


class ReplicaGroup(CoreModel):
    """A replica group of a heterogeneous service (`count` is an alias of `replicas`)."""

    name: Optional[str] = None
    replicas: IntRange
    scaling: Optional[ScalingSpec] = None
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    spot_policy: Optional[SpotPolicy] = None
    reservation: Optional[str] = None
    commands: list[str] = []
    image: Optional[str] = None
    python: Optional[PythonVersion] = None
    nvcc: Optional[bool] = None
    docker: Optional[bool] = None
    privileged: Optional[bool] = None
    router: Optional[ReplicaGroupRouterConfig] = None

    @model_validator(mode="before")
    @classmethod
    def _count_alias(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "replicas" in data:
            data.pop("count", None)
        elif "count" in data:
            data["replicas"] = data.pop("count")
        return data

    _name = field_validator("name")(check_group_name)
    _replicas = field_validator("replicas")(_replica_range)

    @field_validator("python", mode="before")
    @classmethod
    def _python(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("image"):
            raise ValueError("`image` and `python` are mutually exclusive within a replica group")
        return coerce_python(value)

    @field_validator("docker", mode="before")
    @classmethod
    def _docker(cls, value: Any, info: ValidationInfo) -> Any:
        for other in ("image", "python", "nvcc"):
            if value is True and info.data.get(other):
                raise ValueError(f"`{other}` and `docker` are mutually exclusive within a replica group")
        return value

    @field_validator("privileged", mode="before")
    @classmethod
    def _privileged(cls, value: Any, info: ValidationInfo) -> Any:
        if value is False and info.data.get("docker") is True:
            raise ValueError("`privileged: false` is incompatible with `docker: true` within a replica group")
        return value

    @model_validator(mode="after")
    def _scaling(self) -> Self:
        _check_scaling(self.replicas, self.scaling)
        return self


GatewayRef = Annotated[Optional[Union[bool, EntityReference, str]], Field(union_mode="left_to_right")]


class _ServiceParams(CoreModel):
    port: Union[ValidPort, Annotated[str, Field(pattern=r"^[0-9]+:[0-9]+$")], PortMapping]
    gateway: GatewayRef = None
    strip_prefix: bool = True
    model: Optional[AnyModel] = None
    https: Optional[Union[bool, Literal["auto"]]] = None
    auth: bool = True
    scaling: Optional[ScalingSpec] = None
    rate_limits: list[RateLimit] = []
    probes: Optional[list[ProbeConfig]] = None
    replicas: Optional[IntRange] = None
    groups: Optional[list[ReplicaGroup]] = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_replica_groups(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("groups") is None and isinstance(data.get("replicas"), list):
            data["groups"] = data.pop("replicas")
        if data.get("groups") is not None and data.get("replicas") is not None:
            raise ValueError("`replicas` and `groups` are mutually exclusive")
        return data

    @property
    def port_mapping(self) -> PortMapping:
        """``port`` as validated: always a ``PortMapping``."""
        port = self.port
        assert isinstance(port, PortMapping), port
        return port

    @field_validator("port")
    @classmethod
    def _port(cls, value: Union[int, str, PortMapping]) -> PortMapping:
        if isinstance(value, int):
            return PortMapping(local_port=80, container_port=value)
        if isinstance(value, str):
            return PortMapping.parse(value)
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> Any:
        return {"type": "chat", "name": value, "format": "openai"} if isinstance(value, str) else value

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, value: Any) -> Any:
        return EntityReference.parse(value) if isinstance(value, str) else value

    @field_validator("rate_limits")
    @classmethod
    def _rate_limits(cls, value: list[RateLimit]) -> list[RateLimit]:
        duplicates = [p for p, count in Counter(r.prefix for r in value).items() if count > 1]
        if duplicates:
            raise ValueError(
                f"Prefixes {duplicates} are used more than once. Each rate limit should have a unique path prefix"
            )
        return value

    @field_validator("probes")
    @classmethod
    def _probes(cls, value: Optional[list[ProbeConfig]]) -> Optional[list[ProbeConfig]]:
        if value is not None and any(p in value[:i] for i, p in enumerate(value)):
            raise ValueError("Probes must be unique")
        return value

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: Optional[IntRange]) -> Optional[IntRange]:
        return None if value is None else _replica_range(value)

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: Optional[list[ReplicaGroup]]) -> Optional[list[ReplicaGroup]]:
        if value is not None:
            check_group_names(value, "replica")
        return value

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_scaling(self.replicas, self.scaling)
        if self.groups is not None:
            _check_groups(self, self.groups)
        return self


_Pred = Callable[[ReplicaGroup], bool]


def _check_groups(conf: _ServiceParams, groups: list[ReplicaGroup]) -> None:  # noqa: C901
    if conf.scaling is not None:
        raise ValueError(
            "Top-level `scaling` is not allowed when `groups` is set. Specify `scaling` in each replica group instead."
        )
    if getattr(conf, "commands", None):
        raise ValueError(
            "Top-level `commands` is not allowed when `groups` is set. "
            "Specify `commands` in each replica group instead."
        )
    service_set = {
        "image": getattr(conf, "image", None) is not None,
        "docker": getattr(conf, "docker", None) is True,
        "privileged": getattr(conf, "privileged", None) is True,
        "python": getattr(conf, "python", None) is not None,
        "nvcc": getattr(conf, "nvcc", None) is True,
        "spot_policy": getattr(conf, "spot_policy", None) is not None,
        "reservation": getattr(conf, "reservation", None) is not None,
    }
    for field in service_set:
        if service_set[field]:
            conflicting = [g.name for g in groups if getattr(g, field) is not None]
            if conflicting:
                raise ValueError(
                    f"`{field}` is set at both the service level and in replica group(s) {conflicting}. "
                    f"Set `{field}` in one place only — either at the service level (all groups "
                    "inherit) or per group, but not both."
                )
    image_sources: dict[str, tuple[str, ...]] = {
        "image": ("docker", "python", "nvcc"),
        "docker": ("image", "python", "nvcc"),
        "python": ("image", "docker"),
        "nvcc": ("image", "docker"),
    }
    for s_field, g_fields in image_sources.items():
        if not service_set[s_field]:
            continue
        for g_field in g_fields:
            conflicting = [g.name for g in groups if getattr(g, g_field) is not None]
            if conflicting:
                raise ValueError(
                    f"Service-level `{s_field}` conflicts with group-level `{g_field}` in replica "
                    f"group(s) {conflicting}. These image-source fields are mutually exclusive."
                )
    for group in groups:
        if not group.commands and group.image is None and not service_set["image"]:
            raise ValueError(
                f"Replica group '{group.name}': either `commands` or `image` must be set in the group, "
                "or `image` at the service level."
            )
    routers = [g for g in groups if g.router is not None]
    if len(routers) > 1:
        raise ValueError("At most one replica group may specify `router`.")
    if routers and (routers[0].replicas.min != 1 or routers[0].replicas.max != 1):
        raise ValueError("For now replica group with `router` must have `replicas: 1`.")


class ServiceConfiguration(ProfileParams, BaseRunConfiguration, _CommandsParams, _ServiceParams):
    type: Literal["service"] = "service"

    @property
    def replica_groups(self) -> list[ReplicaGroup]:
        """`groups`, or one group named "0" built from the top-level fields."""
        if self.groups is not None:
            return self.groups
        replicas = self.replicas if self.replicas is not None else IntRange(min=1, max=1)
        return [
            ReplicaGroup(
                name="0",
                replicas=replicas,
                commands=self.commands,
                resources=self.resources,
                scaling=self.scaling,
            )
        ]
