"""The renewal rule of gateways' certificates (``domain/certificates.py``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from corral.domain.certificates import CertificateDates, attempt_due, next_attempt, renewal_due

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
#: A 90-day certificate (Let's Encrypt's lifetime): due for renewal 30 days before it expires.
NINETY_DAYS = CertificateDates(not_before=T0, not_after=T0 + timedelta(days=90))
RENEW = T0 + timedelta(days=60)


def test_a_certificate_is_due_once_less_than_a_third_of_its_lifetime_is_left() -> None:
    assert NINETY_DAYS.renew_at() == RENEW
    assert not renewal_due(NINETY_DAYS, RENEW)
    assert renewal_due(NINETY_DAYS, RENEW + timedelta(seconds=1))
    six_days = CertificateDates(T0, T0 + timedelta(days=6))  # short-lived certificates: the same third
    assert not renewal_due(six_days, T0 + timedelta(days=3, hours=23))
    assert renewal_due(six_days, T0 + timedelta(days=4, seconds=1))


def test_a_host_without_a_certificate_is_issued_one_at_once() -> None:
    assert attempt_due(None, None, T0)
    assert next_attempt(None, None) is None


def test_a_fresh_certificate_is_left_alone() -> None:
    assert not attempt_due(NINETY_DAYS, None, T0 + timedelta(days=10))
    assert next_attempt(NINETY_DAYS, None) == RENEW


def test_after_a_failure_the_next_attempt_waits_an_hour() -> None:
    failed = T0 + timedelta(minutes=5)
    assert not attempt_due(None, failed, failed + timedelta(minutes=59))
    assert attempt_due(None, failed, failed + timedelta(hours=1))
    assert next_attempt(None, failed) == failed + timedelta(hours=1)
    late = RENEW + timedelta(days=1)
    assert not attempt_due(NINETY_DAYS, late, late + timedelta(minutes=30))
    assert attempt_due(NINETY_DAYS, late, late + timedelta(hours=2))
    assert next_attempt(NINETY_DAYS, late) == late + timedelta(hours=1)


def test_an_old_failure_does_not_delay_a_renewal_that_is_not_due_yet() -> None:
    failed = T0 + timedelta(days=1)
    assert not attempt_due(NINETY_DAYS, failed, T0 + timedelta(days=2))
    assert next_attempt(NINETY_DAYS, failed) == RENEW
    assert attempt_due(NINETY_DAYS, failed, RENEW + timedelta(seconds=1))
