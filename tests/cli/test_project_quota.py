"""``corral project quota [NAME]``: one row per resource (GPUs per model first) with nominal, max, used,
borrowed, entitlement and capacity; ``--json`` prints the server's answer."""

from __future__ import annotations

import json
from collections.abc import Callable

from cli_fakes import FakeClient, Result

CLI = Callable[..., Result]
USAGE = {
    "project_name": "research",
    "weight": 3,
    "nominal": {"gpu": {"any": 8}, "cpu": 64},
    "max": {"gpu": {"H100": 16, "any": 24}, "price_per_hour": 40},
    "used": {"gpu": {"H100": 12, "any": 12}, "cpu": 96, "instances": 2},
    "borrowed": {"gpu": {"H100": 12, "any": 4}, "cpu": 32, "instances": 2},
    "entitlement": {"gpu": {"H100": 10.6667, "any": 10.6667}, "cpu": 64},
    "weighted_share": 0.041667,
    "capacity": {"gpu": {"H100": 32, "any": 32}, "cpu": 384, "instances": 4},
}


def test_project_quota_shows_each_resource(fake: FakeClient, cli: CLI) -> None:
    fake.usage = USAGE
    result = cli("project", "quota", "research")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "weight 3" in lines[0] and "weighted share 0.041667" in lines[0]
    rows: dict[str, list[str]] = {}
    for line in lines[2:]:
        cells = line.split()
        if cells:
            rows[" ".join(cells[:2]) if cells[:2] == ["gpu", "H100"] else cells[0]] = cells
    assert rows["gpu H100"] == ["gpu", "H100", "-", "16", "12", "12", "10.67", "32"]
    assert rows["gpu"] == ["gpu", "8", "24", "12", "4", "10.67", "32"]
    assert rows["cpu"] == ["cpu", "64", "-", "96", "32", "64", "384"]
    assert rows["price_per_hour"] == ["price_per_hour", "-", "40", "-", "-", "-", "-"]
    assert [n for n in rows] == ["gpu", "gpu H100", "cpu", "instances", "price_per_hour"]
    assert ("quotas_usage", ("research",), {}) in fake.calls


def test_project_quota_json(fake: FakeClient, cli: CLI) -> None:
    fake.usage = USAGE
    result = cli("project", "quota", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out) == USAGE
    assert ("quotas_usage", ("main",), {}) in fake.calls
