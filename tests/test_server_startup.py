"""Start-up stays cheap: preparing a server over existing state imports none of what only later work needs
(the docs' schema machinery, httpx, cryptography, Alembic, asyncssh, FastAPI, the Postgres dialect) and
builds no request model, and the warm-up after start-up does what the first requests would otherwise
(cryptography excepted: the first seal or open imports it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from corral.server import prepare
    from corral.settings import Settings

    tmp = Path(sys.argv[1])
    settings = Settings(
        server_dir=tmp / "server",
        database_url=f"sqlite+aiosqlite:///{tmp / 'server' / 'data' / 'corral.db'}",
        admin_token="t",
        write_cli_config=False,
    )

    async def main():
        prepared = await prepare(settings)
        await prepared.ctx.db.dispose()

    def unbuilt():
        from corral.schemas.requests import Body
        todo, out = [Body], []
        while todo:
            model = todo.pop()
            todo.extend(model.__subclasses__())
            if not model.__pydantic_complete__:
                out.append(model.__name__)
        return sorted(out)

    asyncio.run(main())
    after_start, unbuilt_at_start = sorted(sys.modules), unbuilt()
    if sys.argv[2] == "warm":
        from corral.workers.runtime import warm_up
        warm_up()
    print(json.dumps({"start": after_start, "warm": sorted(sys.modules), "unbuilt": [unbuilt_at_start, unbuilt()]}))
    """
)

LATER = [
    "fastapi",
    "httpx",
    "cryptography",
    "alembic",
    "asyncssh",
    "websockets",
    "corral.api.openapi",
    "corral.schemas.responses",  # the answers' models: the API document's, built on its first request
    "corral.schemas.responses_runs",
    "corral.schemas.responses_volumes",
    "corral.schemas.responses_scheduling",
    "corral.services.oauth",
    "sqlalchemy.dialects.postgresql",  # a SQLite server needs only the SQLite dialect
    "corral.config.runs",  # the configuration models: on first use, or in the warm-up thread
    "corral.config.fleets",
    "corral.config.parsing",
    "corral.ui",  # the web UI: on the first page request
    "jinja2",
    "boto3",  # the aws backend's SDK: on its first EC2 call
    "botocore",
]


def _modules(tmp: Path, mode: str) -> dict[str, list[Any]]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp), mode], capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, list[Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _loaded(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_start_over_existing_state_imports_only_what_start_up_needs(tmp_path: Path) -> None:
    first = _modules(tmp_path, "cold")
    assert _loaded(first["start"], "alembic")  # fresh state: migrations ran
    warm = _modules(tmp_path, "warm")
    for name in LATER:
        assert not _loaded(warm["start"], name), f"{name} is imported at start-up"
    assert _loaded(warm["start"], "starlette")
    assert not _loaded(warm["warm"], "httpx")  # the server speaks to agents without it (backends/agent_http.py)
    # cryptography: on the first seal or open (about 7 MiB an idle server does not keep), not in the warm-up
    assert not _loaded(warm["warm"], "cryptography")
    at_start, after_warm_up = warm["unbuilt"]
    assert {"ApplyRunBody", "ListRunsBody", "CreateExportBody"} <= set(at_start)  # built lazily...
    assert after_warm_up == []  # ...or all at once by the warm-up


async def test_warm_up_waits_until_the_server_serves(tmp_path: Path, monkeypatch: Any) -> None:
    """The warm-up thread would hold the GIL against the end of start-up and the first requests: it starts
    ``WARM_UP_DELAY`` after the workers do, and still runs."""
    import time

    from corral.workers import runtime
    from server_harness import make_settings, running_server, wait_for

    calls: list[float] = []
    monkeypatch.setattr(runtime, "warm_up", lambda: calls.append(time.monotonic()))
    started = time.monotonic()
    async with running_server(make_settings(tmp_path)) as server, server.client() as client:
        assert (await client.post("/api/server/get_info")).status_code == 200
        assert calls == [] or calls[0] - started >= runtime.WARM_UP_DELAY

        async def warmed() -> list[float]:
            return calls

        await wait_for(warmed, timeout=10)
    assert calls[0] - started >= runtime.WARM_UP_DELAY


async def test_first_passes_wait_until_the_server_serves(tmp_path: Path, monkeypatch: Any) -> None:
    """The workers' first passes (the last server's leftovers) run ``FIRST_PASS_DELAY`` after start-up, not
    during it; then they run without any other wake-up."""
    import time

    from corral.workers import runtime
    from corral.workers.scheduling import Scheduling
    from server_harness import make_settings, running_server, wait_for

    passes: list[float] = []
    original = Scheduling.pass_once

    async def recording(self: Scheduling) -> Any:
        passes.append(time.monotonic())
        return await original(self)

    monkeypatch.setattr(Scheduling, "pass_once", recording)
    started = time.monotonic()
    async with running_server(make_settings(tmp_path, safety_net_interval=60.0)):
        assert passes == [] or passes[0] - started >= runtime.FIRST_PASS_DELAY

        async def first_pass() -> list[float]:
            return passes

        await wait_for(first_pass, timeout=10)
    assert passes[0] - started >= runtime.FIRST_PASS_DELAY
