"""The ``type: aws`` backend block, as dstack 0.22.5 writes it in ``server/config.yml`` and the backends API:
credentials (``access_key`` or ``default``), regions, VPCs, public IPs, tags, AMIs, an IAM instance profile.

Pydantic only (a ``config`` module); the AWS backend reads the stored, validated document.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.domain import aws_tags

_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class AWSOSImage(_Strict):
    name: str = Field(min_length=1, max_length=128)
    owner: str = Field(default="self", pattern=r"^(\d{12}|self)$")
    user: str = Field(min_length=1, max_length=64)


class AWSOSImageConfig(_Strict):
    cpu: Optional[AWSOSImage] = None
    nvidia: Optional[AWSOSImage] = None


class AWSAccessKeyCreds(_Strict):
    type: Literal["access_key"] = "access_key"
    access_key: str = Field(min_length=1, max_length=128)
    secret_key: str = Field(min_length=1, max_length=1024)


class AWSDefaultCreds(_Strict):
    type: Literal["default"] = "default"


AnyAWSCreds = Annotated[Union[AWSAccessKeyCreds, AWSDefaultCreds], Field(discriminator="type")]


class AWSBackendConfig(_Strict):
    type: Literal["aws"] = "aws"
    regions: Optional[list[str]] = Field(default=None, min_length=1, max_length=64)
    vpc_name: Optional[str] = Field(default=None, min_length=1, max_length=255)
    vpc_ids: Optional[dict[str, str]] = None
    default_vpcs: Optional[bool] = None
    public_ips: Optional[bool] = None
    iam_instance_profile: Optional[str] = Field(default=None, min_length=1, max_length=128)
    tags: Optional[dict[str, str]] = None
    os_images: Optional[AWSOSImageConfig] = None
    experimental_instance_types: Optional[list[str]] = None
    creds: AnyAWSCreds

    @field_validator("regions")
    @classmethod
    def _regions(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        for r in v or []:
            if not _REGION.match(r):
                raise ValueError(f"{r!r} is not an AWS region name (e.g. us-east-1)")
        return v

    @field_validator("vpc_ids")
    @classmethod
    def _vpc_ids(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        for region, vpc in (v or {}).items():
            if not _REGION.match(region) or not vpc.startswith("vpc-"):
                raise ValueError(f"{region}: {vpc!r}: give region names and VPC ids (vpc-...)")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        why = aws_tags.problem(v or {}, "tags")
        if why is not None:
            raise ValueError(why)
        return v
