"""The benchmark scripts (not run in CI) still import what corral has: every ``corral`` name they import exists.
A rename in ``src/`` that forgets a benchmark fails here, not on the day someone measures. The hollow fleet
benchmark also runs, small: its JSON has the keys it promises and the caps held; its checks find an overrun and
an inversion in a record that has them."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_every_corral_name_a_benchmark_imports_exists() -> None:
    missing = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "corral":
                try:
                    module = importlib.import_module(node.module)
                except ModuleNotFoundError:
                    missing.append(f"{path.name}: {node.module}")
                    continue
                missing += [
                    f"{path.name}: {node.module}.{a.name}"
                    for a in node.names
                    if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None
                ]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "corral" and importlib.util.find_spec(a.name) is None:
                        missing.append(f"{path.name}: {a.name}")
    assert not missing, missing


def test_the_hollow_fleet_runs_small_and_its_caps_hold(tmp_path: Path) -> None:
    out = tmp_path / "hollow.json"
    args = ["--instances", "20", "--jobs", "200", "--duration", "0.05-0.2", "--idle", "0", "--json", str(out)]
    res = subprocess.run(
        [sys.executable, str(BENCHMARKS / "hollow_fleet.py"), *args], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"instances", "jobs", "done", "max_over_cap", "placements_per_s"} <= data.keys()
    assert (data["instances"], data["jobs"], data["done"], data["max_over_cap"]) == (20, 200, 200, 0)
    assert data["ran_twice"] == 0
    assert data["placements_per_s"] > 0


def _hollow_fleet() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hollow_fleet", BENCHMARKS / "hollow_fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hollow_fleet"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_hollow_fleet_checks_find_an_overrun_and_an_inversion(tmp_path: Path) -> None:
    hf = _hollow_fleet()
    args = argparse.Namespace(blocks=1, slack=0.5)
    b = hf.Bench(args, tmp_path, fleets={"f": ("main", ["h1", "h2"]), "hollow-capped": ("capped", ["c1", "c2"])})
    b.quota_instances = 1

    def ran(host: str, run: str, start: float, end: float) -> dict[str, object]:
        return {"host": host, "job_id": run, "run_name": run, "start": start, "end": end, "outcome": "done"}

    clean = [ran("h1", "a", 0, 10), ran("h1", "b", 10, 12), ran("h2", "c", 1, 5), ran("c1", "d", 0, 3)]
    assert hf.over_caps(b, clean)[0] == {"host": 0, "fleet": 0, "quota_instances": 0, "unknown_host": 0}
    # a third job on h1 beside a (one block), and c2 busy while c1 is (the quota allows one instance)
    over = [*clean, ran("h1", "e", 2, 4), ran("c2", "f", 1, 2)]
    assert hf.over_caps(b, over)[0] == {"host": 1, "fleet": 1, "quota_instances": 1, "unknown_host": 0}

    assert hf.over_caps(b, clean)[2] == {"a": False, "b": False, "c": True, "d": True}  # c filled f, d the quota

    b.applied = [hf.Applied("hi", "main", "f", 90, 0.0), hf.Applied("lo", "main", "f", 10, 0.0)]
    assert hf.order_inversions(b, {"hi": 1.0, "lo": 2.0}, {"lo": True, "hi": True}) == 0
    # the lower one took the last block, the higher one waiting: an inversion; with room left, only latency
    assert hf.order_inversions(b, {"hi": 9.0, "lo": 2.0}, {"lo": True}) == 1
    assert hf.order_inversions(b, {"hi": 9.0, "lo": 2.0}, {"lo": False}) == 0
