"""``benchmarks/drain_vs_baseline.py`` reads a drain's figures from ``queue_drain.py --cpu``'s output, refuses a
baseline that is not a commit, and runs end to end (a tiny drain of each tree, the baseline checked out and
removed again), writing the JSON it promises. Figures only: nothing here is timed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "drain_vs_baseline.py"

# A real run's output (queue_drain.py --jobs 1000 --cpu, 2026-12-07), as the script reads it.
OUTPUT = """\
machine: 2 CPUs, load 2.0; SQLite, 1 server; 1000 jobs, fleet of 4 local instances, 8 submitting clients
submitted all in 5.8 s (171 applies/s; apply p50 44 ms, p99 144 ms)
queue drained in 28.5 s: 35.1 jobs placed and run per second; 1000/1000 done (most common status: ['done'])
while draining: ps body p50 55 ms, p99 129 ms; runs/get p50 20 ms, p99 63 ms
CPU per job (ms, from /proc): the machine 46.3
  server             18.3
  agents             11.9
  benchmark client    4.5
  job launchers       1.7, and 9.8 in the processes it started and reaped
  kernel workers      0.4
  the rest           -0.3  (other processes and the kernel outside its workers)
"""


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("drain_vs_baseline", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_a_drains_figures_are_read_from_its_output() -> None:
    mod = _module()
    d = mod.parse(OUTPUT, load=0.4)
    assert (d.load, d.jobs_per_s, d.machine_ms, d.server_ms, d.agents_ms) == (0.4, 35.1, 46.3, 18.3, 11.9)
    with pytest.raises(mod.OutputError, match="server_ms"):
        mod.parse(OUTPUT.replace("  server ", "  sever "), load=0.4)


def test_medians_and_ratios() -> None:
    mod = _module()
    base = [
        mod.Drain(0.1, 20.0, 70.0, 40.0, 12.0),
        mod.Drain(0.1, 22.0, 66.0, 38.0, 11.0),
        mod.Drain(0.1, 18.0, 76.0, 42.0, 14.0),
    ]
    this = [
        mod.Drain(0.1, 35.0, 46.0, 18.0, 12.0),
        mod.Drain(0.1, 34.0, 47.0, 19.0, 11.0),
        mod.Drain(0.1, 36.0, 45.0, 18.5, 10.0),
    ]
    ratio = mod.ratios(mod.medians(this), mod.medians(base))
    assert ratio["jobs_per_s"] == pytest.approx(35 / 20)
    assert ratio["machine_ms"] == pytest.approx(46 / 70)
    assert ratio["server_ms"] == pytest.approx(18.5 / 40)
    pairs = mod.pair_ratios(this, base)  # each run against the baseline run beside it
    assert [p["jobs_per_s"] for p in pairs] == pytest.approx([35 / 20, 34 / 22, 36 / 18])


def test_a_baseline_that_is_not_a_commit_is_refused() -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--baseline", "no-such-ref-anywhere"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    assert "--baseline 'no-such-ref-anywhere': not a commit of this repository" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_tiny_drain_of_both_trees_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    before = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    cmd = [sys.executable, str(SCRIPT), "--baseline", "HEAD", "--pairs", "1", "--jobs", "8", "--quiet", "1000"]
    res = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["pairs"] == 1 and len(doc["runs"]["baseline"]) == 1 and len(doc["runs"]["this"]) == 1
    for side in ("baseline", "this"):
        run = doc["runs"][side][0]
        assert run["jobs_per_s"] > 0 and run["machine_ms"] > 0 and run["server_ms"] > 0, run
    assert set(doc["ratio"]) == {"jobs_per_s", "machine_ms", "server_ms", "agents_ms"}
    assert len(doc["pair_ratios"]) == 1 and doc["pair_ratio_median"] == doc["pair_ratios"][0]
    assert "this/baseline" in res.stdout
    # The baseline's checkout is gone again.
    after = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before
