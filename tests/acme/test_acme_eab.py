"""External Account Binding (RFC 8555 §7.3.4) against a CA that requires it: pebble with
``externalAccountBindingRequired`` and MAC keys of the test's own."""

from __future__ import annotations

import base64
import pathlib
from collections.abc import Iterator

import pytest
from acme_web import Responder, start_responder

from corral.acme import AcmeClient, AcmeError, EabCredentials
from pebble_harness import PebbleLab

#: A key id and MAC key of the test's own (base64url, as CAs hand them out).
KID = "corral-test-kid"
MAC_KEY = base64.urlsafe_b64encode(b"a 32-byte MAC key for corral EAB").rstrip(b"=").decode()
OTHER_KEY = base64.urlsafe_b64encode(b"another 32-byte key, not the one").rstrip(b"=").decode()


@pytest.fixture(scope="module")
def eab_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PebbleLab, Responder]]:
    lab = PebbleLab(tmp_path_factory.mktemp("pebble-eab"), eab_keys={KID: MAC_KEY}).start()
    try:
        web = start_responder(lab, "web", tmp_path_factory.mktemp("www-eab"))
        lab.set_default_ipv4(web.host.ip)
        yield lab, web
    finally:
        lab.stop()


async def test_without_eab_the_error_names_the_settings(eab_lab: tuple[PebbleLab, Responder]) -> None:
    lab, web = eab_lab
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    with pytest.raises(AcmeError) as e:
        await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)
    assert e.value.kind == "eab_required"
    assert "CORRAL_ACME_EAB_KID" in e.value.message and "CORRAL_ACME_EAB_HMAC_KEY" in e.value.message


async def test_with_eab_the_account_is_bound_and_a_certificate_issued(
    eab_lab: tuple[PebbleLab, Responder], tmp_path: pathlib.Path
) -> None:
    lab, web = eab_lab
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle, eab=EabCredentials(KID, MAC_KEY))
    issued = await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)
    assert "BEGIN CERTIFICATE" in issued.fullchain_pem and client.account_url is not None


@pytest.mark.parametrize(
    "eab", [EabCredentials(KID, OTHER_KEY), EabCredentials("unknown-kid", MAC_KEY), EabCredentials(KID, "not*b64!")]
)
async def test_wrong_eab_credentials_name_the_settings(
    eab_lab: tuple[PebbleLab, Responder], eab: EabCredentials
) -> None:
    lab, web = eab_lab
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle, eab=eab)
    with pytest.raises(AcmeError) as e:
        await client.issue("svc.example.test", publish=web.publish, withdraw=web.withdraw)
    assert e.value.kind == "eab_invalid", e.value
    assert "CORRAL_ACME_EAB" in e.value.message
