"""Issuances that fail, against a real CA (pebble): each ends in an ``AcmeError`` whose kind a caller can branch
on and whose message names the host or the setting to fix; the token is withdrawn whatever happened."""

from __future__ import annotations

import pathlib
import time

import pytest
from acme_web import Responder

from corral.acme import AcmeClient, AcmeError
from pebble_harness import PebbleLab


@pytest.fixture(scope="module")
def quiet_ip(lab: PebbleLab) -> str:
    """A host on the lab's bridge with nothing listening on port 80."""
    return lab.add_host("quie").ip


async def test_nothing_on_port_80_is_a_connection_error_naming_the_host(
    lab: PebbleLab, responder: Responder, quiet_ip: str
) -> None:
    lab.add_a("down.example.test", [quiet_ip])
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    started = time.monotonic()
    with pytest.raises(AcmeError) as e:
        await client.issue(
            "down.example.test", publish=responder.publish, withdraw=responder.withdraw, address="203.0.113.7"
        )
    assert time.monotonic() - started < 10
    assert e.value.kind == "connection"
    assert "down.example.test" in e.value.message and "203.0.113.7" in e.value.message
    assert "DNS" in e.value.message and "port 80" in e.value.message
    assert responder.published and responder.withdrawn == responder.published


async def test_a_wrong_answer_on_port_80_is_unauthorized(lab: PebbleLab, responder: Responder) -> None:
    async def publish_nowhere(token: str, key_authorization: str) -> None:
        responder.published.append(token)  # the responder answers 404: another server than the gateway

    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    with pytest.raises(AcmeError) as e:
        await client.issue("other.example.test", publish=publish_nowhere, withdraw=responder.withdraw)
    assert e.value.kind == "unauthorized"
    assert "other.example.test" in e.value.message and "not at another server" in e.value.message
    assert responder.withdrawn == responder.published


async def test_a_failing_publish_still_withdraws_the_token(lab: PebbleLab, responder: Responder) -> None:
    async def publish_fails(token: str, key_authorization: str) -> None:
        responder.published.append(token)
        raise ConnectionError("the gateway is down")

    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    with pytest.raises(ConnectionError):
        await client.issue("svc.example.test", publish=publish_fails, withdraw=responder.withdraw)
    assert responder.published and responder.withdrawn == responder.published


async def test_an_issuance_past_its_timeout_is_given_up_and_its_token_withdrawn(
    lab: PebbleLab, responder: Responder
) -> None:
    # an address of the lab's /24 where no host lives: the CA's connection waits for an ARP answer that never comes
    lab.add_a("slow.example.test", [f"{lab.subnet}.250"])
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(AcmeError) as e:
        await client.issue("slow.example.test", publish=responder.publish, withdraw=responder.withdraw)
    assert time.monotonic() - started < 5
    assert e.value.kind == "timeout"
    assert "slow.example.test" in e.value.message and "1 s" in e.value.message
    assert responder.published and responder.withdrawn == responder.published


@pytest.mark.parametrize("path", ["/not-a-directory", "/"])
async def test_a_url_that_is_not_an_acme_directory_names_the_setting(
    lab: PebbleLab, responder: Responder, path: str
) -> None:
    url = f"https://{lab.bridge_ip}:14000{path}"
    client = AcmeClient(url, ca_bundle=lab.ca_bundle)
    with pytest.raises(AcmeError) as e:
        await client.issue("svc.example.test", publish=responder.publish, withdraw=responder.withdraw)
    assert e.value.kind == "directory"
    assert url in e.value.message and "CORRAL_ACME_SERVER" in e.value.message
    assert responder.published == []


@pytest.mark.parametrize(
    ("url", "kind"), [("https://{ip}:1/dir", "unreachable"), ("acme.example.test/dir", "directory")]
)
async def test_an_unreachable_or_malformed_directory_url_names_the_setting(
    lab: PebbleLab, responder: Responder, url: str, kind: str
) -> None:
    client = AcmeClient(url.format(ip=lab.bridge_ip), ca_bundle=lab.ca_bundle)
    with pytest.raises(AcmeError) as e:
        await client.issue("svc.example.test", publish=responder.publish, withdraw=responder.withdraw)
    assert (e.value.kind, "CORRAL_ACME_SERVER" in e.value.message) == (kind, True)


async def test_an_acme_server_the_system_store_does_not_trust_names_the_ca_bundle_setting(
    lab: PebbleLab, responder: Responder
) -> None:
    client = AcmeClient(lab.directory_url)  # pebble's API certificate comes from the lab's own CA
    with pytest.raises(AcmeError) as e:
        await client.issue("svc.example.test", publish=responder.publish, withdraw=responder.withdraw)
    assert e.value.kind == "ca_untrusted"
    assert "CORRAL_ACME_CA_BUNDLE" in e.value.message and lab.directory_url in e.value.message


def test_a_ca_bundle_that_is_not_pem_names_the_setting(tmp_path: pathlib.Path) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("not a certificate\n")
    with pytest.raises(AcmeError) as e:
        AcmeClient("https://acme.example.test/dir", ca_bundle=bundle)
    assert e.value.kind == "ca_bundle"
    assert f"CORRAL_ACME_CA_BUNDLE={bundle}" in e.value.message
