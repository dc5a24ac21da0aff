"""The `gateway` and `volume` types. Volumes are discriminated by `backend` (aws, gcp, runpod,
kubernetes, daytona, lium), each with its own fields; `VolumeConfiguration` is their union.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from corral.config.common import BackendType, CoreModel, IdleDuration, Memory, Tags


class LetsEncryptGatewayCertificate(CoreModel):
    type: Literal["lets-encrypt"] = "lets-encrypt"


class ACMGatewayCertificate(CoreModel):
    type: Literal["acm"] = "acm"
    arn: str


class GCPCertificateManagerGatewayCertificate(CoreModel):
    type: Literal["gcp-cm"] = "gcp-cm"
    name: str


AnyGatewayCertificate = Union[
    LetsEncryptGatewayCertificate, ACMGatewayCertificate, GCPCertificateManagerGatewayCertificate
]


class ALBGatewayLoadBalancer(CoreModel):
    type: Literal["alb"] = "alb"


class GatewayConfiguration(CoreModel):
    type: Literal["gateway"] = "gateway"
    name: Optional[str] = None
    default: Optional[bool] = None
    backend: BackendType
    region: str
    instance_type: Annotated[Optional[str], Field(min_length=1)] = None
    domain: Optional[str] = None
    public_ip: bool = True
    load_balancer: Annotated[Optional[ALBGatewayLoadBalancer], Field(discriminator="type")] = None
    certificate: Annotated[Optional[AnyGatewayCertificate], Field(discriminator="type")] = Field(
        default_factory=LetsEncryptGatewayCertificate
    )
    replicas: Annotated[Optional[int], Field(ge=1)] = None
    tags: Tags = None


class VolumeConfiguration(CoreModel):
    """The base of every volume type (use `isinstance(conf, VolumeConfiguration)`)."""

    type: Literal["volume"] = "volume"
    name: Optional[str] = None
    auto_cleanup_duration: IdleDuration = None
    tags: Tags = None

    @property
    def external_volume_id(self) -> Optional[str]:
        """The user-given id of an existing volume to register, if any."""
        return getattr(self, "volume_id", None)


class AWSVolumeConfiguration(VolumeConfiguration):
    backend: Literal[BackendType.AWS] = BackendType.AWS
    size: Optional[Memory] = None
    volume_id: Optional[str] = None
    region: str
    availability_zone: Optional[str] = None


class GCPVolumeConfiguration(VolumeConfiguration):
    backend: Literal[BackendType.GCP] = BackendType.GCP
    size: Optional[Memory] = None
    volume_id: Optional[str] = None
    region: str
    availability_zone: Optional[str] = None


class RunpodVolumeConfiguration(VolumeConfiguration):
    backend: Literal[BackendType.RUNPOD] = BackendType.RUNPOD
    size: Optional[Memory] = None
    volume_id: Optional[str] = None
    region: str
    availability_zone: Annotated[Optional[str], Field(exclude=True)] = None


class KubernetesVolumeConfiguration(VolumeConfiguration):
    backend: Literal[BackendType.KUBERNETES] = BackendType.KUBERNETES
    size: Optional[Memory] = None
    region: str = ""
    claim_name: Optional[str] = None
    storage_class_name: Optional[str] = None
    access_modes: list[str] = ["ReadWriteOnce"]
    read_only: bool = False

    @property
    def external_volume_id(self) -> Optional[str]:
        return self.claim_name


class DaytonaVolumeConfiguration(VolumeConfiguration):
    backend: Literal[BackendType.DAYTONA] = BackendType.DAYTONA
    volume_id: Optional[str] = None


class LiumVolumeConfiguration(VolumeConfiguration):
    backend: Literal[BackendType.LIUM] = BackendType.LIUM
    volume_id: Optional[str] = None


AnyVolumeConfiguration = Union[
    AWSVolumeConfiguration,
    GCPVolumeConfiguration,
    RunpodVolumeConfiguration,
    KubernetesVolumeConfiguration,
    DaytonaVolumeConfiguration,
    LiumVolumeConfiguration,
]
VOLUME_MODELS: dict[str, type[VolumeConfiguration]] = {
    "aws": AWSVolumeConfiguration,
    "gcp": GCPVolumeConfiguration,
    "runpod": RunpodVolumeConfiguration,
    "kubernetes": KubernetesVolumeConfiguration,
    "daytona": DaytonaVolumeConfiguration,
    "lium": LiumVolumeConfiguration,
}
