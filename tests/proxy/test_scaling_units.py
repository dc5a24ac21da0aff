"""Services II's parts without a server: held requests at zero replicas (served once a replica appears,
a fast ``full`` beyond the queue, ``timed out`` past the timeout, woken by a route change), the
request counter (one write per service and second however many requests, the count written at once for a
cold start), dstack's rule of what a re-apply may change in place, each replica group's range and scaling
as the scaling worker reads them, and the settings from the environment."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from corral.config.parsing import parse_run_configuration
from corral.domain.autoscaling import Scaling
from corral.proxy import stats
from corral.proxy.cache import Cache
from corral.proxy.cold_start import FULL, TIMED_OUT, ColdStart
from corral.services import service_stats
from corral.services.service_updates import changed_fields
from corral.settings import Settings, SettingsError
from corral.store.service_replicas import Route
from corral.workers.service_scaling import GroupConf, group_confs


def _route(replicas: tuple[Any, ...] = ()) -> Route:
    return Route("run-1", "p", True, True, replicas, scales_from_zero=True)


@pytest.mark.asyncio
async def test_held_requests_served_full_and_timed_out() -> None:
    current = {"route": _route()}

    async def load(_key: tuple[str, str]) -> Route | None:
        return current["route"]

    triggered: list[str] = []

    async def trigger(run_id: str) -> None:
        triggered.append(run_id)

    routes: Cache[tuple[str, str], Route | None] = Cache(load, 60.0)
    cold = ColdStart(routes, trigger, queue=2, timeout=5.0)
    key = ("p", "svc")
    waiters = [asyncio.create_task(cold.wait(key, _route())) for _ in range(2)]
    for _ in range(1000):  # until both are held (each one's first look found no replica)
        if sum(cold.held.values()) == 2:
            break
        await asyncio.sleep(0.01)
    assert sum(cold.held.values()) == 2, cold.held
    assert await cold.wait(key, _route()) == FULL  # beyond the queue: at once
    current["route"] = _route(("a-replica",))
    routes.clear()
    cold.changed()  # a replica became ready
    served = await asyncio.wait_for(asyncio.gather(*waiters), 2)
    assert all(isinstance(r, Route) and r.replicas for r in served)
    assert triggered == ["run-1", "run-1"] and cold.held == {}
    current["route"] = _route()
    routes.clear()
    short = ColdStart(routes, trigger, queue=5, timeout=0.2)
    assert await short.wait(key, _route()) == TIMED_OUT


@pytest.mark.asyncio
async def test_one_write_per_service_and_second(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[list[tuple[str, int, int]]] = []
    woken: list[bool] = []

    async def record(_ctx: Any, rows: list[tuple[str, int, int]], wake: bool = False) -> None:
        written.append(sorted(rows))
        woken.append(wake)

    monkeypatch.setattr(service_stats, "record", record)
    counter = stats.RequestCounter(ctx=None)  # type: ignore[arg-type]
    for _ in range(500):
        counter.count("a")
    for _ in range(7):
        counter.count("b")
    deadline = asyncio.get_running_loop().time() + 10
    while not written:  # the once-a-second flush (on a loaded machine it may come late, never twice as one)
        assert asyncio.get_running_loop().time() < deadline, "no flush within 10 s"
        await asyncio.sleep(0.05)
    assert len(written) == 1 and {r[0]: r[2] for r in written[0]} == {"a": 500, "b": 7}
    counter.count("c")
    counter.count("d")
    await counter.flush_now("c")
    assert written[-1][0][0] == "c" and written[-1][0][2] == 1 and woken[-1] is True
    counter.close()


def test_what_a_reapply_may_change_in_place() -> None:
    old: dict[str, Any] = {"run_name": "s", "configuration": {"type": "service", "env": {"V": "1"}, "auth": True}}
    assert changed_fields(old, {**old, "configuration": {**old["configuration"], "env": {"V": "2"}}}) == ["env"]
    assert changed_fields(old, {**old, "configuration": {**old["configuration"], "auth": False}}) is None
    assert changed_fields(old, {**old, "ssh_key_pub": "other"}) is None
    assert changed_fields(old, {**old, "repo_code_hash": "h"}) == ["repo_code_hash"]
    https = {**old, "configuration": {**old["configuration"], "https": True}}
    assert changed_fields(old, https) == ["https"]


def test_each_replica_group_scales_on_its_own_range_and_scaling() -> None:
    scaling = {"metric": "rps", "target": 5, "window": "30s", "scale_up_delay": "30s", "scale_down_delay": "5m"}
    conf = parse_run_configuration(
        {
            "type": "service",
            "port": 8000,
            "groups": [
                {"name": "a", "replicas": "0..3", "commands": ["x"], "scaling": scaling},
                {"name": "b", "replicas": 2, "commands": ["y"]},
            ],
        }
    )
    stored = conf.model_dump(mode="json")  # the configuration as a run stores it
    assert group_confs(stored, None) == [
        GroupConf("a", 0, 3, Scaling(target=5.0, window=30.0, scale_up_delay=30.0, scale_down_delay=300.0)),
        GroupConf("b", 2, 2, None),
    ]
    assert group_confs(stored, 2.0)[0].scaling == Scaling(5.0, 2.0, 30.0, 300.0)  # the server's window setting


def test_settings_from_the_environment(tmp_path: Path) -> None:
    env = {
        "CORRAL_SERVER_DIR": str(tmp_path),
        "CORRAL_SERVICE_DRAIN_TIMEOUT": "5",
        "CORRAL_PROXY_COLD_START_QUEUE": "7",
        "CORRAL_PROXY_COLD_START_TIMEOUT": "9",
        "CORRAL_SERVICE_SCALING_WINDOW": "2",
    }
    s = Settings.from_env(env)
    assert (s.service_drain_timeout, s.proxy_cold_start_queue, s.proxy_cold_start_timeout) == (5, 7, 9)
    assert s.service_scaling_window == 2
    with pytest.raises(SettingsError, match="CORRAL_PROXY_COLD_START_QUEUE"):
        Settings.from_env({**env, "CORRAL_PROXY_COLD_START_QUEUE": "many"})
    with pytest.raises(SettingsError, match="CORRAL_SERVICE_DRAIN_TIMEOUT"):
        Settings.from_env({**env, "CORRAL_SERVICE_DRAIN_TIMEOUT": "-1"})
