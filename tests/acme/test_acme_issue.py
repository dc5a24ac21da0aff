"""Issuing certificates from a real ACME CA (pebble) by HTTP-01, the token served on port 80 of a host in a
network namespace; each chain checked over a TLS handshake against pebble's root only, and refused by the
system store (the negative control)."""

from __future__ import annotations

import logging
import pathlib
import ssl

import pytest
from acme_tls import handshake, trusting
from acme_web import Responder, start_responder
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from corral.acme import AcmeClient, Issued
from pebble_harness import PebbleLab


def leaf_of(issued: Issued) -> x509.Certificate:
    return x509.load_pem_x509_certificates(issued.fullchain_pem.encode())[0]


async def test_issues_a_certificate_that_verifies_against_the_cas_root_only(
    lab: PebbleLab, responder: Responder, tmp_path: pathlib.Path
) -> None:
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    issued = await client.issue("svc.example.test", publish=responder.publish, withdraw=responder.withdraw)

    leaf = leaf_of(issued)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["svc.example.test"]
    assert (issued.not_before, issued.not_after) == (leaf.not_valid_before_utc, leaf.not_valid_after_utc)
    key = serialization.load_pem_private_key(issued.key_pem.encode(), password=None)
    assert key.public_key() == leaf.public_key()
    # the CA fetched the key authorization from port 80, and every token was withdrawn afterwards
    assert responder.published and responder.withdrawn == responder.published
    assert responder.fetches() >= 1
    assert list(responder.challenges.iterdir()) == []

    issuer = handshake(issued, "svc.example.test", trusting(lab.root_pem()), tmp_path)
    assert issuer.startswith("Pebble Intermediate CA")
    with pytest.raises(ssl.SSLCertVerificationError):  # the system store does not know pebble's root
        handshake(issued, "svc.example.test", ssl.create_default_context(), tmp_path)


async def test_an_account_key_given_back_is_the_same_account(lab: PebbleLab, responder: Responder) -> None:
    first = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    await first.issue("a.example.test", publish=responder.publish, withdraw=responder.withdraw)
    again = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle, account_key_pem=first.account_key_pem)
    await again.issue("b.example.test", publish=responder.publish, withdraw=responder.withdraw)
    assert again.account_url == first.account_url is not None


async def test_after_the_ca_restarts_the_client_registers_again_and_the_new_chain_needs_the_new_root(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.acme.client")
    own = PebbleLab(tmp_path_factory.mktemp("pebble-restart")).start()
    try:
        web = start_responder(own, "web", tmp_path)
        own.set_default_ipv4(web.host.ip)
        client = AcmeClient(own.directory_url, ca_bundle=own.ca_bundle)
        before = await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)
        old_root, old_account = own.root_pem(), client.account_url

        own.restart()
        new_root = own.root_pem()
        assert new_root != old_root
        after = await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)

        assert client.account_url is not None and client.account_url != old_account
        assert f"no longer knows account {old_account}" in caplog.text  # the CA said so (accountDoesNotExist)
        handshake(after, "svc.example.test", trusting(new_root), tmp_path)
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(after, "svc.example.test", trusting(old_root), tmp_path)
        with pytest.raises(ssl.SSLCertVerificationError):  # what the old CA issued no longer verifies
            handshake(before, "svc.example.test", trusting(new_root), tmp_path)
    finally:
        own.stop()


async def test_an_rsa_account_key_signs_with_rs256_and_is_accepted(lab: PebbleLab, responder: Responder) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle, account_key_pem=pem)
    issued = await client.issue("rsa.example.test", publish=responder.publish, withdraw=responder.withdraw)
    assert leaf_of(issued).subject.rfc4514_string() == "CN=rsa.example.test"
    assert client.account_key_pem == pem
