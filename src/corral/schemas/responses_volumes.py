"""Response bodies of the REST API for network volumes, dstack 0.22.5's shapes: pydantic models for the
OpenAPI document (see :mod:`corral.schemas.responses`, whose base model they share and whose
:func:`~corral.schemas.responses.model` finds them by name). Imports: ``domain`` and pydantic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Optional
from uuid import UUID

from pydantic import RootModel

from corral.schemas.responses import AnyObject, Out


class VolumeInstance(Out):
    name: str
    fleet_name: Optional[str]
    instance_num: int
    instance_id: Optional[str]


class VolumeAttachment(Out):
    instance: VolumeInstance
    attachment_data: Optional[AnyObject]


class Volume(Out):
    """dstack's ``Volume``: ``provisioning_data`` is its ``VolumeProvisioningData`` once the cloud made it."""

    id: UUID
    name: str
    user: str
    project_name: str
    configuration: AnyObject
    external: bool
    created_at: datetime
    last_processed_at: datetime
    status: Literal["submitted", "provisioning", "active", "failed"]
    status_message: Optional[str]
    deleted: bool
    deleted_at: Optional[datetime]
    volume_id: Optional[str]
    provisioning_data: Optional[AnyObject]
    cost: float
    attachments: Optional[list[VolumeAttachment]]
    attachment_data: Optional[AnyObject]


class VolumeList(RootModel[list[Volume]]):
    pass
