"""Noticing a CA that lost its state: ``register_if_forgotten`` asks pebble with RFC 8555 §7.3.1's
``onlyReturnExisting`` whether it still knows the account, registers again only when pebble (restarted: a new root,
every account forgotten) says it does not, and fails with the setting named when the CA cannot be asked."""

from __future__ import annotations

import logging
import pathlib

import pytest
from acme_web import start_responder

from corral.acme import AcmeClient, AcmeError
from pebble_harness import PebbleLab


async def test_a_known_account_is_kept_and_one_the_restarted_ca_forgot_is_registered_again(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.acme.client")
    own = PebbleLab(tmp_path_factory.mktemp("pebble-check")).start()
    try:
        web = start_responder(own, "web", tmp_path)
        own.set_default_ipv4(web.host.ip)
        client = AcmeClient(own.directory_url, ca_bundle=own.ca_bundle)
        await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)
        account = client.account_url
        assert account is not None
        assert await client.register_if_forgotten() is False
        assert client.account_url == account
        # a server that started again: its key given back, no account URL yet; the lookup finds it
        again = AcmeClient(own.directory_url, ca_bundle=own.ca_bundle, account_key_pem=client.account_key_pem)
        assert await again.register_if_forgotten() is False
        assert again.account_url == account

        own.restart()  # a new root; every account forgotten
        assert await client.register_if_forgotten() is True
        assert client.account_url is not None and client.account_url != account
        assert f"{own.directory_url} no longer knows account {account}" in caplog.text
        assert await client.register_if_forgotten() is False  # registered: known again
        caplog.clear()
        await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)
        assert "no longer knows" not in caplog.text  # the issuance needed no registration of its own
    finally:
        own.stop()


async def test_a_ca_that_cannot_be_asked_is_an_error_naming_the_setting(lab: PebbleLab) -> None:
    client = AcmeClient(f"https://{lab.bridge_ip}:1/dir", ca_bundle=lab.ca_bundle)
    with pytest.raises(AcmeError) as e:
        await client.register_if_forgotten()
    assert e.value.kind == "unreachable" and "CORRAL_ACME_SERVER" in e.value.message
    assert client.account_url is None
