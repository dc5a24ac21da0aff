"""``serve``: open the three listeners (:80, :443, the management API) for a loaded :class:`Gateway`, prune the
rate buckets now and then, and stop gracefully on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Optional

from .listeners import handle_client
from .live import Gateway
from .management import handle_management

log = logging.getLogger("corral.gateway")
SHUTDOWN_GRACE = 10.0
PRUNE_EVERY = 60.0


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _prune(gw: Gateway) -> None:
    while True:
        await asyncio.sleep(PRUNE_EVERY)
        gw.buckets.prune(int(gw.clock() * 1000))


async def _listen(gw: Gateway, management: str, http: Optional[str], https: Optional[str]) -> list[asyncio.Server]:
    async def on_http(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await handle_client(gw, r, w, False)

    async def on_https(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await handle_client(gw, r, w, True)

    async def on_management(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await handle_management(gw, r, w)

    servers: list[asyncio.Server] = []
    try:
        servers.append(await asyncio.start_server(on_management, *_address(management)))
        if http:
            servers.append(await asyncio.start_server(on_http, *_address(http), backlog=1024))
        if https:
            servers.append(await asyncio.start_server(on_https, *_address(https), ssl=gw.tls_context(), backlog=1024))
    except OSError:
        for server in servers:
            server.close()
        raise
    for server in servers:
        for sock in server.sockets:
            log.info("listening on %s:%s", *sock.getsockname()[:2])
    return servers


async def serve(gw: Gateway, management: str, http: Optional[str], https: Optional[str]) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit status."""
    try:
        servers = await _listen(gw, management, http, https)
    except OSError as e:
        log.error("cannot listen: %s", e)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pruner = asyncio.ensure_future(_prune(gw))
    await stop.wait()
    log.info("stopping: no new connections; waiting up to %.0f s for %d open ones", SHUTDOWN_GRACE, len(gw.connections))
    pruner.cancel()
    for server in servers:
        server.close()
    if gw.connections:
        _, pending = await asyncio.wait(set(gw.connections), timeout=SHUTDOWN_GRACE)
        for task in pending:
            task.cancel()
    log.info("stopped")
    return 0
