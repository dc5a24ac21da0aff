"""The running gateway's state: the served state (in memory, and on disk on every change), the TLS contexts by
host and SNI's choice among them, the rate buckets, stats and auth cache, and the open connections."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Optional

from . import statefile
from .core.authcache import AuthCache
from .core.model import State
from .core.ratelimit import Buckets
from .core.routing import Table, build_table
from .core.stats import ServiceStats
from .forward import UpstreamPool


class Gateway:
    def __init__(self, state_dir: str, token: str, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = state_dir
        self.token = token
        self.clock = clock
        self.state = State()
        self.table: Table = {}
        self.contexts: dict[str, ssl.SSLContext] = {}
        self.buckets = Buckets()
        self.stats: dict[tuple[str, str], ServiceStats] = {}
        self.auth = AuthCache()
        self.auth_checks: dict[tuple[str, str], asyncio.Future[bool]] = {}
        self.upstream = UpstreamPool()
        self.started_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.connections: set[asyncio.Task[None]] = set()

    def load(self) -> list[str]:
        """Read the state directory; returns the problems found with stored certificates."""
        statefile.prepare(self.state_dir)
        state = statefile.load(self.state_dir)
        self.contexts, problems = statefile.load_contexts(self.state_dir, state)
        self._install(state)
        return problems

    def commit(self, state: State) -> None:
        """Persist ``state``, then serve it."""
        statefile.save(self.state_dir, state)
        self._install(state)

    def _install(self, state: State) -> None:
        self.state = state
        self.table = build_table(state)
        self.stats = {key: self.stats.get(key) or ServiceStats() for key in state.services}

    def stats_of(self, key: Optional[tuple[str, str]]) -> Optional[ServiceStats]:
        return None if key is None else self.stats.get(key)

    # -- TLS -------------------------------------------------------------------------------------------------
    def tls_context(self) -> ssl.SSLContext:
        """The listener's context: no certificate of its own; SNI picks the host's, an unknown name is refused."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        ctx.sni_callback = self._sni
        return ctx

    def _sni(self, sslobj: ssl.SSLObject, server_name: Optional[str], _: ssl.SSLContext) -> Optional[int]:
        ctx = self.contexts.get((server_name or "").lower())
        if ctx is None:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        sslobj.context = ctx
        return None

    def track(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
            task.add_done_callback(self.connections.discard)
