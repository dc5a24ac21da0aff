"""``benchmarks/history_scale.py`` runs end to end on SQLite with a small history and writes every figure its
JSON promises, each with an empty, a live and a filled value (figures only: nothing here is timed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "history_scale.py"
NAMES = {
    "apply_rps",
    "list_p50_ms",
    "list_project_p50_ms",
    "get_p50_ms",
    "events_p50_ms",
    "metrics_scrape_ms",
    "pass_ms",
    "startup_s",
    "idle_rss_mb",
    "db_mb",
}


def test_history_scale_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(SCRIPT), "--runs", "2000", "--requests", "2", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == NAMES
    for name, figure in figures.items():
        assert set(figure) == {"empty", "live", "filled", "unit"}, name
        assert figure["empty"] > 0 and figure["live"] > 0 and figure["filled"] > 0, (name, figure)
    db = figures["db_mb"]
    assert db["filled"] > db["live"] > db["empty"]  # the live state, and the history beside it, were written
    assert "2,000 finished runs" in res.stdout and "filled/live" in res.stdout
