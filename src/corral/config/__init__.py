"""The user-facing configuration models: every `.dstack.yml` type (task, service, dev-environment,
fleet, volume, gateway) and profiles, with dstack's grammar. Unknown keys are errors naming their path.

May import: corral.domain, pydantic, yaml.
"""

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
