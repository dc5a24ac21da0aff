"""ACME's problem documents (RFC 7807) as :class:`AcmeError`, with a message a user can act on.

The error types are RFC 8555 §6.7's (``urn:ietf:params:acme:error:<type>``); each maps to a short ``kind`` the
caller may branch on and a sentence saying what to do. Types this table does not know keep the CA's own detail.

May import: the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

#: RFC 8555 §6.7: the namespace of ACME's error types.
ACME_ERROR_NS = "urn:ietf:params:acme:error:"

#: The settings the messages name (``Settings`` in ``corral.settings`` reads them).
SERVER_SETTING = "CORRAL_ACME_SERVER"
EAB_KID_SETTING = "CORRAL_ACME_EAB_KID"
EAB_KEY_SETTING = "CORRAL_ACME_EAB_HMAC_KEY"
CA_BUNDLE_SETTING = "CORRAL_ACME_CA_BUNDLE"


class AcmeError(Exception):
    """An issuance that failed: ``kind`` for code (``dns``, ``connection``, ``unauthorized``, ``rate_limited``,
    ``eab_required``, ``server``, ``refused``, ``timeout``, ...), ``message`` for a person."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Problem:
    """An ACME problem document: its type without the namespace (``badNonce``), detail and HTTP status."""

    type: str
    detail: str
    status: int

    @staticmethod
    def parse(body: object, status: int) -> Problem:
        if not isinstance(body, dict):
            return Problem("serverInternal", f"HTTP {status} without a problem document", status)
        raw_type = str(body.get("type") or "serverInternal")
        detail = str(body.get("detail") or "")
        subs = body.get("subproblems")
        if isinstance(subs, list):
            detail += "".join(f"; {s.get('detail', '')}" for s in subs if isinstance(s, dict))
        return Problem(raw_type.removeprefix(ACME_ERROR_NS), detail, status)


def _point_dns(host: str, address: str | None) -> str:
    where = f"the gateway's address {address}" if address else "the gateway's address"
    return f"make sure DNS for {host} points at {where}"


def challenge_error(problem: Problem, host: str, address: str | None) -> AcmeError:
    """The error of a failed HTTP-01 validation of ``host`` (the CA fetched, or failed to fetch, the token)."""
    fix = f"{_point_dns(host, address)} and that port 80 there is reachable from the internet"
    if problem.type == "dns":
        return AcmeError("dns", f"the CA could not resolve {host} ({problem.detail}): {fix}")
    if problem.type == "connection":
        return AcmeError("connection", f"the CA could not connect to {host} on port 80 ({problem.detail}): {fix}")
    if problem.type in ("unauthorized", "incorrectResponse"):
        return AcmeError(
            "unauthorized",
            f"the CA fetched the challenge from {host} but got the wrong answer ({problem.detail}): "
            f"{_point_dns(host, address)}, not at another server",
        )
    return problem_error(problem, f"validating {host}")


def timeout_error(host: str, address: str | None, seconds: float) -> AcmeError:
    return AcmeError(
        "timeout",
        f"no certificate for {host} within {seconds:g} s: {_point_dns(host, address)} and that port 80 there is "
        "reachable from the internet",
    )


def problem_error(problem: Problem, doing: str) -> AcmeError:
    """The error of any other failed request (``doing``: what was being done, for the message)."""
    detail = f"{problem.detail} (HTTP {problem.status})" if problem.detail else f"HTTP {problem.status}"
    if problem.type == "externalAccountRequired":
        return AcmeError(
            "eab_required",
            f"the ACME server requires External Account Binding: set {EAB_KID_SETTING} and {EAB_KEY_SETTING} "
            f"to the key id and HMAC key your CA gives you ({detail})",
        )
    if problem.type == "rateLimited":
        return AcmeError("rate_limited", f"the CA's rate limit was hit while {doing}: try again later ({detail})")
    if problem.type == "rejectedIdentifier":
        return AcmeError("rejected_identifier", f"the CA will not issue for this name ({detail})")
    if problem.type == "caa":
        return AcmeError("caa", f"a CAA record forbids this CA from issuing for the name ({detail})")
    if problem.type == "unauthorized" and doing == "registering the account":
        return AcmeError(
            "eab_invalid",
            f"the ACME server refused the account: check {EAB_KID_SETTING} and {EAB_KEY_SETTING} ({detail})",
        )
    if problem.type in ("dns", "connection", "unauthorized", "incorrectResponse", "tls"):
        return AcmeError(problem.type if problem.type != "incorrectResponse" else "unauthorized", f"{doing}: {detail}")
    if problem.type == "serverInternal" or problem.status >= 500:
        return AcmeError("server", f"the ACME server failed while {doing}: try again later ({detail})")
    return AcmeError("refused", f"the ACME server refused {doing}: {problem.type}: {detail}")
