"""Every status change the store writes, checked against the transition tables (``domain/statuses.py``).

The writers of a job's, run's, instance's or fleet's status (``store/events.py``'s ``tracked_update*``, and the
few statements that know the old status already) ask :func:`permit` before they write. An illegal change is
refused: its row is not written at all (none of the update's values), so a refused change leaves the row as it
was, whatever else its transaction does. Under ``CORRAL_STRICT_TRANSITIONS=1`` (the test suite sets it) the
refusal raises :class:`~corral.domain.statuses.IllegalTransition`, which rolls the caller's transaction back;
otherwise it is logged as an error and the writer goes on as if the row had not matched.

Imports ``domain`` only.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from corral.domain.statuses import IllegalTransition, is_legal_transition

log = logging.getLogger("corral.transitions")

#: Whether an illegal status change raises (tests, development) rather than being refused with a logged error.
#: Read once, at import (``tests/conftest.py`` sets the variable before corral is imported).
STRICT = os.environ.get("CORRAL_STRICT_TRANSITIONS", "") not in ("", "0", "false", "off")

#: The tables whose status changes are checked, and the kind of entity each holds (as events name them).
KINDS = {"jobs": "job", "runs": "run", "instances": "instance", "fleets": "fleet"}


def checked(table: str, values: Mapping[str, Any]) -> bool:
    """Whether an update of ``table`` setting ``values`` changes a status the tables check."""
    return "status" in values and table in KINDS


def allowed(table: str, old: str, new: str) -> bool:
    """Whether a row of ``table`` (one of :data:`KINDS`) may go from status ``old`` to ``new``."""
    return is_legal_transition(KINDS[table], old, new)


@functools.lru_cache(maxsize=512)
def allowed_from_all(table: str, olds: tuple[str, ...], new: str) -> bool:
    """Whether a row of ``table`` in any of the statuses ``olds`` may go to ``new``: an update that expects
    only those then needs no read of the row's status to be checked."""
    return all(allowed(table, old, new) for old in olds)


def expected_allowed(table: str, expect: Sequence[str] | None, new: str) -> bool:
    """Whether a row of ``table`` known to be in one of ``expect`` may go to ``new`` (None: its status is not
    known, so the row must be read)."""
    return expect is not None and allowed_from_all(table, tuple(expect), new)


def permit(table: str, row_id: str, old: str, new: str) -> bool:
    """Whether the row ``row_id`` of ``table`` may go from ``old`` to ``new``; an illegal change raises
    :class:`IllegalTransition` under :data:`STRICT`, else it is logged as refused and False is returned."""
    return permit_kind(KINDS[table], row_id, old, new)


def permit_kind(kind: str, row_id: str, old: str, new: str) -> bool:
    """:func:`permit` for an entity of ``kind`` (a kind of ``domain.statuses.TRANSITIONS``, e.g. ``gateway``,
    whose writer checks its own changes rather than through ``tracked_update``)."""
    if is_legal_transition(kind, old, new):
        return True
    message = f"{kind} {row_id} cannot go from {old} to {new}: the status change was refused and not written"
    if STRICT:
        raise IllegalTransition(message)
    log.error(message, extra={"event": "status_change_refused", "kind": kind, "old": old, "new": new})
    return False
