"""A corral server in the benchmark's own process: fresh state under a temporary directory (SQLite, the
local backend; the job sandbox when run as root), served by uvicorn on a free loopback port, and on the
way out stopped with every job it started reaped. For benchmarks that need the server's internals (its
database engines, its settings) beside HTTP."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib.servers import free_port

TOKEN = "bench-token"


@dataclass
class InProcess:
    url: str
    token: str
    prepared: Any  # corral.server.Prepared
    settings: Any  # corral.settings.Settings


@asynccontextmanager
async def in_process_server(prefix: str, **overrides: Any) -> AsyncIterator[InProcess]:
    import uvicorn

    from corral.server import KEEP_ALIVE_S, prepare
    from corral.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    settings = Settings.from_env(
        {},
        server_dir=tmp / "server",
        database_url=f"sqlite+aiosqlite:///{tmp / 'server' / 'corral.db'}",
        admin_token=TOKEN,
        write_cli_config=False,
        safety_net_interval=60.0,
        sandbox="on" if os.geteuid() == 0 else "off",
        **overrides,
    )
    prepared = await prepare(settings)
    port = free_port()
    config = uvicorn.Config(
        prepared.app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield InProcess(f"http://127.0.0.1:{port}", TOKEN, prepared, settings)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        for compute in prepared.ctx.computes.values():
            if hasattr(compute, "reap_grace"):
                compute.reap_grace = 0.0
            await compute.reap_unknown(set())
        await prepared.ctx.db.dispose()
