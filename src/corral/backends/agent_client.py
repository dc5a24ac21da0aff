"""Async client of the host agent's HTTP API (see :mod:`corral.agent.server`).

One pool of keep-alive connections per agent (:mod:`corral.backends.agent_http`). Failures come out as two
exceptions: :class:`AgentUnreachable` (connection refused, timeouts, broken connections: retry later or
declare the host lost) and :class:`AgentError` (the agent answered, but with a non-2xx status or a
reply that fails protocol validation; the message says what was wrong). Long-poll calls
(``logs(wait=...)``) wait up to ``wait + timeout`` for their reply.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from corral.agent.protocol import HostInfo, JobState, JobSubmission, LogsReply, ProtocolError
from corral.agent.protocol_sandbox import AddressReply
from corral.backends.agent_http import AgentHttp, Unreachable

T = TypeVar("T")
#: The most output entries one ``logs`` reply carries (fewer in a finished job's reply: all it had left).
LOGS_LIMIT = 1000


class AgentClientError(Exception):
    """Base of the agent client's errors."""


class AgentUnreachable(AgentClientError):
    """The agent could not be reached or did not answer in time."""


class AgentError(AgentClientError):
    """The agent answered with an error status or an invalid reply."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class AgentClient:
    def __init__(self, base_url: str, token: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = AgentHttp(self.base_url, {"Authorization": f"Bearer {token}"})

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        read_timeout: float | None = None,
        content: bytes | None = None,
    ) -> Any:
        body = content if content is not None else None if json is None else jsonlib.dumps(json).encode()
        try:
            resp = await self._http.request(
                method,
                path,
                params=params,
                body=body,
                content_type="application/octet-stream" if content is not None else "application/json",
                connect_timeout=self.timeout,
                timeout=read_timeout if read_timeout is not None else self.timeout,
            )
        except Unreachable as e:
            raise AgentUnreachable(f"agent at {self.base_url}: {method} {path}: {e}") from e
        try:
            data = orjson.loads(resp.body) if resp.body else None
        except ValueError:
            data = None
        if not 200 <= resp.status < 300:
            detail = data.get("error") if isinstance(data, dict) else None
            if not isinstance(detail, str):
                detail = resp.body[:200].decode("utf-8", "replace")
            raise AgentError(f"agent {method} {path}: HTTP {resp.status}: {detail}", resp.status)
        if data is None and resp.body:
            raise AgentError(f"agent {method} {path}: the reply is not JSON", resp.status)
        return data

    @staticmethod
    def _parse(what: str, fn: Callable[[Any], T], data: Any) -> T:
        try:
            return fn(data)
        except ProtocolError as e:
            raise AgentError(f"invalid reply to {what}: {e}") from e

    async def health(self) -> dict[str, Any]:
        data = await self._request("GET", "/health")
        if not isinstance(data, dict) or data.get("status") != "ok":
            raise AgentError(f"unexpected /health reply: {data!r}"[:300])
        return data

    async def info(self) -> HostInfo:
        # detection may run nvidia-smi and docker info on first call: allow more time
        data = await self._request("GET", "/info", read_timeout=self.timeout + 30.0)
        return self._parse("GET /info", HostInfo.from_dict, data)

    async def submit(self, submission: JobSubmission) -> JobState:
        data = await self._request("POST", "/jobs", json=submission.to_dict(), read_timeout=self.timeout + 10.0)
        return self._parse("POST /jobs", JobState.from_dict, data)

    async def reserve_address(self, job_id: str) -> str | None:
        """The job's address in its sandbox, reserved before it is submitted (None: no sandbox there)."""
        data = await self._request("POST", f"/jobs/{job_id}/address", json={})
        return self._parse(f"POST /jobs/{job_id}/address", AddressReply.from_dict, data).address

    async def state(self, job_id: str) -> JobState:
        data = await self._request("GET", f"/jobs/{job_id}")
        return self._parse("GET /jobs/{id}", JobState.from_dict, data)

    async def list_jobs(self) -> list[JobState]:
        data = await self._request("GET", "/jobs")
        if not isinstance(data, list):
            raise AgentError("invalid reply to GET /jobs: expected a list")
        return [self._parse("GET /jobs", JobState.from_dict, d) for d in data]

    async def logs(
        self,
        job_id: str,
        offset: int,
        wait: float = 0,
        limit: int = LOGS_LIMIT,
        state: str | None = None,
        metrics_after: int | None = None,
        acked: bool = False,
    ) -> LogsReply:
        """Entries from ``offset``; with ``wait``, a long poll that also ends when the job's state changes
        (at once if it is no longer ``state``); with ``metrics_after`` (µs), also the job's resource samples
        taken after it; ``acked``: the entries before ``offset`` are stored, the agent may drop them."""
        params: dict[str, Any] = {"offset": offset, "limit": limit, "wait": wait}
        if acked:
            params["acked"] = 1
        if state is not None:
            params["state"] = state
        if metrics_after is not None:
            params["metrics_after"] = max(1, metrics_after)
        data = await self._request(
            "GET", f"/jobs/{job_id}/logs", params=params, read_timeout=max(0.0, wait) + self.timeout
        )
        return self._parse("GET /jobs/{id}/logs", LogsReply.from_dict, data)

    async def stop(
        self, job_id: str, abort: bool = False, deadline: float | None = None, message: str | None = None
    ) -> JobState:
        """Stop the job; with a ``deadline`` (a preemption) the job can read it and is killed then."""
        body: dict[str, object] = {"abort": abort}
        if deadline is not None:
            body.update(deadline=deadline, message=message or "")
        data = await self._request("POST", f"/jobs/{job_id}/stop", json=body)
        return self._parse("POST /jobs/{id}/stop", JobState.from_dict, data)

    async def has_blob(self, blob_hash: str) -> bool:
        """Whether the agent already holds the blob (so it need not be sent again)."""
        try:
            await self._request("GET", f"/blobs/{blob_hash}")
        except AgentError as e:
            if e.status_code == 404 and "not found" in str(e):
                return False
            raise
        return True

    async def put_blob(self, blob_hash: str, data: bytes) -> None:
        """Send a blob; the agent checks that ``data`` hashes to ``blob_hash``."""
        slack = self.timeout + 60.0 + len(data) / 2**20  # a second per MiB on top
        await self._request("PUT", f"/blobs/{blob_hash}", content=data, read_timeout=slack)

    async def forget(self, job_id: str) -> None:
        await self._request("DELETE", f"/jobs/{job_id}")

    async def shutdown(self) -> None:
        await self._request("POST", "/shutdown")
