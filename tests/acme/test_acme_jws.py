"""JWKs, thumbprints and signatures (``corral/acme/jws.py``), checked against RFC 7638's published example and
by verifying each signature with ``cryptography``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import datetime, timezone

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from corral.acme import AcmeClient, AcmeError
from corral.acme.client import retry_after
from corral.acme.errors import Problem, problem_error
from corral.acme.jws import Jwk, eab_jws, jws, load_account_key, public_jwk
from corral.acme.messages import Authorization, Directory, Order

#: RFC 7638 §3.1 (https://www.rfc-editor.org/rfc/rfc7638#section-3.1): the example RSA key's members and the
#: thumbprint the RFC gives for it.
RFC7638_N = (
    "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3o"
    "knjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZ"
    "Hzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-"
    "kEgU8awapJzKnqDKgw"
)
RFC7638_E = "AQAB"
RFC7638_THUMBPRINT = "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_the_thumbprint_of_rfc_7638s_example_key() -> None:
    key = rsa.RSAPublicNumbers(int.from_bytes(unb64(RFC7638_E), "big"), int.from_bytes(unb64(RFC7638_N), "big"))
    jwk = public_jwk(key.public_key())
    assert jwk.as_dict() == {"e": RFC7638_E, "kty": "RSA", "n": RFC7638_N}
    assert jwk.thumbprint() == RFC7638_THUMBPRINT


def test_the_key_authorization_is_the_token_and_the_thumbprint() -> None:
    client = AcmeClient("https://acme.example.test/dir")
    key = serialization.load_pem_private_key(client.account_key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert client.key_authorization("tok-1") == "tok-1." + public_jwk(key.public_key()).thumbprint()
    # the same key given back is the same account
    again = AcmeClient("https://acme.example.test/dir", account_key_pem=client.account_key_pem)
    assert again.key_authorization("tok-1") == client.key_authorization("tok-1")


def test_an_es256_jws_carries_the_jwk_and_verifies() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    body = jws(key, {"termsOfServiceAgreed": True}, url="https://ca/new-acct", nonce="n0", kid=None)
    header = json.loads(unb64(body["protected"]))
    assert header == {
        "alg": "ES256",
        "nonce": "n0",
        "url": "https://ca/new-acct",
        "jwk": public_jwk(key.public_key()).as_dict(),
    }
    assert json.loads(unb64(body["payload"])) == {"termsOfServiceAgreed": True}
    raw = unb64(body["signature"])
    assert len(raw) == 64  # r || s, RFC 7518 §3.4
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    signed = f"{body['protected']}.{body['payload']}".encode()
    key.public_key().verify(der, signed, ec.ECDSA(hashes.SHA256()))


def test_an_rs256_post_as_get_has_the_kid_and_an_empty_payload() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    body = jws(key, None, url="https://ca/order/1", nonce="n1", kid="https://ca/acct/7")
    header = json.loads(unb64(body["protected"]))
    assert header == {"alg": "RS256", "nonce": "n1", "url": "https://ca/order/1", "kid": "https://ca/acct/7"}
    assert body["payload"] == ""
    signed = f"{body['protected']}.".encode()
    key.public_key().verify(unb64(body["signature"]), signed, padding.PKCS1v15(), hashes.SHA256())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    assert isinstance(load_account_key(pem), rsa.RSAPrivateKey)


def test_the_eab_is_hs256_over_the_account_jwk() -> None:
    mac_key = b"0123456789abcdef0123456789abcdef"
    jwk = Jwk((("crv", "P-256"), ("kty", "EC"), ("x", "AAAA"), ("y", "BBBB")))
    body = eab_jws(jwk, kid="kid-1", hmac_key_b64url=base64.urlsafe_b64encode(mac_key).decode().rstrip("="), url="u")
    assert json.loads(unb64(body["protected"])) == {"alg": "HS256", "kid": "kid-1", "url": "u"}
    assert json.loads(unb64(body["payload"])) == jwk.as_dict()
    expected = hmac.new(mac_key, f"{body['protected']}.{body['payload']}".encode(), hashlib.sha256).digest()
    assert unb64(body["signature"]) == expected


@pytest.mark.parametrize(
    "key",
    [
        rsa.generate_private_key(public_exponent=65537, key_size=1024),
        ec.generate_private_key(ec.SECP384R1()),
        ed25519.Ed25519PrivateKey.generate(),
    ],
)
def test_account_keys_of_other_kinds_are_refused(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(AcmeError) as e:
        AcmeClient("https://acme.example.test/dir", account_key_pem=pem)
    assert e.value.kind == "account_key" and "P-256" in e.value.message


def test_an_account_key_that_is_not_pem_is_refused() -> None:
    with pytest.raises(AcmeError) as e:
        load_account_key(b"not a key")
    assert e.value.kind == "account_key"


#: RFC 8555 §6.7's error types, as problem documents a CA sends (type URNs from the RFC's table).
PROBLEMS = [
    ({"type": "urn:ietf:params:acme:error:rateLimited", "detail": "too many"}, 429, "rate_limited"),
    ({"type": "urn:ietf:params:acme:error:caa", "detail": "CAA forbids"}, 403, "caa"),
    ({"type": "urn:ietf:params:acme:error:rejectedIdentifier", "detail": "no"}, 400, "rejected_identifier"),
    ({"type": "urn:ietf:params:acme:error:serverInternal", "detail": "oops"}, 500, "server"),
    ({"type": "urn:ietf:params:acme:error:malformed", "detail": "bad"}, 400, "refused"),
    ({"type": "urn:ietf:params:acme:error:dns", "detail": "NXDOMAIN"}, 400, "dns"),
    ("not a problem document", 502, "server"),
]


@pytest.mark.parametrize(("body", "status", "kind"), PROBLEMS)
def test_problem_documents_become_errors_of_a_kind(body: object, status: int, kind: str) -> None:
    error = problem_error(Problem.parse(body, status), "ordering a certificate for a.example.test")
    assert error.kind == kind
    assert "ordering a certificate for a.example.test" in error.message or kind in ("caa", "rejected_identifier")


NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, 1.0),  # no Retry-After: the client's interval
        ("3", 3.0),
        ("3600", 10.0),  # a long wait is capped (the issuance's own timeout bounds the whole)
        ("Sun, 06 Dec 2026 12:00:04 GMT", 4.0),  # an HTTP date (RFC 9110 §10.2.3)
        ("Sun, 06 Dec 2026 11:00:00 GMT", 0.0),  # already past
        ("soon", 1.0),
    ],
)
def test_retry_after_as_seconds_or_a_date(header: str | None, seconds: float) -> None:
    assert retry_after(header, 1.0, NOW) == seconds


def test_a_challenge_token_that_is_not_base64url_makes_the_authorization_malformed() -> None:
    good = {"status": "pending", "challenges": [{"type": "http-01", "url": "https://ca/chall/1", "token": "aB-_9"}]}
    parsed = Authorization.parse(good)
    assert parsed is not None and parsed.http01() is not None
    bad = {"status": "pending", "challenges": [{"type": "http-01", "url": "https://ca/chall/1", "token": "../x"}]}
    assert Authorization.parse(bad) is None
    assert Order.parse({"status": "pending", "finalize": "https://ca/f", "authorizations": [1]}) is None
    assert Directory.parse({"newNonce": "n", "newAccount": "a"}) is None
