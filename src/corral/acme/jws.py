"""Account keys, JWKs and the JSON Web Signatures ACME requests carry.

* A JWK (RFC 7517) of an account's public key, and its thumbprint (RFC 7638 §3: SHA-256 over the required
  members, keys sorted, no whitespace, base64url without padding).
* A flattened JWS (RFC 7515 §7.2.2) with RFC 8555 §6.2's protected header: ``alg``, ``nonce``, ``url`` and either
  ``jwk`` (new accounts) or ``kid`` (the account's URL). ES256 signatures are the raw ``r || s`` of RFC 7518
  §3.4, not DER.
* External Account Binding (RFC 8555 §7.3.4): an HS256 JWS over the account's JWK, keyed by the CA's MAC key.

May import: cryptography and the standard library.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from corral.acme.errors import AcmeError

#: RSA account keys shorter than this are refused (Let's Encrypt refuses them too, "key too small").
MIN_RSA_BITS = 2048

AccountKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def b64url(data: bytes) -> str:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _uint(n: int, size: int | None = None) -> str:
    length = size if size is not None else max(1, (n.bit_length() + 7) // 8)
    return b64url(n.to_bytes(length, "big"))


@dataclass(frozen=True)
class Jwk:
    """An account's public key as a JWK: its required members only (what the thumbprint hashes)."""

    members: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, str]:
        return dict(self.members)

    def thumbprint(self) -> str:
        """RFC 7638 §3.1: SHA-256 of the canonical JSON (sorted keys, no whitespace), base64url."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return b64url(hashlib.sha256(canonical.encode("utf-8")).digest())


def public_jwk(key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey) -> Jwk:
    """The JWK of a P-256 or RSA public key (RFC 7518 §6.2.1 and §6.3.1)."""
    if isinstance(key, rsa.RSAPublicKey):
        numbers = key.public_numbers()
        return Jwk((("e", _uint(numbers.e)), ("kty", "RSA"), ("n", _uint(numbers.n))))
    point = key.public_numbers()
    return Jwk((("crv", "P-256"), ("kty", "EC"), ("x", _uint(point.x, 32)), ("y", _uint(point.y, 32))))


def generate_account_key() -> ec.EllipticCurvePrivateKey:
    """A new ES256 account key (ECDSA on P-256)."""
    return ec.generate_private_key(ec.SECP256R1())


def load_account_key(pem: bytes) -> AccountKey:
    """An account key from its PEM: ECDSA P-256 (ES256) or RSA of 2048 bits or more (RS256)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise AcmeError("account_key", f"the ACME account key is not an unencrypted PEM private key: {e}") from None
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size >= MIN_RSA_BITS:
        return key
    raise AcmeError(
        "account_key",
        f"the ACME account key must be ECDSA P-256 (ES256) or RSA of at least {MIN_RSA_BITS} bits (RS256); "
        "leave it out and a new one is generated",
    )


def key_pem(key: AccountKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def algorithm(key: AccountKey) -> str:
    return "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "RS256"


def sign(key: AccountKey, data: bytes) -> bytes:
    """The JWS signature of ``data``: raw ``r || s`` for ES256 (RFC 7518 §3.4), PKCS #1 v1.5 for RS256."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return key.sign(data, padding.PKCS1v15(), hashes.SHA256())


def _encode(obj: object) -> str:
    return b64url(json.dumps(obj, separators=(",", ":")).encode("utf-8"))


def jws(key: AccountKey, payload: object | None, *, url: str, nonce: str, kid: str | None) -> dict[str, str]:
    """A flattened JWS of ``payload`` (``None``: POST-as-GET, an empty payload, RFC 8555 §6.3)."""
    header: dict[str, object] = {"alg": algorithm(key), "nonce": nonce, "url": url}
    if kid is None:
        header["jwk"] = public_jwk(key.public_key()).as_dict()
    else:
        header["kid"] = kid
    protected = _encode(header)
    body = "" if payload is None else _encode(payload)
    signature = sign(key, f"{protected}.{body}".encode("ascii"))
    return {"protected": protected, "payload": body, "signature": b64url(signature)}


def eab_jws(jwk: Jwk, *, kid: str, hmac_key_b64url: str, url: str) -> dict[str, str]:
    """The ``externalAccountBinding`` of a newAccount request (RFC 8555 §7.3.4): HS256 over the account's JWK,
    with the CA's key id and the newAccount URL in the protected header."""
    try:
        mac_key = b64url_decode(hmac_key_b64url.strip())
    except ValueError:
        raise AcmeError(
            "eab_invalid",
            "CORRAL_ACME_EAB_HMAC_KEY is not base64url: copy the HMAC key exactly as the CA gave it",
        ) from None
    protected = _encode({"alg": "HS256", "kid": kid, "url": url})
    payload = _encode(jwk.as_dict())
    mac = hmac.new(mac_key, f"{protected}.{payload}".encode("ascii"), hashlib.sha256).digest()
    return {"protected": protected, "payload": payload, "signature": b64url(mac)}
