"""Fixtures of the ACME tests: a pebble lab for the session (``pebble_harness``), and a host on its bridge whose
port 80 is served by the tests' own HTTP-01 responder (``acme_web``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from acme_web import Responder, start_responder

from pebble_harness import PebbleLab


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PebbleLab]:
    pebble = PebbleLab(tmp_path_factory.mktemp("pebble")).start()
    try:
        yield pebble
    finally:
        pebble.stop()


@pytest.fixture(scope="session")
def web(lab: PebbleLab, tmp_path_factory: pytest.TempPathFactory) -> Responder:
    """The responder host; every name resolves to it unless a test says otherwise."""
    responder = start_responder(lab, "web", tmp_path_factory.mktemp("www"))
    lab.set_default_ipv4(responder.host.ip)
    return responder


@pytest.fixture
def responder(web: Responder) -> Iterator[Responder]:
    web.published.clear()
    web.withdrawn.clear()
    yield web
