"""The ACME client: one certificate for one host name by HTTP-01 (RFC 8555 §7 and §8.3).

``AcmeClient(directory_url, ...).issue(host, publish=..., withdraw=...)`` registers the account when it has none
yet (again when the CA no longer knows it), orders, has the caller publish each token's key authorization where
the CA fetches it (``http://<host>/.well-known/acme-challenge/<token>``), asks the CA to validate, polls (honouring
``Retry-After``), withdraws the token whatever happened, finalizes with a CSR for a fresh P-256 key and downloads
the chain. ``register_if_forgotten()`` asks the CA whether it still knows the account (RFC 8555 §7.3.1's
``onlyReturnExisting``) and registers it again when it does not: how a CA that lost its state is noticed.
A ``badNonce`` is retried with the nonce that came with it (RFC 8555 §6.5); every other problem document becomes
an :class:`AcmeError`.

May import: ``corral.acme``'s own modules, ``corral.settings`` (a constant), httpx, cryptography and the standard
library.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral.acme import jws
from corral.acme.errors import (
    CA_BUNDLE_SETTING,
    SERVER_SETTING,
    AcmeError,
    Problem,
    challenge_error,
    problem_error,
    timeout_error,
)
from corral.acme.messages import Authorization, Directory, Order
from corral.settings import LETS_ENCRYPT_DIRECTORY

log = logging.getLogger(__name__)

#: RFC 8555 §6.2 (requests) and §9.1 (the certificate chain).
JOSE, PEM_CHAIN = "application/jose+json", "application/pem-certificate-chain"
#: How many ``badNonce`` answers in a row one request may get before the issuance fails.
MAX_BAD_NONCE = 8
#: One HTTP request to the CA (the issuance as a whole has its own, longer, timeout).
REQUEST_TIMEOUT = 20.0
#: The longest wait between two polls that a ``Retry-After`` may ask for (the issuance's timeout bounds the whole).
MAX_POLL_WAIT = 10.0

_R = TypeVar("_R", Order, Authorization)
Publish = Callable[[str, str], Awaitable[None]]
Withdraw = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class EabCredentials:
    """External Account Binding credentials from the CA (RFC 8555 §7.3.4): a key id and a base64url MAC key."""

    kid: str
    hmac_key_b64url: str


@dataclass(frozen=True)
class Issued:
    """A certificate: the PEM chain (leaf first), its private key's PEM and its validity."""

    fullchain_pem: str
    key_pem: str
    not_before: datetime
    not_after: datetime


class AcmeClient:
    """An ACME account at one CA; :meth:`issue` gets certificates. Safe to share between concurrent issuances."""

    def __init__(
        self,
        directory_url: str,
        *,
        ca_bundle: str | Path | None = None,
        eab: EabCredentials | None = None,
        account_key_pem: bytes | None = None,
        timeout: float = 60.0,
        poll_interval: float = 1.0,
    ) -> None:
        self.directory_url = directory_url
        self.eab = eab
        self.timeout = timeout
        self.poll_interval = poll_interval
        self._key = jws.generate_account_key() if account_key_pem is None else jws.load_account_key(account_key_pem)
        self._jwk = jws.public_jwk(self._key.public_key())
        self._verify = _tls_context(ca_bundle)
        self._directory: Directory | None = None
        #: The account's URL (the ``kid`` of signed requests) once registered.
        self.account_url: str | None = None

    @property
    def account_key_pem(self) -> bytes:
        """The account key (PKCS #8 PEM), for the caller to seal and pass back next time."""
        return jws.key_pem(self._key)

    def key_authorization(self, token: str) -> str:
        """RFC 8555 §8.1: the token, a dot, and the account key's RFC 7638 thumbprint."""
        return f"{token}.{self._jwk.thumbprint()}"

    async def issue(self, host: str, *, publish: Publish, withdraw: Withdraw, address: str | None = None) -> Issued:
        """A certificate for ``host`` (``address``: where its DNS should point, named in error messages)."""
        try:
            return await asyncio.wait_for(self._issue(host, publish, withdraw, address), self.timeout)
        except asyncio.TimeoutError:
            raise timeout_error(host, address, self.timeout) from None

    async def register_if_forgotten(self) -> bool:
        """Whether the CA had forgotten the account (it is registered again then): ``newAccount`` with
        ``onlyReturnExisting`` answers the account's URL when the CA knows the key, ``accountDoesNotExist`` when it
        does not (RFC 8555 §7.3.1), and creates nothing. Raises :class:`AcmeError` when the CA cannot be asked."""
        async with httpx.AsyncClient(verify=self._verify, timeout=REQUEST_TIMEOUT) as http:
            s = _Session(self, http)
            if await s.lookup():
                return False
            log.info(
                "the ACME server %s no longer knows account %s; registering again", self.directory_url, self.account_url
            )
            await s.register()
            return True

    async def _issue(self, host: str, publish: Publish, withdraw: Withdraw, address: str | None) -> Issued:
        async with httpx.AsyncClient(verify=self._verify, timeout=REQUEST_TIMEOUT) as http:
            s = _Session(self, http)
            directory = await s.directory()
            if self.account_url is None:
                await s.register()
            doing = f"ordering a certificate for {host}"
            resp = await s.post(directory.new_order, {"identifiers": [{"type": "dns", "value": host}]}, doing=doing)
            order_url, order = _location(resp, doing), _parsed(Order.parse, resp, doing)
            for authz_url in order.authorizations:
                await s.authorize(authz_url, host, publish, withdraw, address)
            order = await s.poll(order_url, Order.parse, {"pending"}, doing=f"waiting for the order of {host}")
            if order.status != "ready":
                raise _order_error(order, host)
            key = ec.generate_private_key(ec.SECP256R1())
            doing = f"finalizing the certificate of {host}"
            await s.post(order.finalize, {"csr": jws.b64url(_csr(key, host))}, doing=doing)
            order = await s.poll(order_url, Order.parse, {"ready", "processing"}, doing=doing)
            if order.status != "valid" or order.certificate is None:
                raise _order_error(order, host)
            doing = f"downloading the certificate of {host}"
            resp = await s.post(order.certificate, None, doing=doing, accept=PEM_CHAIN)
            return _issued(resp.text, key, host)


class _Session:
    """One issuance's connection to the CA and its nonce; the account and directory are the client's."""

    def __init__(self, client: AcmeClient, http: httpx.AsyncClient) -> None:
        self.client = client
        self.http = http
        self.nonce: str | None = None

    async def _send(
        self, method: str, url: str, *, content: str | None = None, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        try:
            resp = await self.http.request(method, url, content=content, headers=headers)
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise _transport_error(e, self.client.directory_url) from None
        if nonce := resp.headers.get("Replay-Nonce"):
            self.nonce = nonce
        return resp

    async def directory(self) -> Directory:
        if self.client._directory is None:
            url = self.client.directory_url
            resp = await self._send("GET", url)
            directory = Directory.parse(_maybe_json(resp)) if resp.status_code == 200 else None
            if directory is None:
                raise AcmeError(
                    "directory",
                    f"{url} is not an ACME directory (HTTP {resp.status_code}): set {SERVER_SETTING} to your CA's "
                    f"directory URL, such as Let's Encrypt's {LETS_ENCRYPT_DIRECTORY}",
                )
            self.client._directory = directory
        return self.client._directory

    async def _take_nonce(self) -> str:
        if self.nonce is None:
            doing = "asking the ACME server for a nonce"
            resp = await self._send("HEAD", (await self.directory()).new_nonce)
            if self.nonce is None:
                raise problem_error(Problem("serverInternal", "no Replay-Nonce header", resp.status_code), doing)
        nonce, self.nonce = self.nonce, None
        return nonce

    async def post(
        self,
        url: str,
        payload: object | None,
        *,
        doing: str,
        as_jwk: bool = False,
        accept: str = "application/json",
        answered: str | None = None,
    ) -> httpx.Response:
        """A signed POST (``payload`` None: POST-as-GET); ``badNonce`` retried, a forgotten account re-registered;
        a problem of type ``answered`` handed back as the response rather than raised."""
        reregistered = False
        for _ in range(MAX_BAD_NONCE + 1):
            kid = None if as_jwk else self.client.account_url
            body = jws.jws(self.client._key, payload, url=url, nonce=await self._take_nonce(), kid=kid)
            headers = {"Content-Type": JOSE, "Accept": accept}
            resp = await self._send("POST", url, content=json.dumps(body), headers=headers)
            if resp.status_code < 400:
                return resp
            problem = Problem.parse(_maybe_json(resp), resp.status_code)
            if answered is not None and problem.type == answered:
                return resp
            if problem.type == "badNonce":
                log.debug("badNonce from %s; retrying with the fresh nonce", url)
                continue
            if problem.type == "accountDoesNotExist" and not as_jwk and not reregistered:
                log.info("the ACME server no longer knows account %s; registering again", self.client.account_url)
                await self.register()
                reregistered = True
                continue
            raise problem_error(problem, doing)
        raise AcmeError("server", f"the ACME server kept answering badNonce while {doing}: try again later")

    async def register(self) -> None:
        """newAccount (RFC 8555 §7.3): terms agreed, bound to the external account when credentials are given."""
        url = (await self.directory()).new_account
        payload: dict[str, object] = {"termsOfServiceAgreed": True}
        eab = self.client.eab
        if eab is not None:
            payload["externalAccountBinding"] = jws.eab_jws(
                self.client._jwk, kid=eab.kid, hmac_key_b64url=eab.hmac_key_b64url, url=url
            )
        doing = "registering the account"
        resp = await self.post(url, payload, doing=doing, as_jwk=True)
        self.client.account_url = _location(resp, doing)

    async def lookup(self) -> bool:
        """Whether the CA knows the account's key (RFC 8555 §7.3.1, ``onlyReturnExisting``); its URL kept if so."""
        doing = "looking up the account"
        url = (await self.directory()).new_account
        payload = {"onlyReturnExisting": True}
        resp = await self.post(url, payload, doing=doing, as_jwk=True, answered="accountDoesNotExist")
        if resp.status_code >= 400:
            return False
        self.client.account_url = _location(resp, doing)
        return True

    async def poll(self, url: str, parse: Callable[[object], _R | None], pending: set[str], *, doing: str) -> _R:
        """POST-as-GET ``url`` until its status leaves ``pending``, waiting as ``Retry-After`` says."""
        while True:
            resp = await self.post(url, None, doing=doing)
            resource = _parsed(parse, resp, doing)
            if resource.status not in pending:
                return resource
            await asyncio.sleep(retry_after(resp.headers.get("Retry-After"), self.client.poll_interval, _utcnow()))

    async def authorize(self, url: str, host: str, publish: Publish, withdraw: Withdraw, address: str | None) -> None:
        """One authorization by HTTP-01: publish the key authorization, respond, poll, withdraw (always)."""
        doing = f"validating {host}"
        authz = _parsed(Authorization.parse, await self.post(url, None, doing=doing), doing)
        if authz.status == "valid":
            return
        challenge = authz.http01()
        if challenge is None:
            raise AcmeError("refused", f"the CA offers no HTTP-01 challenge for {host}; corral uses HTTP-01 only")
        try:
            await publish(challenge.token, self.client.key_authorization(challenge.token))
            await self.post(challenge.url, {}, doing=doing)
            authz = await self.poll(url, Authorization.parse, {"pending"}, doing=doing)
        finally:
            try:
                await withdraw(challenge.token)
            except Exception:
                log.warning("withdrawing the ACME challenge of %s failed", host, exc_info=True)
        if authz.status != "valid":
            failed = authz.http01()
            problem = failed.error if failed is not None else None
            raise challenge_error(problem or Problem("serverInternal", f"status {authz.status}", 403), host, address)


def _tls_context(ca_bundle: str | Path | None) -> ssl.SSLContext:
    if ca_bundle is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=str(ca_bundle))
    except (OSError, ssl.SSLError) as e:
        raise AcmeError(
            "ca_bundle",
            f"{CA_BUNDLE_SETTING}={ca_bundle} cannot be used as the CA bundle ({e}): point it at a readable PEM file "
            "of the certificates that the ACME server's TLS chains to, or unset it to use the system store",
        ) from None


def _transport_error(e: Exception, directory_url: str) -> AcmeError:
    chain: BaseException | None = e
    while chain is not None:
        if isinstance(chain, ssl.SSLCertVerificationError):
            return AcmeError(
                "ca_untrusted",
                f"the TLS certificate of the ACME server {directory_url} is not trusted ({chain.verify_message}): "
                f"set {CA_BUNDLE_SETTING} to a PEM file of the CA that signed it (a private ACME server), or check "
                f"{SERVER_SETTING}",
            )
        chain = chain.__cause__ or chain.__context__
    if isinstance(e, httpx.TimeoutException):
        kind, what = "unreachable", "did not answer in time"
    elif isinstance(e, httpx.UnsupportedProtocol | httpx.InvalidURL):
        kind, what = "directory", "is not an http(s) URL"
    else:
        kind, what = "unreachable", f"could not be reached ({e or type(e).__name__})"
    return AcmeError(kind, f"the ACME server {directory_url} {what}: check {SERVER_SETTING}")


def _maybe_json(resp: httpx.Response) -> object:
    try:
        return resp.json()
    except ValueError:
        return None


def _parsed(parse: Callable[[object], _R | None], resp: httpx.Response, doing: str) -> _R:
    resource = parse(_maybe_json(resp))
    if resource is None:
        raise AcmeError("server", f"the ACME server answered {doing} with a malformed document")
    return resource


def retry_after(header: str | None, default: float, now: datetime) -> float:
    """Seconds to wait before polling again: ``Retry-After`` as a number or an HTTP date (RFC 9110 §10.2.3), within
    [0, 10]; ``default`` without one."""
    if not header:
        return default
    if header.strip().isdigit():
        return min(float(header), MAX_POLL_WAIT)
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return default
    if when.tzinfo is None:
        return default
    return max(0.0, min((when - now).total_seconds(), MAX_POLL_WAIT))


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _location(resp: httpx.Response, doing: str) -> str:
    location = resp.headers.get("Location")
    if not location:
        raise AcmeError("server", f"the ACME server answered {doing} without a Location header")
    return str(location)


def _order_error(order: Order, host: str) -> AcmeError:
    if order.error is not None:
        return problem_error(order.error, f"issuing the certificate of {host}")
    return AcmeError("server", f"the order of {host} ended {order.status!r} without saying why")


def _csr(key: ec.EllipticCurvePrivateKey, host: str) -> bytes:
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def _issued(chain_pem: str, key: ec.EllipticCurvePrivateKey, host: str) -> Issued:
    try:
        leaf = x509.load_pem_x509_certificates(chain_pem.encode("ascii"))[0]
    except (ValueError, UnicodeEncodeError, IndexError):
        raise AcmeError("server", f"the ACME server sent a certificate chain for {host} that does not parse") from None
    return Issued(
        fullchain_pem=chain_pem,
        key_pem=jws.key_pem(key).decode("ascii"),
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
    )
