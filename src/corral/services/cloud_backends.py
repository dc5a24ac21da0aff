"""Cloud backends of a project (``type: aws``) at rest and in use: credentials checked when a backend is
added, sealed in the project's stored backends (never returned in clear), opened for the AWS backend's
launches; and this server's id, the tag that marks the cloud instances it owns.

May import: domain, config, store, backends (the AWS backend's EC2 calls and its project record).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from corral.backends.aws import ec2
from corral.backends.aws.session import AWSProject, FleetOptions
from corral.domain.documents import spec_configuration
from corral.domain.records import InstanceRec
from corral.services.accounts import generate_ssh_keypair
from corral.services.errors import ServiceError
from corral.store import accounts as account_store
from corral.store import fleets as fleet_store
from corral.store.db import Database
from corral.store.encryption import Cipher, open_sealed, seal
from corral.store.server_state import get_state, set_state

log = logging.getLogger("corral.aws")

SERVER_ID_KEY = "server_id"
#: The region credentials are checked in when the backend names none.
CHECK_REGION = "us-east-1"
#: The fields of a backend's ``creds`` that are sealed at rest.
SECRET_FIELDS = ("access_key", "secret_key")


class BackendInvalid(ServiceError):
    """The backend's configuration or credentials do not work (400, the message names the field)."""

    code = "invalid_credentials"


def sealed(cipher: Cipher, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as stored: its credentials sealed."""
    out = copy.deepcopy(doc)
    creds = out.get("creds")
    if isinstance(creds, dict):
        for k in SECRET_FIELDS:
            if isinstance(creds.get(k), str):
                creds[k] = seal(cipher, creds[k])
    return out


def opened(cipher: Callable[[], Cipher], doc: dict[str, Any]) -> dict[str, Any]:
    """A stored ``doc`` with its credentials in clear (for the backend's own calls only)."""
    out = copy.deepcopy(doc)
    creds = out.get("creds")
    if isinstance(creds, dict):
        for k in SECRET_FIELDS:
            if isinstance(creds.get(k), str):
                creds[k] = open_sealed(cipher, creds[k])
    return out


def _creds(doc: dict[str, Any]) -> ec2.Creds:
    c = doc.get("creds") or {}
    return ec2.Creds(c.get("access_key"), c.get("secret_key")) if c.get("type") == "access_key" else ec2.Creds()


async def check_aws(doc: dict[str, Any]) -> list[str]:
    """The credentials work (STS GetCallerIdentity in the first region); else ``BackendInvalid``. Then, in each
    region, what a launch would find wrong before any launch: no VPC, no usable subnet in a custom VPC
    (``vpc_name``, ``vpc_ids``: by route table, for ``public_ips``), no AMI matching ``os_images``
    (``BackendInvalid`` naming the field). EC2 errors while checking are warnings (also logged)."""
    region = (doc.get("regions") or [CHECK_REGION])[0]
    try:
        await asyncio.to_thread(ec2.check_creds, _creds(doc), region)
    except ImportError:
        raise BackendInvalid(
            "The aws backend needs boto3: install corral with its aws extra (pip install 'corral[aws]')"
        )
    except ec2.AWSError as e:
        raise BackendInvalid(f"Invalid credentials (creds): AWS refused them: {e}") from None
    if not (doc.get("vpc_name") or doc.get("vpc_ids") or doc.get("os_images") or doc.get("default_vpcs") is False):
        return []  # the default VPC and images: nothing to check before a launch
    warnings = []
    for r in doc.get("regions") or [CHECK_REGION]:
        problem, warning = await asyncio.to_thread(_region_problem, doc, r)
        if problem:
            raise BackendInvalid(f"aws backend: {problem}")
        if warning:
            log.warning("%s", warning, extra={"event": "aws_check_failed", "region": r})
            warnings.append(warning)
    return warnings


def _region_problem(doc: dict[str, Any], region: str) -> tuple[str | None, str | None]:
    """What a launch in ``region`` would find wrong in ``doc`` (its VPC, subnets, ``os_images``), and a warning
    when EC2 could not be asked."""
    public_ips = doc.get("public_ips") is not False
    try:
        client = ec2.client(_creds(doc), region)
        where = ec2.vpc(client, region, doc)
        if not ec2.subnets_by_zone(client, where, public_ips):
            return ec2.no_subnet(where, region, public_ips), None
        for kind in ("cpu", "nvidia"):
            if (doc.get("os_images") or {}).get(kind):
                ec2.image(client, doc, kind == "nvidia")
    except ec2.AWSError as e:
        if not e.code or e.code == "InvalidAMIID.NotFound":  # corral's own finding: no VPC, no such image
            return f"{region}: {e}", None
        return None, f"aws backend: could not check {region}'s VPC and images: {e}"
    return None, None


async def server_id(db: Database) -> str:
    """This server's id (one per database, shared by its replicas), made on first use."""
    async with db.read() as conn:
        found = await get_state(conn, SERVER_ID_KEY)
    if found:
        return found
    async with db.write() as conn:
        found = await get_state(conn, SERVER_ID_KEY)
        if found:
            return found
        new = uuid.uuid4().hex
        await set_state(conn, SERVER_ID_KEY, new, time.time())
        return new


def project_loader(db: Database, cipher: Callable[[], Cipher]) -> Callable[[str], Awaitable[AWSProject | None]]:
    """Reads a project's ``type: aws`` backend (credentials opened) and SSH key, for a launch."""

    async def load(name: str) -> AWSProject | None:
        async with db.read() as conn:
            project = await account_store.get_project(conn, name)
        doc = next((b for b in project.backends if b.get("type") == "aws"), None) if project else None
        if project is None or doc is None:
            return None
        if not project.ssh_public_key or not project.ssh_private_key:  # a project made before keys were
            priv, pub = await asyncio.to_thread(generate_ssh_keypair)
            if priv is None or pub is None:
                raise BackendInvalid("ssh-keygen is missing: the aws backend needs it for the project's SSH key")
            async with db.write() as conn:
                await account_store.set_project_ssh_key_if_none(conn, project.id, seal(cipher(), priv), pub)
                project = await account_store.get_project(conn, name)
            if project is None or not project.ssh_public_key or not project.ssh_private_key:
                return None
        return AWSProject(project.name, opened(cipher, doc), project.ssh_public_key, project.ssh_private_key)

    return load


def fleet_loader(db: Database) -> Callable[[InstanceRec], Awaitable[FleetOptions]]:
    """Reads what an instance's fleet asks of its launch: ``availability_zones`` and ``tags``."""

    async def load(instance: InstanceRec) -> FleetOptions:
        if not instance.fleet_id:
            return FleetOptions()
        async with db.read() as conn:
            fleet = await fleet_store.get_fleet(conn, instance.project_id, fleet_id=instance.fleet_id)
        conf = spec_configuration(fleet.spec if fleet is not None else None)
        zones = conf.get("availability_zones")
        tags = {str(k): str(v) for k, v in (conf.get("tags") or {}).items()}
        return FleetOptions(frozenset(str(z) for z in zones) if zones else None, tags)

    return load
