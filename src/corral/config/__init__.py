"""The user-facing configuration models: every `.dstack.yml` type (task, service, dev-environment,
fleet, volume, gateway) and profiles, with dstack's grammar. Unknown keys are errors naming their path.

The package loads lazily: ``from corral.config import X`` (or ``config.X``) imports X's module on first
use, so the server does not build the configuration models' classes at start-up (they are warmed in a
thread after it; see ``parsing.warm_up``).

May import: corral.domain, pydantic, yaml.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.config.common import EntityReference, EnvSentinel
    from corral.config.fleets import FleetConfiguration, FleetNodesSpec, SSHHostParams, SSHParams
    from corral.config.gateways_volumes import (
        AnyVolumeConfiguration,
        AWSVolumeConfiguration,
        GatewayConfiguration,
        GCPVolumeConfiguration,
        KubernetesVolumeConfiguration,
        RunpodVolumeConfiguration,
        VolumeConfiguration,
    )
    from corral.config.parsing import (
        AnyConfiguration,
        AnyRunConfiguration,
        ConfigError,
        format_validation_error,
        load_configuration_file,
        parse_configuration,
        parse_fleet_configuration,
        parse_gateway_configuration,
        parse_profile,
        parse_run_configuration,
        parse_volume_configuration,
    )
    from corral.config.presets import PresetConfiguration
    from corral.config.profiles import (
        CreationPolicy,
        FleetInstanceSelector,
        InstanceHostnameSelector,
        InstanceNameSelector,
        InstanceSelector,
        Profile,
        ProfileParams,
        ProfilesConfig,
        RetrySpec,
        SpotPolicy,
        effective_profile,
    )
    from corral.config.resources import CPUSpec, DiskSpec, GPUSpec, IntRange, MemoryRange, ResourcesSpec
    from corral.config.runs import (
        DevEnvironmentConfiguration,
        InstanceMountPoint,
        PortMapping,
        RepoSpec,
        TaskConfiguration,
        VolumeMountPoint,
    )
    from corral.config.services import ServiceConfiguration

#: Each public name and the module of this package that defines it.
_WHERE = {
    "AWSVolumeConfiguration": "gateways_volumes",
    "AnyConfiguration": "parsing",
    "AnyRunConfiguration": "parsing",
    "AnyVolumeConfiguration": "gateways_volumes",
    "CPUSpec": "resources",
    "ConfigError": "parsing",
    "CreationPolicy": "profiles",
    "DevEnvironmentConfiguration": "runs",
    "DiskSpec": "resources",
    "EntityReference": "common",
    "EnvSentinel": "common",
    "FleetConfiguration": "fleets",
    "FleetInstanceSelector": "profiles",
    "FleetNodesSpec": "fleets",
    "GCPVolumeConfiguration": "gateways_volumes",
    "GPUSpec": "resources",
    "GatewayConfiguration": "gateways_volumes",
    "InstanceHostnameSelector": "profiles",
    "InstanceMountPoint": "runs",
    "InstanceNameSelector": "profiles",
    "InstanceSelector": "profiles",
    "IntRange": "resources",
    "KubernetesVolumeConfiguration": "gateways_volumes",
    "MemoryRange": "resources",
    "PortMapping": "runs",
    "PresetConfiguration": "presets",
    "Profile": "profiles",
    "ProfileParams": "profiles",
    "ProfilesConfig": "profiles",
    "RepoSpec": "runs",
    "ResourcesSpec": "resources",
    "RetrySpec": "profiles",
    "RunpodVolumeConfiguration": "gateways_volumes",
    "SSHHostParams": "fleets",
    "SSHParams": "fleets",
    "ServiceConfiguration": "services",
    "SpotPolicy": "profiles",
    "TaskConfiguration": "runs",
    "VolumeConfiguration": "gateways_volumes",
    "VolumeMountPoint": "runs",
    "effective_profile": "profiles",
    "format_validation_error": "parsing",
    "load_configuration_file": "parsing",
    "parse_configuration": "parsing",
    "parse_fleet_configuration": "parsing",
    "parse_gateway_configuration": "parsing",
    "parse_profile": "parsing",
    "parse_run_configuration": "parsing",
    "parse_volume_configuration": "parsing",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"corral.config.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AWSVolumeConfiguration",
    "AnyConfiguration",
    "AnyRunConfiguration",
    "AnyVolumeConfiguration",
    "CPUSpec",
    "ConfigError",
    "CreationPolicy",
    "DevEnvironmentConfiguration",
    "DiskSpec",
    "EntityReference",
    "EnvSentinel",
    "FleetConfiguration",
    "FleetInstanceSelector",
    "FleetNodesSpec",
    "GCPVolumeConfiguration",
    "GPUSpec",
    "GatewayConfiguration",
    "InstanceHostnameSelector",
    "InstanceMountPoint",
    "InstanceNameSelector",
    "InstanceSelector",
    "IntRange",
    "KubernetesVolumeConfiguration",
    "MemoryRange",
    "PortMapping",
    "PresetConfiguration",
    "Profile",
    "ProfileParams",
    "ProfilesConfig",
    "RepoSpec",
    "ResourcesSpec",
    "RetrySpec",
    "RunpodVolumeConfiguration",
    "SSHHostParams",
    "SSHParams",
    "ServiceConfiguration",
    "SpotPolicy",
    "TaskConfiguration",
    "VolumeConfiguration",
    "VolumeMountPoint",
    "effective_profile",
    "format_validation_error",
    "load_configuration_file",
    "parse_configuration",
    "parse_fleet_configuration",
    "parse_gateway_configuration",
    "parse_profile",
    "parse_run_configuration",
    "parse_volume_configuration",
]
