"""The follower's long poll of a job's agent: new output, a change of state, and the job's resource samples,
cut short when the follower is poked (a stop to send now).

May import: corral.backends (the agent client) and the agent's protocol.
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.agent.protocol import LogsReply
from corral.backends.agent_client import AgentClient


async def logs_unless_poked(
    client: AgentClient,
    job_id: str,
    offset: int,
    wait: float,
    poke: asyncio.Event | None,
    known_state: str | None = None,
    metrics_after: int | None = None,
) -> LogsReply | None:
    """The agent's long poll for new output (or a change of the job's state from ``known_state``), with the
    job's samples after ``metrics_after``, or None as soon as ``poke`` is set (the poll is dropped)."""
    # ``offset`` is what the database holds: the agent may drop what is before it (stored once)
    poll = client.logs(job_id, offset, wait=wait, state=known_state, metrics_after=metrics_after, acked=True)
    if poke is None or wait <= 0:
        return await poll
    return await poll_unless_poked(asyncio.ensure_future(poll), poke)


async def poll_unless_poked(poll: asyncio.Future[LogsReply], poke: asyncio.Event | None) -> LogsReply | None:
    """A long poll sent already (its reply), or None as soon as ``poke`` is set (the poll is dropped)."""
    if poke is None:
        return await poll
    poked: asyncio.Future[Any] = asyncio.ensure_future(poke.wait())
    try:
        await asyncio.wait({poll, poked}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        poked.cancel()
        if not poll.done():
            poll.cancel()
    return poll.result() if poll.done() and not poll.cancelled() else None
