"""SSH fleets' private keys at rest: sealed wherever they are stored, opened only to make a connection.

The keys a user gives in an SSH fleet (``ssh_key`` of ``ssh_config``, of hosts, of proxy jumps) are
stored in the fleet's spec and in each host instance's connection document (``agent`` JSON). Both are
written with every private key sealed by the server's cipher (:mod:`corral.store.encryption`, AES-GCM:
``enc:v1:<key id>:...``); the SSH backend opens a key (:class:`KeyOpener`) right before it logs in
with it, and no API answer carries one (``domain.fleets.without_ssh_keys``).

Rows written before keys were sealed hold them in clear: a stored key without the ``enc:v1:`` prefix is
used as it is, and :func:`corral.workers.ssh_keys.seal_stored_keys` seals such rows at the next start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.domain.ssh_keys import map_connection_keys, map_spec_keys
from corral.store.encryption import Cipher, EncryptionError

#: What :meth:`Cipher.encrypt` writes first (``store/encryption.py``'s format; a test checks they agree).
SEALED_PREFIX = "enc:v1:"


class KeyUnreadable(ValueError):
    """A stored private key cannot be opened by this server; the message says why and what to do."""


def is_sealed(stored: str) -> bool:
    return stored.startswith(SEALED_PREFIX)


def seal(cipher: Cipher, key: str) -> str:
    """``key`` sealed for storage (a key already sealed is kept as it is)."""
    return key if is_sealed(key) else cipher.encrypt(key)


def seal_spec(cipher: Cipher, spec: dict[str, Any]) -> dict[str, Any]:
    """A fleet spec as stored: every private key in it sealed (a cloud fleet's spec is returned as is)."""
    return map_spec_keys(spec, lambda key: seal(cipher, key))


def seal_connection(cipher: Cipher, connection: dict[str, Any]) -> dict[str, Any]:
    """A host's connection document as stored: its key and its proxy jump's sealed."""
    return map_connection_keys(connection, lambda key: seal(cipher, key))


class KeyOpener:
    """Opens stored private keys with the server's cipher, resolved on first need (a key in clear --
    a row from before keys were sealed -- needs none). Without a cipher, a sealed key cannot be opened."""

    def __init__(self, cipher: Callable[[], Cipher] | None = None, what: str = "private key") -> None:
        self._cipher = cipher
        self._what = what

    def named(self, what: str) -> KeyOpener:
        """The same opener for another kind of stored secret (named so in its errors)."""
        return KeyOpener(self._cipher, what)

    def __call__(self, stored: str) -> str:
        if not is_sealed(stored):
            return stored
        if self._cipher is None:
            raise KeyUnreadable(f"the stored {self._what} is encrypted and this server was given no key to open it")
        try:
            return self._cipher().decrypt(stored)
        except EncryptionError as e:
            raise KeyUnreadable(
                f"the stored {self._what} cannot be decrypted: {e} (was CORRAL_SERVER_ENCRYPTION_KEY or the "
                "server's encryption.key changed? Restore it, or delete the fleet and apply it again)"
            ) from None


def new_keypair(comment: str) -> tuple[str, str]:
    """A fresh ed25519 key pair (the private key in OpenSSH's format, the public one as ``authorized_keys``
    takes it, with ``comment``): a gateway's own login key, sealed by its caller before it is stored."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} {comment}"
