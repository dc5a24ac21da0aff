"""The SSH endpoint's one watcher for all open connections (``sshd.endpoint.Endpoint``): one lookup per
tick for every tracked job, a connection closed once its job no longer admits it, and the jobs with a
connection open 10 s or more recorded as active -- in one write, at most every ``SEEN_EVERY_S``."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from corral.services import ssh_access
from corral.sshd import endpoint


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_one_watcher_for_every_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint, "WATCH_S", 0.01)
    monkeypatch.setattr(endpoint, "SEEN_EVERY_S", 10.0)
    lookups: list[list[str]] = []
    seen: list[list[str]] = []
    admitted = {"busy": True, "ended-in-grace": False}  # "stopped" is not admitted any more

    async def fake_admitted(ctx: Any, job_ids: list[str], now: float) -> dict[str, bool]:
        lookups.append(sorted(job_ids))
        return {j: admitted[j] for j in job_ids if j in admitted}

    async def fake_seen(ctx: Any, job_ids: list[str], now: float) -> None:
        seen.append(sorted(job_ids))

    monkeypatch.setattr(ssh_access, "admitted", fake_admitted)
    monkeypatch.setattr(ssh_access, "record_seen", fake_seen)
    # (no context: the watcher's two calls that read one, ssh_access's, are replaced above)
    ep = endpoint.Endpoint(SimpleNamespace(), "127.0.0.1", 0, "127.0.0.1")  # type: ignore[arg-type]
    conns = {name: [FakeConn(), FakeConn()] for name in ("busy", "ended-in-grace", "stopped")}
    untrack = {name: [ep.track(name, c) for c in cs] for name, cs in conns.items()}
    ep._opened[conns["busy"][0]] = time.time() - 30  # open long enough to count as activity
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(lookups) >= 5:
            break
    assert all(len(ids) <= 3 for ids in lookups) and lookups[0] == ["busy", "ended-in-grace", "stopped"]
    assert all(c.closed for c in conns["stopped"]) and not any(c.closed for c in conns["busy"])
    assert not any(c.closed for c in conns["ended-in-grace"])
    assert seen == [["busy"]], seen  # once (SEEN_EVERY_S), and only the running job with a counting one
    for name in ("stopped", "ended-in-grace"):
        for u in untrack[name]:
            u()
    first, second = untrack["busy"]
    first()  # it counted: closing it is activity too
    for _ in range(500):
        if len(seen) >= 2:
            break
        await asyncio.sleep(0.01)
    assert seen[-1] == ["busy"] and len(seen) == 2
    second()
    assert ep.connections == {}
    watcher = ep._watcher
    assert watcher is not None
    await asyncio.wait_for(watcher, 5)  # its last pass, run to its end (no connection is left to watch)
    await ep.close()  # (and the activity beats closing a connection started)
    assert len(seen) == 2  # the other never counted
    assert ep._watcher is None
