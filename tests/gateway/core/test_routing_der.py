"""Routing decisions on :80 and :443, and a certificate's expiry read from its DER."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral.gateway.core import der
from corral.gateway.core.model import Entrypoint, RateLimit, Service, State
from corral.gateway.core.routing import Answer, Forward, build_table, decide, host_of

SVC = Service(
    "p",
    "r",
    "a.gw.test",
    https=True,
    auth=True,
    upstream_path="/proxy/services/p/r/",
    rate_limits=(RateLimit("/", None, 1.0, 0),),
    client_max_body_size=10,
    read_timeout=5,
)
PLAIN = Service("p", "plain", "plain.gw.test", https=False, auth=False, upstream_path="/proxy/services/p/plain")
STATE = State(
    services={("p", "r"): SVC, ("p", "plain"): PLAIN},
    entrypoints={"gateway.gw.test": Entrypoint("gateway.gw.test", "p", https=True)},
    challenges={"tok": "tok.thumb"},
)
TABLE = build_table(STATE)


def _status(*args: Any) -> int:
    answer = decide(*args)
    assert isinstance(answer, Answer), answer
    return answer.status


def test_host_header() -> None:
    assert host_of("A.Gw.Test:443") == "a.gw.test"
    assert host_of("a.gw.test") == "a.gw.test"
    assert host_of("[::1]:80") == "[::1]"
    assert host_of(None) == ""


def test_port_80() -> None:
    assert decide(TABLE, STATE.challenges, False, "x", "/.well-known/acme-challenge/tok") == Answer(200, b"tok.thumb")
    assert _status(TABLE, STATE.challenges, False, "x", "/.well-known/acme-challenge/no") == 404
    assert decide(TABLE, STATE.challenges, False, "a.gw.test", "/p?q=1") == Answer(
        301, b"", location="https://a.gw.test/p?q=1"
    )
    forward = decide(TABLE, STATE.challenges, False, "plain.gw.test", "/x?y=1")
    assert isinstance(forward, Forward) and forward.target == "/proxy/services/p/plain/x?y=1"
    assert forward.service == ("p", "plain") and not forward.auth
    assert _status(TABLE, STATE.challenges, False, "", "/") == 404
    assert _status(TABLE, STATE.challenges, False, "a.gw.test", "http://evil/") == 400
    assert _status(TABLE, STATE.challenges, False, "a.gw.test", "/a/%2E%2E/b") == 400


def test_port_443_service_and_model_endpoint() -> None:
    forward = decide(TABLE, STATE.challenges, True, "a.gw.test", "/.well-known/acme-challenge/tok")
    assert isinstance(forward, Forward) and forward.target == "/proxy/services/p/r/.well-known/acme-challenge/tok"
    assert (forward.auth, forward.rate_limits, forward.client_max_body_size, forward.read_timeout) == (
        True,
        SVC.rate_limits,
        10,
        5,
    )
    for path, target in (
        ("/models", "/proxy/models/p/models"),
        ("/v1/chat/completions?s=1", "/proxy/models/p/chat/completions?s=1"),
    ):
        forward = decide(TABLE, STATE.challenges, True, "gateway.gw.test", path)
        assert isinstance(forward, Forward)
        assert (forward.target, forward.auth, forward.service) == (target, True, None)
    assert _status(TABLE, STATE.challenges, True, "gateway.gw.test", "/v1/embeddings") == 404


def test_certificate_expiry() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a.gw.test")])
    not_after = datetime.datetime(2031, 12, 6, 10, 0, 5, tzinfo=datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc))
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    blocks = der.pem_blocks(pem + pem, "CERTIFICATE")
    assert len(blocks) == 2
    assert der.not_after(blocks[0]) == not_after


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag, len(body)]) + body if len(body) < 128 else bytes([tag, 0x81, len(body)]) + body


def _seq(*items: bytes, tag: int = 0x30) -> bytes:
    return _tlv(tag, b"".join(items))


def _cert(time_tag: int, time_text: bytes, with_version: bool = True) -> bytes:
    validity = _seq(_tlv(time_tag, time_text), _tlv(time_tag, time_text))
    version = [_seq(bytes([2, 1, 2]), tag=0xA0)] if with_version else []
    return _seq(_seq(*version, bytes([2, 1, 1]), _seq(), _seq(), validity))


def test_der_times_and_shapes() -> None:
    utc = datetime.timezone.utc
    assert der.not_after(_cert(0x17, b"491231235959Z")) == datetime.datetime(2049, 12, 31, 23, 59, 59, tzinfo=utc)
    assert der.not_after(_cert(0x18, b"20991231235959Z", with_version=False)).year == 2099
    long_serial = _tlv(2, bytes(130))  # a two-byte length
    when = _tlv(0x17, b"300101000000Z")
    assert der.not_after(_seq(_seq(long_serial, _seq(), _seq(), _seq(when, when)))).year == 2030


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x30", "truncated DER"),
        (b"\x30\x85\x00\x00\x00\x00\x00", "bad DER length"),
        (b"\x30\x80", "bad DER length"),
        (b"\x30\x05\x00", "truncated DER"),
        (_seq(_seq(tag=0x31)), "not an X.509 certificate"),
        (_seq(_seq(bytes([2, 1, 1]), _seq(), _seq(), _seq(tag=0x31))), "not an X.509 certificate"),
        (_cert(0x02, b"1"), "notAfter is not a time"),
        (_cert(0x17, b"991399999999Z"), "is not a valid time"),
    ],
)
def test_der_errors(data: bytes, message: str) -> None:
    with pytest.raises(der.CertificateError, match=message):
        der.not_after(data)


def test_pem_blocks() -> None:
    text = "-----BEGIN CERTIFICATE-----\n" + base64.b64encode(b"abc").decode() + "\n-----END CERTIFICATE-----\n"
    assert der.pem_blocks(text, "CERTIFICATE") == [b"abc"]
    assert der.pem_blocks(text, "PRIVATE KEY") == []
    with pytest.raises(der.CertificateError, match=r"not valid base64"):
        der.pem_blocks("-----BEGIN X-----\n!!!\n-----END X-----", "X")
