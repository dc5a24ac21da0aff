"""A pass's ledger: a trial reads through to the ledger and keeps its own writes; entries are never removed."""

from __future__ import annotations

import pytest

from corral.scheduler.ledger import Ledger
from corral.scheduler.types import Plan


def test_a_trial_reads_through_and_keeps_its_writes_until_committed() -> None:
    ledger = Ledger(free_blocks={"i0": 2, "i1": 1})
    trial = ledger.trial()
    trial.free_blocks["i1"] = 0
    trial.free_blocks["i2"] = 4
    assert dict(trial.free_blocks) == {"i0": 2, "i1": 0, "i2": 4}
    assert len(trial.free_blocks) == 3 and sorted(trial.free_blocks) == ["i0", "i1", "i2"]
    assert ledger.free_blocks == {"i0": 2, "i1": 1}
    ledger.commit(trial)
    assert ledger.free_blocks == {"i0": 2, "i1": 0, "i2": 4}


def test_a_trial_never_removes_an_entry() -> None:
    trial = Ledger(free_blocks={"i0": 2}).trial()
    with pytest.raises(TypeError, match="never removed"):
        del trial.free_blocks["i0"]


def test_a_plan_without_gangs_is_empty() -> None:
    assert Plan(()).is_empty()
