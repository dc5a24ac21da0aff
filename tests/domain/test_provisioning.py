"""The words a job shows (``ps``) when its instance could not be provisioned: one per reason, dstack's for no
capacity."""

from __future__ import annotations

from typing import get_args

from corral.domain import provisioning


def test_every_failure_kind_has_its_words_and_no_capacity_keeps_dstacks() -> None:
    assert set(provisioning.STATUS_WORDS) == set(get_args(provisioning.FailureKind))
    assert provisioning.STATUS_WORDS["no_capacity"] == "no capacity"
    assert len(set(provisioning.STATUS_WORDS.values())) == len(provisioning.STATUS_WORDS)
