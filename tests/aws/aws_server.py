"""The aws tests' server: the test's ``config.yml`` written in a fresh state directory, a corral server
started on it with an AWS fleet applied, and on the way out (``cleanup``) the fleet deleted and, where
the next tests need EC2 clean, its instances (``"fleet"``) or every instance (``"all"``) waited out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from moto_harness import Hypervisor

from server_harness import RunningServer, make_settings, running_server, wait_for

_LIVE = ["pending", "running", "shutting-down"]


@asynccontextmanager
async def fleet_server(
    tmp: Path,
    config: str,
    fleet: dict[str, Any],
    hypervisor: Hypervisor | None = None,
    cleanup: Literal["none", "delete", "fleet", "all"] = "delete",
    **overrides: Any,
) -> AsyncIterator[RunningServer]:
    """A server with ``config`` and ``fleet`` applied (settings: ``provisioning_timeout`` 60 s and
    ``overrides``); ``cleanup`` ``"fleet"`` and ``"all"`` need the ``hypervisor``."""
    settings = make_settings(tmp, **{"provisioning_timeout": 60.0, **overrides})
    settings.server_dir.mkdir(parents=True)
    (settings.server_dir / "config.yml").write_text(config)
    async with running_server(settings) as s:
        async with s.client() as c:
            body = {"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": True}
            r = await c.post("/api/project/main/fleets/apply", json=body)
            assert r.status_code == 200, r.text
        yield s
        if cleanup == "none":
            return
        async with s.client() as c:
            r = await c.post("/api/project/main/fleets/delete", json={"names": [fleet["name"]]})
            assert r.status_code == 200, r.text
        if cleanup == "delete":
            return
        assert hypervisor is not None, "waiting for the instances to go needs the hypervisor"
        mine = {"Key": "corral_fleet", "Value": fleet["name"]}

        async def gone() -> bool:
            live = hypervisor.moto.instances(instance_state_name=_LIVE)
            return not [i for i in live if cleanup == "all" or mine in (i.get("Tags") or [])]

        await wait_for(gone, timeout=60)
