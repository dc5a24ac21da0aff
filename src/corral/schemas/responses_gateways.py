"""Response bodies of the REST API for gateways, dstack 0.22.5's shapes (``core/models/gateways.py``):
pydantic models for the OpenAPI document (see :mod:`corral.schemas.responses`, whose base model they share
and whose :func:`~corral.schemas.responses.model` finds them by name). Imports: ``domain`` and pydantic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Optional
from uuid import UUID

from pydantic import RootModel

from corral.domain.statuses import GatewayStatus
from corral.schemas.responses import AnyObject, Out


class GatewayReplica(Out):
    """One host of a gateway: corral's gateway has one, the SSH fleet host it is held on."""

    hostname: Optional[str]
    replica_num: int
    backend: str
    region: Optional[str]
    created_at: datetime
    status: Literal["submitted", "provisioning", "running", "terminating", "terminated"]
    status_message: Optional[str]


class Gateway(Out):
    """dstack's ``Gateway``; ``backend``, ``region``, ``ip_address`` and ``instance_id`` are always null (kept for
    clients before dstack 0.20.25, which echo them back)."""

    id: UUID
    name: str
    project_name: str
    configuration: AnyObject
    created_at: datetime
    status: GatewayStatus
    status_message: Optional[str]
    hostname: Optional[str]
    wildcard_domain: Optional[str]
    default: bool
    replicas: list[GatewayReplica]
    backend: Optional[str]
    region: Optional[str]
    ip_address: Optional[str]
    instance_id: Optional[str]


class GatewayList(RootModel[list[Gateway]]):
    pass


class GatewaySpec(Out):
    configuration: AnyObject
    configuration_path: Optional[str]


class GatewayPlan(Out):
    """dstack's ``GatewayPlan``: ``update`` when a gateway of that name exists and only ``domain``,
    ``default`` or ``replicas`` change, else ``create``."""

    project_name: str
    user: str
    spec: GatewaySpec
    effective_spec: Optional[GatewaySpec]
    current_resource: Optional[Gateway]
    action: Literal["create", "update"]
