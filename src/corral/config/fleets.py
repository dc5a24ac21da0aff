"""The `fleet` type: the cloud form (`nodes`, `resources`, `backends`, ...) and the SSH form
(`ssh_config.hosts`), plus `placement` and `blocks`. `nodes` is normalised to
`{"min", "max"}` (with `target` serialised only when it differs from `min`).
"""

from __future__ import annotations

import ipaddress
from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from typing_extensions import Self

from corral.config.common import BackendType, CoreModel, Env, IdleDuration, Tags
from corral.config.profiles import (
    BackendProfileOptions,
    RetrySpec,
    SpotPolicy,
    check_backend_options,
)
from corral.config.resources import ResourcesSpec

Blocks = Union[Literal["auto"], Annotated[int, Field(ge=1)]]


class InstanceGroupPlacement(str, Enum):
    ANY = "any"
    CLUSTER = "cluster"


class SSHKey(CoreModel):
    public: str
    private: Optional[str] = None


class SSHProxyParams(CoreModel):
    hostname: str
    port: Optional[int] = None
    user: str
    identity_file: str
    ssh_key: Optional[SSHKey] = None


class SSHHostParams(CoreModel):
    hostname: str
    port: Optional[int] = None
    user: Optional[str] = None
    identity_file: Optional[str] = None
    proxy_jump: Optional[SSHProxyParams] = None
    internal_ip: Optional[str] = None
    ssh_key: Optional[SSHKey] = None
    blocks: Optional[Blocks] = None

    @field_validator("internal_ip")
    @classmethod
    def _internal_ip(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError("Invalid IP address") from None
        if not address.is_private:
            raise ValueError("IP address is not private")
        return value


class SSHParams(CoreModel):
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    ssh_key: Optional[SSHKey] = None
    proxy_jump: Optional[SSHProxyParams] = None
    hosts: list[Union[SSHHostParams, str]]
    network: Optional[str] = None

    @field_validator("network")
    @classmethod
    def _network(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError(f"Failed to parse network: {value}") from None
        if not network.is_private:
            raise ValueError("Public network is specified when private network is required")
        return value


class FleetNodesSpec(CoreModel):
    """`nodes: N` (min = target = max = N), `a..b`, or `{min = 0, target = min, max}`."""

    min: int
    target: int
    max: Optional[int] = None

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("min") is None:
            data["min"] = 0
        if data.get("target") is None:
            data["target"] = data["min"]
        return data

    @field_validator("min")
    @classmethod
    def _min(cls, value: int) -> int:
        if value < 0:
            raise ValueError("min cannot be negative")
        return value

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.target < self.min:
            raise ValueError("target must not be be less than min")
        if self.max is not None and self.max < self.min:
            raise ValueError("max must not be less than min")
        if self.max is not None and self.max < self.target:
            raise ValueError("max must not be less than target")
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if "target" in data and data["target"] == data["min"]:
            del data["target"]
        return data


class FleetConfiguration(CoreModel):
    type: Literal["fleet"] = "fleet"
    name: Optional[str] = None
    placement: Optional[InstanceGroupPlacement] = None
    blocks: Blocks = 1
    # cloud ("backend") fleets
    nodes: Optional[FleetNodesSpec] = None
    reservation: Optional[str] = None
    resources: Optional[ResourcesSpec] = None
    backends: Optional[list[BackendType]] = None
    regions: Optional[list[str]] = None
    availability_zones: Optional[list[str]] = None
    instance_types: Optional[list[str]] = None
    spot_policy: Optional[SpotPolicy] = None
    retry: Optional[Union[RetrySpec, bool]] = None
    max_price: Annotated[Optional[float], Field(gt=0.0)] = None
    idle_duration: IdleDuration = None
    tags: Tags = None
    backend_options: Optional[list[BackendProfileOptions]] = None
    # SSH fleets
    ssh_config: Optional[SSHParams] = None
    env: Env = {}

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        if isinstance(value, str) and ".." in value:
            parts = value.replace(" ", "").split("..")
            if len(parts) != 2:
                raise ValueError(f"invalid nodes {value!r}: use N, MIN..MAX, MIN.. or ..MAX")
            return {"min": parts[0] or None, "max": parts[1] or None}
        if isinstance(value, (str, int)):
            return {"min": value, "max": value}
        return value

    _backend_options = field_validator("backend_options")(check_backend_options)

    @property
    def is_ssh(self) -> bool:
        return self.ssh_config is not None
