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
from corral.backends.aws.session import AWSProject
from corral.services.accounts import generate_ssh_keypair
from corral.services.errors import ServiceError
from corral.store import accounts as account_store
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
    """The credentials work (STS GetCallerIdentity in the first region); else ``BackendInvalid``. With
    ``public_ips: false``, also whether the VPC of each region routes to a NAT gateway: the warnings (also
    logged) say where instances will have no outbound internet."""
    region = (doc.get("regions") or [CHECK_REGION])[0]
    try:
        await asyncio.to_thread(ec2.check_creds, _creds(doc), region)
    except ImportError:
        raise BackendInvalid(
            "The aws backend needs boto3: install corral with its aws extra (pip install 'corral[aws]')"
        )
    except ec2.AWSError as e:
        raise BackendInvalid(f"Invalid credentials (creds): AWS refused them: {e}") from None
    if doc.get("public_ips") is not False:
        return []
    warnings = []
    for r in doc.get("regions") or [CHECK_REGION]:
        warning = await asyncio.to_thread(_egress_warning, doc, r)
        if warning:
            log.warning("%s", warning, extra={"event": "aws_no_egress", "region": r})
            warnings.append(warning)
    return warnings


def _egress_warning(doc: dict[str, Any], region: str) -> str | None:
    """Why instances without public IPs in ``region`` will have no outbound internet (None: a NAT gateway)."""
    what = "aws backend (public_ips: false)"
    try:
        client = ec2.client(_creds(doc), region)
        vpc = ec2.vpc_id(client, region, doc)
        if ec2.nat_egress(client, vpc):
            return None
    except ec2.AWSError as e:
        return f"{what}: could not check the outbound route of {region}'s VPC: {e}"
    return (
        f"{what}: no subnet of VPC {vpc} in {region} routes 0.0.0.0/0 to a NAT gateway, so instances launched "
        "there will have no outbound internet (corral still reaches them at their private IPs; jobs that pull "
        "images or packages will fail). Add a NAT gateway route, or set public_ips: true"
    )


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
