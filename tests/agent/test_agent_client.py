"""The server-side AgentClient against a real agent, and its error mapping."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

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
            got += [e.message for e in reply.entries if e.source != "agent"]  # its output, not the agent's lines
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
        offset, got = 0, list[bytes]()
        while not got:  # the agent's own lines about the job come first (its output's source is not theirs)
            reply = await c.logs("cli-slow", offset, wait=5)
            offset, got = reply.next_offset, [e.message for e in reply.entries if e.source != "agent"]
        assert got == [b"late\n"]


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


async def _canned_agent(replies: dict[str, bytes], slow: set[str]) -> tuple[asyncio.Server, str]:
    """An HTTP/1.1 server on loopback that answers each path with its canned JSON (keeping the connection),
    and never answers the paths in ``slow``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().split("?")[0]
                if path in slow:
                    await asyncio.sleep(30)
                body = replies[path]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_invalid_reply_is_agent_error() -> None:
    replies = {
        "/jobs/x": b'{"job_id": "x", "state": "exploded"}',
        "/jobs": b'{"not": "a list"}',
        "/info": b'{"hostname": "h"}',
        "/text": b"not json",
    }
    server, url = await _canned_agent(replies, {"/slow"})
    async with server, AgentClient(url, TOKEN, timeout=0.5) as c:
        with pytest.raises(AgentError, match=r"JobState\.state"):
            await c.state("x")
        with pytest.raises(AgentError, match="expected a list"):
            await c.list_jobs()
        with pytest.raises(AgentError, match=r"invalid reply to GET /info: HostInfo\."):
            await c.info()
        with pytest.raises(AgentError, match="the reply is not JSON"):
            await c._request("GET", "/text")
        with pytest.raises(AgentUnreachable, match=r"no reply within 0\.5 s"):
            await c._request("GET", "/slow")


async def test_a_connection_the_agent_closed_while_idle_is_replaced_at_once(agent: AgentProc) -> None:
    """The agent closes connections idle past its idle timeout; the next request on one goes out again on a
    new connection instead of failing."""
    async with AgentClient(agent.url, TOKEN) as c:
        assert (await c.health())["status"] == "ok"
        idle = list(c._http._idle)
        assert len(idle) == 1
        idle[0][1].transport.abort()  # as if the agent had closed it: the request on it gets no reply
        c._http._idle = [(_LooksOpen(idle[0][0]), _LooksOpen(idle[0][1]))]  # type: ignore[list-item]
        assert (await c.health())["status"] == "ok"
        assert len(c._http._idle) == 1 and c._http._idle[0][0] is not idle[0][0]  # a new connection, kept


class _LooksOpen:
    """A closed connection's reader or writer that still looks open (the agent's close not seen yet)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def at_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
