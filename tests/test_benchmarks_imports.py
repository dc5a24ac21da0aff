"""The benchmark scripts (not run in CI) still import what corral has: every ``corral`` name they import exists.
A rename in ``src/`` that forgets a benchmark fails here, not on the day someone measures."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

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
