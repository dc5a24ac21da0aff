"""Events as dstack records them: what an event targets, who did it, and how its message is worded.

Pure: the recorder (``store/events.py``) writes these in the transaction of the change they describe.
dstack's rules for messages hold here too: past tense, no names of the targets or the actor in the
message, link only the entities affected (their parents are found by the ``within_*`` filters).
"""

from __future__ import annotations

from dataclasses import dataclass

#: dstack 0.22.5's ``EventTargetType`` values (the wire's ``type`` and ``include_target_types``).
TARGET_TYPES = (
    "project",
    "user",
    "fleet",
    "instance",
    "run",
    "job",
    "volume",
    "gateway",
    "gateway-replica",
    "secret",
    "preset",
)

#: Statuses after which an instance, a job or a run is over (a termination reason belongs in the message).
_FINISHED = frozenset({"terminated", "failed", "done", "aborted"})


@dataclass(frozen=True)
class Target:
    """An entity an event is about. ``run_id`` (jobs and runs) and ``fleet_id`` (instances and fleets) let
    ``within_runs`` / ``within_fleets`` find it; ``project_id`` is None only for users."""

    type: str
    project_id: str | None
    id: str
    name: str
    run_id: str | None = None
    fleet_id: str | None = None

    def __post_init__(self) -> None:
        if self.type not in TARGET_TYPES:
            raise ValueError(f"unknown event target type {self.type!r}")
        if (self.type == "user") != (self.project_id is None):
            raise ValueError(f"a {self.type} target {'cannot' if self.type == 'user' else 'must'} have a project")


def project_target(project_id: str, name: str) -> Target:
    return Target("project", project_id, project_id, name)


def user_target(user_id: str, name: str) -> Target:
    return Target("user", None, user_id, name)


def fleet_target(project_id: str, fleet_id: str, name: str) -> Target:
    return Target("fleet", project_id, fleet_id, name, fleet_id=fleet_id)


def gateway_target(project_id: str, gateway_id: str, name: str) -> Target:
    """A gateway. Its events, in the transaction of each change: ``Gateway created. Status: SUBMITTED``,
    ``Gateway updated. Changed fields: ...``, ``Gateway set as project default`` / ``unset``, its status
    changes, ``Gateway marked for deletion`` and ``Gateway deleted`` (dstack 0.22.5's texts)."""
    return Target("gateway", project_id, gateway_id, name)


def instance_target(project_id: str, instance_id: str, name: str, fleet_id: str | None) -> Target:
    return Target("instance", project_id, instance_id, name, fleet_id=fleet_id)


def run_target(project_id: str, run_id: str, name: str) -> Target:
    return Target("run", project_id, run_id, name, run_id=run_id)


def job_target(project_id: str, job_id: str, name: str, run_id: str) -> Target:
    return Target("job", project_id, job_id, name, run_id=run_id)


def secret_target(project_id: str, secret_id: str, name: str) -> Target:
    """A project's secret. Its events, recorded in the transaction of the change as every other: ``Secret
    created``, ``Secret updated`` (only when the value changed, as in dstack) and ``Secret deleted``, by the
    user who changed it."""
    return Target("secret", project_id, secret_id, name)


def clean_message(message: str) -> str:
    """As dstack stores it: no trailing period, one line."""
    cleaned = message.strip().rstrip(".").replace("\n", " ")
    if not cleaned:
        raise ValueError("an event needs a message")
    return cleaned


def _reason(reason: str | None, message: str | None) -> str:
    if reason is None:
        return ""
    out = f". Termination reason: {reason.upper()}"
    return out + f" ({message})" if message else out


def status_change_message(
    kind: str, old: str, new: str, reason: str | None = None, reason_message: str | None = None
) -> str:
    """``Run status changed RUNNING -> TERMINATING. Termination reason: STOPPED_BY_USER`` (dstack's words).

    The reason is told where the change says an end: to ``terminating``, or to a final status not reached
    through ``terminating`` (corral's jobs end without it). Fleets and gateways tell their status message instead."""
    msg = f"{kind.capitalize()} status changed {old.upper()} -> {new.upper()}"
    if kind in ("fleet", "gateway"):
        return msg + f" ({reason_message})" if reason_message else msg
    if new == "terminating" or (new in _FINISHED and old != "terminating"):
        msg += _reason(reason, reason_message if kind != "run" else None)
    return msg
