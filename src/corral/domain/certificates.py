"""When a gateway's certificate for a host is (re)issued: the renewal rule (pure; ``now`` is a parameter).

* Renew when less than a third of the certificate's lifetime is left: Let's Encrypt's advice to clients
  ("renew certificates automatically when they have a third of their total lifetime left",
  https://letsencrypt.org/docs/integration-guide/), which holds for any lifetime (90 days, 6 days, pebble's 5 years).
* After a failed attempt, at most one attempt per host per hour, so that a host whose DNS is wrong does not spend
  the CA's rate limits (Let's Encrypt's "failed validations" limit: https://letsencrypt.org/docs/rate-limits/).
* A host without a certificate is issued one at once (then the same hourly limit after a failure).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

#: The shortest wait after a failed attempt before the next one for the same host.
RETRY_AFTER_FAILURE = timedelta(hours=1)


@dataclass(frozen=True)
class CertificateDates:
    """A certificate's validity: from ``not_before`` to ``not_after``."""

    not_before: datetime
    not_after: datetime

    def renew_at(self) -> datetime:
        """When a third of the lifetime is left."""
        return self.not_after - (self.not_after - self.not_before) / 3


def renewal_due(dates: CertificateDates, now: datetime) -> bool:
    """Whether less than a third of the certificate's lifetime is left at ``now``."""
    return now > dates.renew_at()


def next_attempt(dates: CertificateDates | None, last_failure_at: datetime | None) -> datetime | None:
    """The earliest time the host's certificate may be (re)issued: ``None`` means now (no certificate and no
    failure to wait out)."""
    due = dates.renew_at() if dates is not None else None
    retry = last_failure_at + RETRY_AFTER_FAILURE if last_failure_at is not None else None
    if due is None or retry is None:
        return due or retry
    return max(due, retry)


def attempt_due(dates: CertificateDates | None, last_failure_at: datetime | None, now: datetime) -> bool:
    """Whether to try (re)issuing the host's certificate at ``now``: it has none, or it is due for renewal, and no
    failed attempt happened in the last hour."""
    if last_failure_at is not None and now - last_failure_at < RETRY_AFTER_FAILURE:
        return False
    return dates is None or renewal_due(dates, now)
