"""``badNonce`` (RFC 8555 §6.5): with ``PEBBLE_WFE_NONCEREJECT`` left at pebble's default, a share of signed
requests is refused as if their nonce were stale; the client retries each with the nonce the refusal carries,
so every issuance succeeds."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from acme_web import Responder, start_responder

from corral.acme import AcmeClient
from pebble_harness import PebbleLab


@pytest.fixture(scope="module")
def rejecting_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PebbleLab, Responder]]:
    lab = PebbleLab(tmp_path_factory.mktemp("pebble-nonces"), nonce_reject=None).start()
    try:
        web = start_responder(lab, "web", tmp_path_factory.mktemp("www-nonces"))
        lab.set_default_ipv4(web.host.ip)
        yield lab, web
    finally:
        lab.stop()


async def test_bad_nonces_are_retried_and_every_issuance_succeeds(
    rejecting_lab: tuple[PebbleLab, Responder], caplog: pytest.LogCaptureFixture
) -> None:
    lab, web = rejecting_lab
    caplog.set_level(logging.DEBUG, logger="corral.acme.client")
    client = AcmeClient(lab.directory_url, ca_bundle=lab.ca_bundle)
    issued = 0
    # about 10 signed requests an issuance at pebble's default rejection rate: keep going until some were refused
    while issued < 4 or ("badNonce" not in caplog.text and issued < 40):
        await client.issue(f"n{issued}.example.test", publish=web.publish, withdraw=web.withdraw)
        issued += 1
    assert "badNonce" in caplog.text, f"pebble refused no nonce in {issued} issuances"
