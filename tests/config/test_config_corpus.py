"""The 261 configurations dstack accepts parse here with the same normalised JSON; the 13 it
rejects are rejected; our JSON round-trips through our models and through dstack's own."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from _dstack_oracle import dstack_verdicts
from pydantic import ValidationError

from corral.config import parse_configuration

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "dstack-yaml"
ACCEPTED = REFERENCE / "dstack-yaml-corpus.json"
REJECTED = REFERENCE / "dstack-yaml-rejected.json"


def _load(path: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(path.read_text())
    return entries


@pytest.fixture(scope="module")
def accepted() -> list[dict[str, Any]]:
    return _load(ACCEPTED)


@pytest.fixture(scope="module")
def rejected() -> list[dict[str, Any]]:
    return _load(REJECTED)


def test_corpus_sizes(accepted: list[dict[str, Any]], rejected: list[dict[str, Any]]) -> None:
    assert len(accepted) == 261
    assert len(rejected) == 13


def test_every_accepted_configuration_parses(accepted: list[dict[str, Any]]) -> None:
    failures = []
    for entry in accepted:
        try:
            parse_configuration(copy.deepcopy(entry["config"]))
        except ValidationError as e:
            failures.append(f"{entry['source']}: {e}")
    assert failures == []


def test_every_rejected_configuration_is_rejected(rejected: list[dict[str, Any]]) -> None:
    passed = []
    for entry in rejected:
        try:
            parse_configuration(copy.deepcopy(entry["config"]))
        except ValidationError:
            continue
        passed.append(entry["source"])
    assert passed == []


def test_dump_round_trips_through_our_models(accepted: list[dict[str, Any]]) -> None:
    for entry in accepted:
        conf = parse_configuration(copy.deepcopy(entry["config"]))
        dumped = conf.model_dump(mode="json")
        again = parse_configuration(copy.deepcopy(dumped))
        assert again == conf, entry["source"]
        assert again.model_dump(mode="json") == dumped, entry["source"]


def test_dump_equals_dstack_normalised_json(accepted: list[dict[str, Any]]) -> None:
    ours = [parse_configuration(copy.deepcopy(e["config"])).model_dump(mode="json") for e in accepted]
    theirs = dstack_verdicts([e["config"] for e in accepted])
    mismatches = [e["source"] for e, mine, d in zip(accepted, ours, theirs, strict=True) if d.get("dump") != mine]
    assert mismatches == []
    # And dstack reads our JSON back to the same JSON.
    reread = dstack_verdicts(ours)
    assert [r.get("dump") for r in reread] == ours


def test_dstack_rejects_what_we_reject(rejected: list[dict[str, Any]]) -> None:
    assert not any(v["ok"] for v in dstack_verdicts([e["config"] for e in rejected]))
