"""Users' and projects' credentials at rest: what is written for a token or a generated private key,
and how it is read back for the one who may see it.

A user's token is stored twice, and never in clear: as its SHA-256 (``token_hash``, the lookup key of
every request: tokens are random, so the hash cannot be reversed) and sealed with the server key
(``token``, AES-GCM: :mod:`corral.store.encryption`), so that ``users/get_my_user``, ``users/get_user``
and ``users/refresh_token`` can return it to its owner or an admin as dstack does. Generated SSH private
keys (users' and projects') are stored sealed. Records (``UserRec``, ``ProjectRec``) carry the stored
form; :func:`revealed` opens a user's for an answer. Rows from before values were sealed hold them in
clear: they are read as they are, and ``workers/seal_at_rest.py`` seals them at the next start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from corral.domain.records import UserRec
from corral.store.accounts import token_hash
from corral.store.encryption import Cipher, open_sealed, seal


def token_values(cipher: Cipher, token: str) -> dict[str, Any]:
    """The columns a new ``token`` is written to: its hash (lookup) and its sealed copy."""
    return {"token": seal(cipher, token), "token_hash": token_hash(token)}


def sealed_key(cipher: Cipher, private_key: str | None) -> str | None:
    return None if private_key is None else seal(cipher, private_key)


def revealed(cipher: Callable[[], Cipher], user: UserRec) -> UserRec:
    """``user`` with its token and private key in clear, for an answer to the user or an admin."""
    key = user.ssh_private_key
    return dataclasses.replace(
        user,
        token=open_sealed(cipher, user.token),
        ssh_private_key=open_sealed(cipher, key) if key is not None else None,
    )
