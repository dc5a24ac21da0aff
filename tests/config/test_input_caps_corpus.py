"""The server's caps on request input (``Settings.max_*``) lie far above anything dstack's own
configurations ask for: every configuration of the YAML corpus, wrapped as ``runs/apply`` or
``fleets/apply`` sends it, passes them with a margin of at least 4x."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.api.body import check_shape
from corral.settings import Settings

CORPUS = Path(__file__).parent.parent / "data" / "dstack-yaml" / "dstack-yaml-corpus.json"
MARGIN = 4


def _walk(value: Any, depth: int, seen: dict[str, int]) -> None:
    seen["depth"] = max(seen["depth"], depth)
    if isinstance(value, str):
        seen["string"] = max(seen["string"], len(value))
    elif isinstance(value, dict):
        seen["list"] = max(seen["list"], len(value))
        for k, v in value.items():
            seen["string"] = max(seen["string"], len(k))
            _walk(v, depth + 1, seen)
    elif isinstance(value, list):
        seen["list"] = max(seen["list"], len(value))
        for v in value:
            _walk(v, depth + 1, seen)


def _count(value: Any) -> int:
    """The largest number a ``nodes`` / ``replicas`` value names (``2``, ``"1..4"``, ``{"max": 8}``)."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return max((int(p) for p in value.replace("..", " ").split() if p.isdigit()), default=0)
    if isinstance(value, dict):
        return max((_count(v) for v in value.values()), default=0)
    if isinstance(value, list):  # replica groups
        return sum(_count(g.get("replicas", g.get("count", 1))) for g in value if isinstance(g, dict))
    return 0


def _wrapped(conf: dict[str, Any]) -> dict[str, Any]:
    if conf.get("type") == "fleet":
        return {"plan": {"spec": {"configuration": conf, "profile": {}}}, "force": False}
    return {"plan": {"run_spec": {"configuration": conf}}, "force": False}


def test_the_corpus_is_far_below_every_cap() -> None:
    settings = Settings(server_dir=Path("/nonexistent"), database_url="sqlite://")
    entries = json.loads(CORPUS.read_text())
    assert len(entries) > 200
    seen = {"depth": 0, "list": 0, "string": 0, "nodes": 0, "replicas": 0}
    for entry in entries:
        conf = entry["config"]
        check_shape(_wrapped(conf), settings)  # raises for a cap it hits
        _walk(_wrapped(conf), 0, seen)
        seen["nodes"] = max(seen["nodes"], _count(conf.get("nodes")))
        groups = conf.get("groups") if isinstance(conf.get("groups"), list) else []
        seen["nodes"] = max(seen["nodes"], sum(_count(g.get("nodes", 1)) for g in groups if isinstance(g, dict)))
        seen["replicas"] = max(seen["replicas"], _count(conf.get("replicas")))
    caps = {
        "depth": settings.max_json_depth,
        "list": settings.max_list_length,
        "string": settings.max_string_length,
        "nodes": settings.max_nodes,
        "replicas": settings.max_replicas,
    }
    print("corpus maxima:", seen, "caps:", caps)
    for key, cap in caps.items():
        assert seen[key] * MARGIN <= cap, (key, seen[key], cap)
    assert all(seen[k] > 0 for k in ("depth", "list", "string", "nodes", "replicas"))  # the walk saw them
