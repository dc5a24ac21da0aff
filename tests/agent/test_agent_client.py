"""The server-side AgentClient against a real agent, and its error mapping."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import pytest
from agent_harness import TOKEN, AgentProc

from corral.agent.protocol import JobSubmission
from corral.backends.agent_client import AgentClient, AgentError, AgentUnreachable


async def test_client_round_trip(agent: AgentProc) -> None:
    async with AgentClient(agent.url, TOKEN) as c:
        assert (await c.health())["status"] == "ok"
        info = await c.info()
        assert info.cpus >= 1
        st = await c.submit(JobSubmission("cli-1", "run", ["echo a", "sleep 0.3", "echo b"]))
        assert st.job_id == "cli-1" and st.state in ("running", "done")
        got: list[bytes] = []
        offset = 0
        t0 = time.monotonic()
        while True:
            reply = await c.logs("cli-1", offset, wait=10)
            got += [e.message for e in reply.entries]
            offset = reply.next_offset
            if reply.state.finished and not reply.entries:
                break
        assert got == [b"a\n", b"b\n"] and time.monotonic() - t0 < 3
        assert (await c.state("cli-1")).state == "done"
        assert "cli-1" in [j.job_id for j in await c.list_jobs()]
        await c.submit(JobSubmission("cli-2", "run", ["sleep 60"]))
        assert (await c.stop("cli-2", abort=True)).job_id == "cli-2"
        while not (await c.state("cli-2")).finished:
            await asyncio.sleep(0.05)
        await c.forget("cli-2")
        with pytest.raises(AgentError) as e:
            await c.state("cli-2")
        assert e.value.status_code == 404 and "not found" in str(e.value)


async def test_long_poll_outlives_default_timeout(agent: AgentProc) -> None:
    async with AgentClient(agent.url, TOKEN, timeout=0.5) as c:
        await c.submit(JobSubmission("cli-slow", "run", ["sleep 1", "echo late"]))
        reply = await c.logs("cli-slow", 0, wait=5)
        assert [e.message for e in reply.entries] == [b"late\n"]


async def test_bad_token_is_agent_error(agent: AgentProc) -> None:
    async with AgentClient(agent.url, "wrong") as c:
        assert (await c.health())["status"] == "ok"
        with pytest.raises(AgentError) as e:
            await c.list_jobs()
        assert e.value.status_code == 403


async def test_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with AgentClient(f"http://127.0.0.1:{port}", TOKEN, timeout=1) as c:
        with pytest.raises(AgentUnreachable):
            await c.health()


async def test_invalid_reply_is_agent_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        replies: dict[str, Any] = {
            "/jobs/x": {"job_id": "x", "state": "exploded"},
            "/jobs": {"not": "a list"},
            "/info": {"hostname": "h"},
        }
        if request.url.path == "/slow":
            raise httpx.ReadTimeout("slow", request=request)
        return httpx.Response(200, json=replies[request.url.path])

    c = AgentClient("http://agent", TOKEN)
    await c.aclose()
    c._client = httpx.AsyncClient(base_url="http://agent", transport=httpx.MockTransport(handler))
    with pytest.raises(AgentError, match=r"JobState\.state"):
        await c.state("x")
    with pytest.raises(AgentError, match="expected a list"):
        await c.list_jobs()
    with pytest.raises(AgentError, match=r"invalid reply to GET /info: HostInfo\."):
        await c.info()
    with pytest.raises(AgentUnreachable):
        await c._request("GET", "/slow")
    await c.aclose()
