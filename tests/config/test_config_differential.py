"""Differential tests against dstack 0.22.5 itself: hundreds of grammar edge cases (valid and
invalid resources, ranges, durations, env, ports, volumes, fleets, selectors, crons, ...) must be
accepted or rejected exactly as dstack does, and when accepted dump to the same JSON."""

from __future__ import annotations

import copy
import random
from typing import Any

from _dstack_oracle import dstack_verdicts
from pydantic import ValidationError

from corral.config import parse_configuration

GPU_TOKENS = {
    "vendor": ["nvidia", "NVIDIA", "amd", "tpu", "tt", "intel", "google", "tenstorrent"],
    "name": ["A100", "H100,H200", "tpu-v5", "A100,", "RTX4090", "a10g", "MI300X"],
    "memory": ["24GB", "24GB..", "..80GB", "16GB..80GB", "80GB..16GB", "512MB", "1TB", "24gb", "40GB..80GB"],
    "count": ["2", "1..8", "..4", "2..", "..", "8..1", "0", "1.5"],
}
MEMORY = ["8GB", "8GB..", "..8GB", "8", 8, 8.5, "8GB..4GB", "..", "abc", "1TB..", "512MB..2TB", "8 GB", ""]
MEMORY += [{"min": 4}, {"min": "4GB", "max": None}, {"max": "1TB"}, {}, None, True, [1], "8GB..16GB..32GB"]
CPU = ["4", "2..8", "arm:8", "x86:4..", "ARM", "x86:arm", "4:8", ":4", "..", "8..2", 4, 0, 2.5, True]
CPU += [
    {"min": 2},
    {"arch": "arm", "count": 4},
    {"arch": "arm"},
    {},
    {"count": "2.."},
    {"min": 1, "arch": "x86"},
]
CPU += ["amd64:4", "x86 : 4", None]
GPU_EXTRA: list[Any] = [
    0,
    2,
    "0",
    True,
    None,
    {},
    {"name": "A100"},
    {"name": ["A100", "H100"], "count": "1..2"},
]
GPU_EXTRA += [{"vendor": "AMD"}, {"vendor": 1}, {"compute_capability": 7.5}, {"compute_capability": "8.0"}]
GPU_EXTRA += [{"compute_capability": [9, 0]}, {"compute_capability": "8"}, {"total_memory": "160GB.."}]
GPU_EXTRA += [{"name": 4090}, {"count": {"min": 1}}, {"memory": {"min": "24GB"}}, "nvidia:A100:80GB:2:extra"]
DISK = ["100GB", "100GB..", "..1TB", 200, {"size": "50GB.."}, {"size": 10}, {"min": 100}, None, "x", ".."]
DURATIONS = [
    "5m",
    "off",
    False,
    True,
    -1,
    "1h",
    "-5",
    "1.5h",
    30,
    "30 m",
    "2x",
    "1d",
    "2w",
    0,
    "0",
    None,
    2.7,
]
ENVS: list[Any] = [["A=1", "B"], {"A": 1}, ["A", "A"], ["1A=x"], {"A": True}, {"A": None}, [], "A=1"]
ENVS += [["A=x=y", "B="], {"A": "1", "B": {"key": "B"}}, ["A-B=1"], [5], None, {}, ["A=line\nbreak"]]
PORTS: list[Any] = [8080, "80:8080", "*:8080", "80:", "x", {"container_port": 80}, 70000, 0, "8080", ":80"]
PORTS += [{"local_port": 1, "container_port": 2}, {"local_port": None, "container_port": 3}, "1:2:3", "*"]
PYTHONS: list[Any] = [3.10, "3.10", 3.9, 3.1, "3.8", 3, "3.12", 3.12, "3.15", None]
FLEETS: list[Any] = [["a"], ["p/a"], ["p/a/b"], [""], [{"name": "x"}], [{"project": "p", "name": "x"}], "a"]
FLEETS += [["/a"], ["a/"], [], [{"name": "x", "extra": 1}]]
# `instances: []` is left out on purpose: corral accepts it ("existing instances only"), dstack rejects it.
INSTANCES: list[Any] = [["i1"], [{"hostname": "h"}], [{"fleet": "f", "instance": 0}]]
INSTANCES += [[{"fleet": "p/f", "instance": -1}], [{"name": ""}], [{"fleet": {"name": "f"}, "instance": 2}]]
INSTANCES += [[{"name": "a", "hostname": "b"}], "i1", [{"fleet": "a/b/c", "instance": 1}]]
CRONS: list[Any] = ["0 * * * *", "*/15 0-6 * * mon-fri", "* * *", "60 * * * *", "0 0 1 jan *", "0 0 * * 7"]
CRONS += [
    "0 0 * * sun",
    ["0 1 * * *", "0 2 * * *"],
    [],
    "*/0 * * * *",
    "0 0 last * *",
    "5-1 * * * *",
    "a b c d e",
]
CRONS += ["0 0 * foo *", "1,2,3 * * * *", "0-59/5 * * * *", "*/100 * * * *"]
VOLUMES: list[Any] = [
    ["vol:/data"],
    ["/host:/data"],
    ["vol:data"],
    ["a:b:c"],
    [{"name": ["a", "b"], "path": "/x"}],
]
VOLUMES += [[{"instance_path": "/a", "path": "/b", "optional": True}], [{"name": "v", "path": "/x/../y"}]]
VOLUMES += [["./rel:/data"], [{"name": "v", "path": "/a/"}], ["vol:/data/"]]
RETRY: list[Any] = [True, False, {}, {"on_events": []}, {"on_events": ["no-capacity"], "duration": "2h"}]
RETRY += [{"on_events": ["bad"]}, {"duration": "off"}, "true", "yes", None, 1]
TAGS: list[Any] = [{"a": "b"}, {"a b": "c"}, {"k": 1}, {"k": "v!"}, None, {"x" * 61: "v"}, {"k": ""}]
NODES: list[Any] = ["0..3", 3, "..", "..3", "3..", "3..1", {"min": 1, "target": 2, "max": 3}, {"target": 2}]
NODES += [{"min": 2, "target": 1}, -1, "a", "2", 0, {"min": 1, "max": 0}, {}, "1..2..3", {"max": 2}]
REPOS: list[Any] = [
    ["."],
    ["https://github.com/a/b"],
    ["git@github.com:a/b.git"],
    ["git@github.com:a/b.git:/w"],
]
REPOS += [
    [".:/workflow"],
    ["a:b:c"],
    [{"url": "u", "local_path": "l"}],
    [{}],
    [".", ".."],
    ["C:\\x"],
    ["~x:/a"],
]
FILES: list[Any] = [["a"], ["a:/b"], ["a:b:c"], ["C:\\x:/y"], [{"local_path": "a", "path": "C:/b"}], ["c:/x"]]


def _gpu_strings(rng: random.Random) -> list[Any]:
    out: list[Any] = list(GPU_EXTRA)
    kinds = list(GPU_TOKENS)
    for _ in range(120):
        chosen = rng.sample(kinds, rng.randint(1, 4))
        if rng.random() < 0.1:
            chosen.append(rng.choice(kinds))  # a conflict
        tokens = [rng.choice(GPU_TOKENS[k]) for k in chosen]
        if rng.random() < 0.05:
            tokens.insert(rng.randrange(len(tokens) + 1), "")
        out.append(":".join(tokens))
    return out


def _cases() -> list[dict[str, Any]]:
    rng = random.Random(20250522)
    task: dict[str, Any] = {"type": "task", "commands": ["true"]}
    cases: list[dict[str, Any]] = []
    res_fields = {"gpu": _gpu_strings(rng), "memory": MEMORY, "cpu": CPU, "disk": DISK, "shm_size": MEMORY}
    for name, values in res_fields.items():
        cases += [{**task, "resources": {name: v}} for v in values]
    for name in ("idle_duration", "max_duration", "stop_duration"):
        cases += [{**task, name: v} for v in DURATIONS]
    cases += [{"type": "dev-environment", "ide": "vscode", "inactivity_duration": v} for v in DURATIONS]
    cases += [{"type": "volume", "backend": "aws", "region": "r", "auto_cleanup_duration": v} for v in DURATIONS]
    cases += [{**task, "utilization_policy": {"min_gpu_utilization": 10, "time_window": v}} for v in DURATIONS]
    per_field = {
        "env": ENVS,
        "ports": PORTS and [[p] for p in PORTS],
        "python": PYTHONS,
        "fleets": FLEETS,
        "instances": INSTANCES,
        "schedule": [{"cron": c} for c in CRONS],
        "volumes": VOLUMES,
        "retry": RETRY,
        "tags": TAGS,
        "repos": REPOS,
        "files": FILES,
    }
    for name, values in per_field.items():
        cases += [{**task, name: v} for v in values]
    fleet = {"type": "fleet", "name": "f"}
    cases += [{**fleet, "nodes": v} for v in NODES]
    cases += [{**fleet, "nodes": 1, "resources": {"gpu": g}} for g in ["A100", 0, None]]
    cases += [{**fleet, "blocks": b} for b in ["auto", 0, 2, "2", "all"]]
    cases += [{**fleet, "ssh_config": {"hosts": h}} for h in [["1.2.3.4"], [{"hostname": "h", "blocks": "auto"}], []]]
    cases += [{**fleet, "ssh_config": {"hosts": ["h"], "network": n}} for n in ["10.0.0.0/8", "8.8.8.0/24", "x"]]
    cases += [
        {**fleet, "ssh_config": {"hosts": [{"hostname": "h", "internal_ip": ip}]}} for ip in ["10.0.0.1", "8.8.8.8"]
    ]
    svc: dict[str, Any] = {"type": "service", "commands": ["serve"], "port": 8000}
    service_values: dict[str, list[Any]] = {
        "port": [8000, "8000", "80:8000", {"container_port": 1}, 0, "x", "*:80"],
        "replicas": [2, "0..4", "1..", "..3", [{"count": 1, "commands": ["a"]}], "4..2"],
        "gateway": [True, False, "gw", "p/gw", "a/b/c", None, "true"],
        "model": [
            "m",
            {"name": "m", "format": "tgi"},
            {"name": "m"},
            {"name": "m", "format": "openai", "prefix": "/x"},
        ],
        "https": [True, "auto", "yes", "no", "x"],
        "probes": [[{"type": "http"}], [{"type": "http", "url": "x"}], [{"type": "http"}, {"type": "http"}]],
        "rate_limits": [[{"rps": 1}], [{"rps": 1, "key": {"type": "header", "header": "X-A"}}], [{"rps": 0}]],
    }
    for key, values in service_values.items():
        cases += [{**svc, key: v} for v in values]
    cases += [
        {**svc, "replicas": "1..3", "scaling": {"metric": "rps", "target": t, "window": w}}
        for t, w in [(1, "60s"), (0, None), (2, "45s"), (1, "5m")]
    ]
    gw = {"type": "gateway", "backend": "aws", "region": "r"}
    cases += [{**gw, "certificate": c} for c in [None, {"type": "acm", "arn": "a"}, {"type": "x"}]]
    cases += [{**gw, "replicas": r} for r in [0, 2]] + [{**gw, "backend": "AWS"}, {**gw, "instance_type": ""}]
    cases += [
        {"type": "volume", "backend": b, "region": "r", "size": s}
        for b in ["aws", "kubernetes", "runpod", "lium", "x"]
        for s in ["100GB", 10, "1TB", "x"]
    ]
    cases += [{"type": t} for t in ["preset", "nope", None]]
    cases += [{"type": "preset", "repo": "a/b", "dataset": d} for d in ["random", " sharegpt ", None]]
    return [copy.deepcopy(c) for c in cases]


def _ours(conf: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "dump": parse_configuration(copy.deepcopy(conf)).model_dump(mode="json")}
    except ValidationError as e:
        return {"ok": False, "error": str(e)}


def test_grammar_edge_cases_match_dstack() -> None:
    cases = _cases()
    assert len(cases) > 500
    theirs = dstack_verdicts(cases)
    mismatches = []
    for conf, mine, dstack in zip(cases, map(_ours, cases), theirs, strict=True):
        if mine["ok"] != dstack["ok"] or mine.get("dump") != dstack.get("dump"):
            mismatches.append((conf, mine.get("error") or "accepted", dstack.get("error") or "accepted"))
    assert mismatches == [], "\n".join(map(str, mismatches[:20]))
    # both sides reject some and accept some: the cases are meaningful
    assert 100 < sum(v["ok"] for v in theirs) < len(cases) - 100
