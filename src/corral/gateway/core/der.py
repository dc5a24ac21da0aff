"""A certificate's expiry, read from its DER (X.509, RFC 5280 section 4.1: ``Certificate ::= SEQUENCE {
tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer, validity SEQUENCE { notBefore,
notAfter }, ...}, ...}``; times are UTCTime ``YYMMDDHHMMSSZ``, years 50-99 meaning 19YY, or GeneralizedTime
``YYYYMMDDHHMMSSZ``), and the blocks of a PEM text (RFC 7468)."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime, timezone


class CertificateError(ValueError):
    pass


def pem_blocks(text: str, label: str) -> list[bytes]:
    """The DER of every ``-----BEGIN <label>-----`` block of ``text``."""
    pattern = rf"-----BEGIN {label}-----\s*(.*?)\s*-----END {label}-----"
    out = []
    for body in re.findall(pattern, text, re.DOTALL):
        try:
            out.append(base64.b64decode("".join(body.split()), validate=True))
        except (binascii.Error, ValueError):
            raise CertificateError(f"a {label} block is not valid base64") from None
    return out


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of the content, end of the content) of the element at ``pos``."""
    if pos + 2 > len(data):
        raise CertificateError("truncated DER")
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if not 0 < n <= 4 or pos + n > len(data):
            raise CertificateError("bad DER length")
        length = int.from_bytes(data[pos : pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise CertificateError("truncated DER")
    return tag, pos, pos + length


def _time(data: bytes, tag: int) -> datetime:
    text = data.decode("ascii", "replace")
    formats = {0x17: "%y%m%d%H%M%SZ", 0x18: "%Y%m%d%H%M%SZ"}
    if tag not in formats:
        raise CertificateError("notAfter is not a time")
    try:
        return datetime.strptime(text, formats[tag]).replace(tzinfo=timezone.utc)
    except ValueError:
        raise CertificateError(f"notAfter {text!r} is not a valid time") from None


def not_after(der: bytes) -> datetime:
    """The certificate's notAfter, in UTC."""
    _, start, _ = _tlv(der, 0)  # Certificate
    tag, pos, end = _tlv(der, start)  # tbsCertificate
    if tag != 0x30:
        raise CertificateError("not an X.509 certificate")
    tag, _, after = _tlv(der, pos)
    if tag == 0xA0:  # [0] version
        pos = after
    for _ in range(3):  # serialNumber, signature, issuer
        pos = _tlv(der, pos)[2]
    tag, pos, _ = _tlv(der, pos)  # validity
    if tag != 0x30:
        raise CertificateError("not an X.509 certificate")
    pos = _tlv(der, pos)[2]  # notBefore
    tag, start, end = _tlv(der, pos)
    return _time(der[start:end], tag)
