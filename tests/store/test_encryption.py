"""Encryption of repo credentials at rest: round trip, the key file, and clear errors for a wrong key."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from corral.server import prepare
from corral.settings import Settings
from corral.store.encryption import Cipher, EncryptionError, cipher_for
from server_harness import make_settings


def test_round_trip_and_wrong_key() -> None:
    a, b = Cipher(os.urandom(32)), Cipher(os.urandom(32))
    sealed = a.encrypt('{"oauth_token": "secret"}')
    assert "secret" not in sealed and a.decrypt(sealed) == '{"oauth_token": "secret"}'
    assert a.encrypt("x") != a.encrypt("x")  # a fresh nonce each time
    with pytest.raises(EncryptionError, match="another server key"):
        b.decrypt(sealed)
    with pytest.raises(EncryptionError, match="corrupt"):
        a.decrypt(sealed[:-4] + "AAAA")
    with pytest.raises(EncryptionError, match="not encrypted"):
        a.decrypt("plain")


def test_key_from_the_environment_or_a_private_file(tmp_path: Path) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    from_env = cipher_for(
        Settings.from_env({"CORRAL_SERVER_DIR": str(tmp_path / "a"), "CORRAL_SERVER_ENCRYPTION_KEY": key})
    )
    assert from_env.key_id == Cipher(base64.b64decode(key)).key_id
    assert not (tmp_path / "a" / "data" / "encryption.key").exists()
    settings = Settings.from_env({"CORRAL_SERVER_DIR": str(tmp_path / "b")})
    made = cipher_for(settings)
    assert settings.encryption_key_file.stat().st_mode & 0o777 == 0o600
    assert Cipher(base64.b64decode(settings.encryption_key_file.read_text())).key_id == made.key_id


async def test_a_bad_key_stops_the_server_at_start(tmp_path: Path) -> None:
    from corral.config.server_config import ServerConfigError

    with pytest.raises(ServerConfigError, match="CORRAL_SERVER_ENCRYPTION_KEY must hold a base64-encoded 32-byte key"):
        await prepare(make_settings(tmp_path, encryption_key="too-short"))
