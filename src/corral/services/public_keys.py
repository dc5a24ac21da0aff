"""Users' public SSH keys, as dstack 0.22.5's ``users/public_keys/list|add|delete`` have them: each caller
manages only their own; a key is OpenSSH's one-line format, checked by parsing and by ``ssh-keygen -l``;
its fingerprint is OpenSSH's ``SHA256:...``; one key per user and fingerprint."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import struct
import time
import uuid
from typing import Any

from corral.domain.records import UserRec
from corral.services.errors import ResourceExists, ServiceError
from corral.store import public_keys as store
from corral.store.db import Database

SUPPORTED_KEY_TYPES = (
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-ed25519",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "sk-ssh-ed25519@openssh.com",
)
INVALID = "Invalid public key, must be in OpenSSH public key format"


def parse_public_key(key: str) -> tuple[str, bytes, str | None]:
    """(type, wire-format blob, comment) of an OpenSSH public key line; :class:`ServiceError` when it is not
    one (dstack's messages)."""
    parts = key.strip().split(None, 2)
    if len(parts) < 2:
        raise ServiceError(INVALID)
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ServiceError(INVALID) from None
    if len(blob) < 4:
        raise ServiceError(INVALID)
    (n,) = struct.unpack(">I", blob[:4])
    if parts[0] != blob[4 : 4 + n].decode("ascii", "replace"):
        raise ServiceError(INVALID)
    if parts[0] not in SUPPORTED_KEY_TYPES:
        raise ServiceError(f"Unsupported key type: {parts[0]}")
    return parts[0], blob, (parts[2].strip() if len(parts) > 2 else None) or None


def fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


async def _ssh_keygen_accepts(key: str) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec(
            "ssh-keygen",
            "-l",
            "-f",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        raise ServiceError("Failed to validate the key. Try later") from None
    try:
        await asyncio.wait_for(proc.communicate(key.encode()), timeout=3)
    except asyncio.TimeoutError:
        proc.kill()
        raise ServiceError("Failed to validate the key. Try later") from None
    return proc.returncode == 0


def info(rec: store.PublicKeyRec) -> dict[str, Any]:
    """dstack's ``PublicKeyInfo``."""
    from corral.services.serialize import iso

    return {
        "id": rec.id,
        "added_at": iso(rec.created_at),
        "name": rec.name,
        "type": rec.type,
        "fingerprint": rec.fingerprint,
    }


async def list_keys(db: Database, user: UserRec) -> list[dict[str, Any]]:
    async with db.read() as conn:
        return [info(k) for k in await store.list_keys(conn, user.id)]


async def add_key(db: Database, user: UserRec, key: str, name: str | None) -> dict[str, Any]:
    type_, blob, comment = parse_public_key(key)
    if not await _ssh_keygen_accepts(key):
        raise ServiceError(INVALID)
    rec = store.PublicKeyRec(
        id=str(uuid.uuid4()),
        user_id=user.id,
        created_at=round(time.time(), 6),
        name=(name or comment or hashlib.md5(blob).hexdigest())[:100],
        type=type_,
        fingerprint=fingerprint(blob),
        key=key.strip(),
    )
    async with db.write() as conn:
        if await store.has_fingerprint(conn, user.id, rec.fingerprint):
            raise ResourceExists("Public key already exists")
        await store.insert_key(conn, rec)
    return info(rec)


async def delete_keys(db: Database, user: UserRec, ids: list[str]) -> None:
    async with db.write() as conn:
        await store.delete_keys(conn, user.id, ids)
