"""Encryption at rest of what must not sit in the database in clear: users' tokens and generated SSH
private keys, projects' SSH private keys, agents' tokens, SSH fleets' keys, repo credentials, runs'
registry passwords (:mod:`corral.store.run_secrets`).

AES-256-GCM with the server key. The key is ``CORRAL_SERVER_ENCRYPTION_KEY`` (base64 of 32 bytes; every
replica of a Postgres deployment must be given the same one), or the file that
``CORRAL_SERVER_ENCRYPTION_KEY_FILE`` names (made on first use when missing), or, when neither is set, a
key generated on first use and kept in ``<state dir>/encryption.key``: outside ``data/``, where the
database is, so that a copy of the data directory does not carry the key that opens it (a key an older
corral made in ``data/encryption.key`` stays in use until moved; the server says how at start). A key
file is written with mode 0600. A stored value reads ``enc:v1:<key id>:<base64(nonce | ciphertext)>``;
the key id (a hash prefix of the key) lets a value encrypted under another key fail with a message that
says so instead of a bare decryption error. A stored value without the prefix is a row written before the
value was sealed (:func:`open_sealed` returns it as it is; the start-up pass of ``workers/seal_at_rest.py``
seals it).

``cryptography`` is imported on the first encryption or decryption, not at start-up nor after it (its
AES-GCM is about 7 MiB of an idle server's resident memory): checking the key at start needs only its
length, and a start over existing state decrypts nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from corral.settings import Settings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_PREFIX = "enc:v1:"
#: What :meth:`Cipher.encrypt` writes first.
SEALED_PREFIX = _PREFIX


class EncryptionError(RuntimeError):
    """A stored value cannot be decrypted with this server's key; the message says why."""


class Cipher:
    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise EncryptionError("the encryption key must be 32 bytes")
        self._key = key
        self._aead_: AESGCM | None = None
        self.key_id = hashlib.sha256(key).hexdigest()[:8]

    @property
    def _aead(self) -> AESGCM:
        if self._aead_ is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._aead_ = AESGCM(self._key)
        return self._aead_

    def encrypt(self, plaintext: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), None)
        return f"{_PREFIX}{self.key_id}:{base64.b64encode(nonce + sealed).decode()}"

    def decrypt(self, stored: str) -> str:
        if not stored.startswith(_PREFIX):
            raise EncryptionError("the stored value is not encrypted by corral")
        key_id, _, payload = stored[len(_PREFIX) :].partition(":")
        if key_id != self.key_id:
            raise EncryptionError(
                f"the value was encrypted with another server key (id {key_id}, this server's is {self.key_id})"
            )
        from cryptography.exceptions import InvalidTag

        try:
            raw = base64.b64decode(payload, validate=True)
            return self._aead.decrypt(raw[:12], raw[12:], None).decode()
        except (binascii.Error, InvalidTag, UnicodeDecodeError, ValueError):
            raise EncryptionError("the stored value is corrupt") from None


def is_sealed(stored: str) -> bool:
    return stored.startswith(_PREFIX)


def key_id_of(stored: str) -> str | None:
    """The id of the key a stored value was sealed with (None: it is in clear)."""
    return stored[len(_PREFIX) :].partition(":")[0] if is_sealed(stored) else None


def seal(cipher: Cipher, value: str) -> str:
    """``value`` sealed for storage (a value already sealed is kept as it is)."""
    return value if is_sealed(value) else cipher.encrypt(value)


def open_sealed(cipher: Callable[[], Cipher], stored: str) -> str:
    """A stored value in clear: decrypted when sealed, as it is when a row from before holds it in clear
    (the cipher is resolved only when needed)."""
    return cipher().decrypt(stored) if is_sealed(stored) else stored


_lock = threading.Lock()
_cache: dict[tuple[str | None, str], Cipher] = {}


def _load_or_create(path: Path) -> bytes:
    try:
        raw = path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        raw = base64.b64encode(os.urandom(32)).decode()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            raw = path.read_text().strip()
        else:
            with os.fdopen(fd, "w") as f:
                f.write(raw + "\n")
    return _decode_key(raw, str(path))


def _decode_key(raw: str, where: str) -> bytes:
    try:
        key = base64.b64decode(raw, validate=True)
    except binascii.Error:
        key = b""
    if len(key) != 32:
        raise EncryptionError(f"{where} must hold a base64-encoded 32-byte key")
    return key


def cipher_for(settings: Settings) -> Cipher:
    """The server's cipher (built once per key)."""
    # the key file is looked for (a stat, every apply) only where no key is given
    cache_key = (settings.encryption_key, "" if settings.encryption_key else str(settings.encryption_key_file))
    with _lock:
        found = _cache.get(cache_key)
        if found is None:
            if settings.encryption_key:
                key = _decode_key(settings.encryption_key, "CORRAL_SERVER_ENCRYPTION_KEY")
            else:
                key = _load_or_create(settings.encryption_key_file)
            found = _cache[cache_key] = Cipher(key)
        return found


def key_location(settings: Settings) -> str:
    """Where this server's key comes from, as the server and its commands say it."""
    return "CORRAL_SERVER_ENCRYPTION_KEY" if settings.encryption_key else str(settings.encryption_key_file)


def key_in_data_dir(settings: Settings) -> bool:
    """The key is a file an older corral made beside the database (a copy of ``data/`` would carry both)."""
    return not settings.encryption_key and settings.encryption_key_file == settings.legacy_encryption_key_file


def has_key(settings: Settings) -> bool:
    """A key is given or its file exists (:func:`cipher_for` would otherwise make a new one)."""
    return bool(settings.encryption_key) or settings.encryption_key_file.exists()
