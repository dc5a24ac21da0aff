"""The client of a gateway process's management API (``corral.gateway``; reached through the local end of the
host's forward, :meth:`corral.backends.gateway_link.GatewayLink.management_url`).

Every request carries the gateway's management token. A gateway that does not answer raises
:class:`GatewayUnreachable`; one that refuses a request (its 400 ``{"detail": ...}``, a 401 for a wrong token)
raises :class:`GatewayRefused` with its words. Answers are parsed into frozen values here, so that nothing
past this module sees the wire's JSON.

May import: httpx, ``domain``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from corral.domain.gateway_ops import Registered, ServiceStats, WindowStats

#: Seconds a management request may take (the gateway answers from memory; a certificate is parsed at most).
TIMEOUT = 10.0


class GatewayUnreachable(Exception):
    """The gateway's management API did not answer (the tunnel, the host or the process is down)."""


class GatewayRefused(Exception):
    """The gateway answered with an error; the message is its ``detail``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{detail} (HTTP {status})")
        self.status = status
        self.detail = detail


def _p(part: str) -> str:
    return quote(part, safe="")


def _stats(raw: Mapping[str, Any]) -> dict[int, WindowStats]:
    out = {}
    for window, w in raw.items():
        out[int(window)] = WindowStats(int(w.get("requests") or 0), float(w.get("request_time") or 0.0))
    return out


class GatewayApi:
    def __init__(self, url: str, token: str, timeout: float = TIMEOUT) -> None:
        self.url = url
        self._client = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, trust_env=False
        )

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        try:
            r = await self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise GatewayUnreachable(f"{method} {path}: {type(e).__name__}: {e}".rstrip(": ")) from None
        if r.status_code >= 400:
            try:
                detail = str(r.json().get("detail"))
            except Exception:
                detail = r.text[:300] or r.reason_phrase
            raise GatewayRefused(r.status_code, f"{method} {path}: {detail}")
        try:
            return r.json()
        except ValueError:
            raise GatewayRefused(r.status_code, f"{method} {path}: the answer is not JSON") from None

    async def health(self) -> str:
        """The gateway's version."""
        return str((await self._call("GET", "/api/health")).get("version"))

    async def configure(self, server_url: str, secret: str) -> None:
        await self._call("PUT", "/api/config", {"server_url": server_url, "secret": secret})

    async def register(self, project: str, run: str, body: Mapping[str, Any]) -> None:
        await self._call("PUT", f"/api/services/{_p(project)}/{_p(run)}", body)

    async def unregister(self, project: str, run: str) -> None:
        await self._call("DELETE", f"/api/services/{_p(project)}/{_p(run)}")

    async def services(self) -> list[Registered]:
        got = await self._call("GET", "/api/services")
        return [
            Registered(str(s["project"]), str(s["run"]), str(s["host"]), bool(s.get("https")))
            for s in got.get("services") or []
        ]

    async def put_entrypoint(self, host: str, project: str, https: bool) -> None:
        await self._call("PUT", f"/api/entrypoints/{_p(host)}", {"project": project, "https": https})

    async def delete_entrypoint(self, host: str) -> None:
        await self._call("DELETE", f"/api/entrypoints/{_p(host)}")

    async def put_challenge(self, token: str, key_authorization: str) -> None:
        await self._call("PUT", f"/api/challenges/{_p(token)}", {"key_authorization": key_authorization})

    async def delete_challenge(self, token: str) -> None:
        await self._call("DELETE", f"/api/challenges/{_p(token)}")

    async def put_certificate(self, host: str, fullchain_pem: str, key_pem: str) -> None:
        await self._call("PUT", f"/api/certificates/{_p(host)}", {"fullchain_pem": fullchain_pem, "key_pem": key_pem})

    async def certificates(self) -> dict[str, str]:
        """Host -> the certificate's ``not_after`` (ISO 8601) for every certificate the gateway serves."""
        got = await self._call("GET", "/api/certificates")
        return {str(c["host"]): str(c["not_after"]) for c in got.get("certificates") or []}

    async def stats(self) -> list[ServiceStats]:
        got = await self._call("GET", "/api/stats")
        return [
            ServiceStats(str(s["project"]), str(s["run"]), _stats(s.get("stats") or {}))
            for s in got.get("services") or []
        ]

    async def aclose(self) -> None:
        await self._client.aclose()
