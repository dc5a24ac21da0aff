"""``GET /metrics``'s switches as dstack's (off by default: 404; on without a token: open), the settings under
corral's and dstack's names, and the text format (escaping, histograms) read back by ``prometheus_client``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.domain.telemetry import Family, Telemetry, render
from corral.settings import Settings, SettingsError
from server_harness import make_settings, running_server


async def test_off_by_default_and_open_without_a_token(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, background_processing=False)
    async with running_server(settings) as s, s.client() as c:
        off = await c.get("/metrics")
        assert (off.status_code, off.json()) == (404, {"detail": {"msg": "Not found", "code": None}})
        s.ctx.settings = replace(settings, enable_prometheus_metrics=True)
        on = await c.get("/metrics", headers={"Authorization": ""})
        assert on.status_code == 200
        names = {f.name for f in text_string_to_metric_families(on.text)}
        assert "dstack_run_count" not in names  # no run yet: a family without samples is left out


def test_settings_under_corral_and_dstack_names() -> None:
    base = {"CORRAL_SERVER_DIR": "/tmp/x"}
    s = Settings.from_env(base)
    assert (s.enable_prometheus_metrics, s.prometheus_auth_token) == (False, None)
    assert (s.metrics_running_ttl, s.metrics_finished_ttl) == (3600.0, 7 * 24 * 3600.0)
    s = Settings.from_env(
        {
            **base,
            "DSTACK_ENABLE_PROMETHEUS_METRICS": "",
            "DSTACK_PROMETHEUS_AUTH_TOKEN": "t",
            "DSTACK_SERVER_METRICS_RUNNING_TTL_SECONDS": "60",
        }
    )
    assert (s.enable_prometheus_metrics, s.prometheus_auth_token, s.metrics_running_ttl) == (True, "t", 60.0)
    s = Settings.from_env(
        {**base, "CORRAL_ENABLE_PROMETHEUS_METRICS": "1", "CORRAL_SERVER_METRICS_FINISHED_TTL_SECONDS": "5"}
    )
    assert (s.enable_prometheus_metrics, s.metrics_finished_ttl) == (True, 5.0)
    with pytest.raises(SettingsError, match="CORRAL_SERVER_METRICS_RUNNING_TTL_SECONDS='soon' must be a number"):
        Settings.from_env({**base, "CORRAL_SERVER_METRICS_RUNNING_TTL_SECONDS": "soon"})


def test_text_format_reads_back() -> None:
    t = Telemetry()
    t.inc("corral_proxy_requests_total", {"project": "main", "run": 'we"ird\\name\n', "code": "200"}, by=2)
    for wait in (0.05, 3.0, 10**6):
        t.observe("corral_queue_wait_seconds", wait, {"project": "main"})
    gauge = Family("corral_queue_length", "gauge", "Jobs waiting")
    gauge.add({"project": "main", "fleet": ""}, 4)
    families = {f.name: f for f in text_string_to_metric_families(render([gauge, *t.families()]))}
    proxy = families["corral_proxy_requests"].samples[0]
    assert (proxy.labels["run"], proxy.value) == ('we"ird\\name\n', 2.0)
    buckets = {s.labels["le"]: s.value for s in families["corral_queue_wait_seconds"].samples if "le" in s.labels}
    assert (buckets["0.1"], buckets["5.0"], buckets["86400.0"], buckets["+Inf"]) == (1, 2, 2, 3)
    assert families["corral_queue_length"].samples[0].value == 4
    assert "corral_placements_total" not in families and "corral_placements" not in families  # no sample yet
