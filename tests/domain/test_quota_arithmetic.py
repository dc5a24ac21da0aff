"""Quota arithmetic: GPUs charged per model, the first limit a job would go above, borrowing, Kueue's
weighted dominant share and the entitlement."""

from __future__ import annotations

import pytest

from corral.domain.quotas import (
    Limits,
    QuotaPolicy,
    add,
    borrowed,
    charge,
    entitlement,
    exceeded,
    limits_from_doc,
    limits_to_doc,
    usage_doc,
    weighted_share,
)


def test_limits_documents_round_trip_and_gpu_counts_mean_any_model() -> None:
    assert limits_from_doc({"gpu": 8}).amounts == {"gpu": 8.0}
    doc = {"gpu": {"h100": 8, "any": 16}, "cpu": 64, "memory": 512.0, "price_per_hour": 12.5}
    limits = limits_from_doc(doc)
    assert limits.amounts == {"gpu:H100": 8.0, "gpu": 16.0, "cpu": 64.0, "memory": 512.0, "price_per_hour": 12.5}
    assert limits_to_doc(limits) == {"gpu": {"H100": 8, "any": 16}, "cpu": 64, "memory": 512, "price_per_hour": 12.5}


def test_a_job_is_charged_its_share_of_the_instance_per_gpu_model() -> None:
    held = charge(["H100"] * 8, 96, 1024 * 1024, 40.0, blocks=2, total_blocks=8)
    assert held == {"gpu:H100": 2.0, "gpu": 2.0, "cpu": 24.0, "memory": 256.0, "price_per_hour": 10.0}
    assert "gpu" not in charge([], 4, 8192, 0.0, 1, 1)


def test_exceeded_names_the_first_limit_and_what_is_held() -> None:
    limits = limits_from_doc({"gpu": {"H100": 8, "any": 12}, "cpu": 100})
    used = {"gpu:H100": 8.0, "gpu": 8.0, "cpu": 10.0}
    assert exceeded(used, {"gpu:H100": 1.0, "gpu": 1.0, "cpu": 1}, limits) == "gpu H100 8/8"
    assert exceeded(used, {"gpu:A100": 4.0, "gpu": 4.0, "cpu": 1}, limits) is None
    assert exceeded(used, {"gpu:A100": 5.0, "gpu": 5.0}, limits) == "gpu 8/12"
    assert exceeded({}, {"cpu": 1000.0}, Limits()) is None  # no limit named: none applies


def test_weighted_share_counts_only_usage_above_nominal_over_the_weight() -> None:
    policy = QuotaPolicy(weight=2.0, nominal=limits_from_doc({"gpu": 4}))
    capacity = {"gpu": 16.0, "cpu": 100.0}
    assert (
        weighted_share({"gpu": 4.0, "cpu": 10.0}, QuotaPolicy(nominal=limits_from_doc({"gpu": 4, "cpu": 10})), capacity)
        == 0
    )
    assert weighted_share({"gpu": 12.0}, policy, capacity) == pytest.approx(8 / 16 / 2)
    assert borrowed({"gpu": 12.0, "cpu": 3.0}, policy.nominal) == {"gpu": 8.0, "cpu": 3.0}


def test_entitlement_is_nominal_plus_a_weighted_part_of_what_nominals_leave_capped_by_max() -> None:
    policies = {
        "a": QuotaPolicy(weight=1.0, nominal=limits_from_doc({"gpu": 8})),
        "b": QuotaPolicy(weight=3.0, max=limits_from_doc({"gpu": 20})),
    }
    capacity = {"gpu": 64.0}
    assert entitlement("a", policies, capacity, {"a", "b"}) == {"gpu": 8 + 56 / 4}
    assert entitlement("b", policies, capacity, {"a", "b"}) == {"gpu": 20.0}
    assert entitlement("a", policies, capacity, {"a"}) == {"gpu": 64.0}  # alone: everything (work-conserving)


def test_a_policy_is_the_default_only_when_it_sets_nothing() -> None:
    assert QuotaPolicy().is_default()
    assert not QuotaPolicy(weight=2.0).is_default()
    assert not QuotaPolicy(max=Limits({"gpu": 1.0})).is_default()
    assert not QuotaPolicy(preemptible_max_priority=0).is_default()
    assert not QuotaPolicy(preemptible_run_types=("service",)).is_default()


def test_limits_left_empty_in_a_document_are_no_limits() -> None:
    assert limits_from_doc({"cpu": None, "gpu": {"H100": None, "any": 4}, "memory": 64}) == Limits(
        {"gpu": 4.0, "memory": 64.0}
    )
    assert limits_from_doc(None) == Limits({})
    assert limits_to_doc(Limits({"cpu": 8.0, "memory": 0.5})) == {"cpu": 8, "memory": 0.5}


def test_a_usage_document_leaves_zeros_out_and_rounds() -> None:
    usage = {"gpu": 2.0, "gpu:H100": 2.0, "cpu": 1e-12, "price": 1.234567}
    assert usage_doc(usage) == {"price": 1.2346, "gpu": {"H100": 2, "any": 2}}


def test_usages_add_up_dimension_by_dimension() -> None:
    assert add({"gpu": 1.0, "cpu": 4.0}, {"cpu": 2.0, "memory": 8.0}) == {"gpu": 1.0, "cpu": 6.0, "memory": 8.0}
