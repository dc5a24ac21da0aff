"""A run's cost as dstack 0.22.5 computes it (``_get_run_cost``: the sum over the submissions of price × hours,
rounded to 4 decimals; none without provisioning data), counted from when a job was placed."""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.costs import placed_price, run_cost, submission_cost

HOUR = 3600.0
JPD = ("aws", "i-0123456789abcdef0")  # stands for provisioning data: only its presence counts


@dataclass(frozen=True)
class Sub:
    price: float | None
    placed_at: float | None
    finished_at: float | None
    job_provisioning_data: object | None = JPD


def test_a_finished_submission_costs_its_price_times_its_hours_on_the_instance() -> None:
    assert submission_cost(Sub(2.0, 1000.0, 1000.0 + 1.5 * HOUR), now=1e9) == 3.0


def test_a_running_submission_counts_up_to_now() -> None:
    assert submission_cost(Sub(0.5, 100.0, None), now=100.0 + 2 * HOUR) == 1.0


def test_a_submission_that_never_got_an_instance_or_has_no_stored_price_costs_nothing() -> None:
    assert submission_cost(Sub(2.0, 100.0, 200.0, job_provisioning_data=None), now=1e9) == 0.0
    assert submission_cost(Sub(None, 100.0, 200.0), now=1e9) == 0.0  # stored before prices were
    assert submission_cost(Sub(2.0, None, 200.0), now=1e9) == 0.0


def test_a_clock_that_went_back_never_makes_a_negative_cost() -> None:
    assert submission_cost(Sub(2.0, 500.0, 400.0), now=1e9) == 0.0


def test_a_run_sums_its_submissions_rounded_to_four_decimals() -> None:
    subs = [
        Sub(1.0, 0.0, HOUR),  # 1.0
        Sub(0.3333333, 0.0, HOUR),  # a retry on another instance
        Sub(3.0, 0.0, None, job_provisioning_data=None),  # waiting for its instance: nothing yet
    ]
    assert run_cost(subs, now=10 * HOUR) == 1.3333
    assert run_cost([], now=0.0) == 0.0


def test_local_and_ssh_hosts_bill_nothing_and_clouds_their_price() -> None:
    assert placed_price("local", 1.25) == 0.0
    assert placed_price("ssh", 1.25) == 0.0
    assert placed_price("aws", 1.25) == 1.25
    assert placed_price("aws", None) == 0.0
