"""The ACME resources corral reads (RFC 8555 §7.1), parsed from the CA's JSON into frozen values.

Only the fields the HTTP-01 flow uses: the directory's three URLs (§7.1.1), an order (§7.1.3), an authorization
and its challenges (§7.1.4, §8). A field that is missing or of the wrong type makes the whole answer malformed
(``None`` from ``parse``), which the client reports as the CA's failure.

May import: ``corral.acme.errors`` and the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from corral.acme.errors import Problem

#: RFC 8555 §8.3: a token holds base64url characters only; anything else is not put in a URL path.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")


def _str(obj: Mapping[str, object], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def _problem(obj: Mapping[str, object]) -> Problem | None:
    error = obj.get("error")
    return Problem.parse(error, 403) if error is not None else None


@dataclass(frozen=True)
class Directory:
    new_nonce: str
    new_account: str
    new_order: str

    @staticmethod
    def parse(body: object) -> Directory | None:
        if not isinstance(body, Mapping):
            return None
        urls = [_str(body, k) for k in ("newNonce", "newAccount", "newOrder")]
        if urls[0] is None or urls[1] is None or urls[2] is None:
            return None
        return Directory(urls[0], urls[1], urls[2])


@dataclass(frozen=True)
class Challenge:
    type: str
    url: str
    token: str
    error: Problem | None


@dataclass(frozen=True)
class Authorization:
    status: str
    challenges: tuple[Challenge, ...]

    def http01(self) -> Challenge | None:
        return next((c for c in self.challenges if c.type == "http-01"), None)

    @staticmethod
    def parse(body: object) -> Authorization | None:
        if not isinstance(body, Mapping) or _str(body, "status") is None:
            return None
        raw = body.get("challenges")
        challenges = []
        for c in raw if isinstance(raw, list) else []:
            if not isinstance(c, Mapping):
                return None
            kind, url, token = _str(c, "type"), _str(c, "url"), _str(c, "token") or ""
            if kind is None or url is None or (kind == "http-01" and not _TOKEN.fullmatch(token)):
                return None
            challenges.append(Challenge(kind, url, token, _problem(c)))
        return Authorization(str(body["status"]), tuple(challenges))


@dataclass(frozen=True)
class Order:
    status: str
    authorizations: tuple[str, ...]
    finalize: str
    certificate: str | None
    error: Problem | None

    @staticmethod
    def parse(body: object) -> Order | None:
        if not isinstance(body, Mapping):
            return None
        status, finalize, authzs = _str(body, "status"), _str(body, "finalize"), body.get("authorizations")
        if status is None or finalize is None or not isinstance(authzs, list):
            return None
        if not all(isinstance(a, str) for a in authzs):
            return None
        return Order(status, tuple(str(a) for a in authzs), finalize, _str(body, "certificate"), _problem(body))
