"""Re-applying a running service: dstack 0.22.5's ``check_can_update_run_spec`` for services (which run
spec and configuration fields may change in place), the new deployment (``deployment_num + 1``, the
run spec and each replica group's template rewritten, the event "Run updated. Deployment: N. Changed
fields: ..."), and the templates a service's replicas are made from.

The replicas themselves are replaced by the service scaling worker (``workers/service_scaling.py``, one
at a time, ``domain.rollout``). Imports the store and the services' own helpers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from corral.config.job_facts import derive as derive_facts
from corral.config.run_spec import CONFIGURATION
from corral.domain import job_facts
from corral.domain.documents import spec_configuration
from corral.domain.events import run_target
from corral.domain.records import RunRec, UserRec
from corral.services.errors import ServiceError
from corral.store import events, run_secrets
from corral.store import runs as store
from corral.store.fleets import dump

if TYPE_CHECKING:
    from corral.config.run_spec import RunSpec

#: dstack's ``_UPDATABLE_SPEC_FIELDS`` + the service's ``_TYPE_SPECIFIC_UPDATABLE_SPEC_FIELDS``.
UPDATABLE_SPEC_FIELDS = (
    "configuration_path",
    CONFIGURATION,
    "repo_data",
    "repo_code_hash",
    "file_archives",
    "working_dir",
)
#: dstack's ``_CONF_UPDATABLE_FIELDS`` + the service's ``_TYPE_SPECIFIC_CONF_UPDATABLE_FIELDS``.
UPDATABLE_CONF_FIELDS = (
    "priority",
    # in place
    "replicas",
    "groups",
    "scaling",
    "gateway",
    # rolling deployment
    "port",
    "probes",
    "resources",
    "volumes",
    "docker",
    "files",
    "image",
    "user",
    "privileged",
    "entrypoint",
    "working_dir",
    "python",
    "nvcc",
    "single_branch",
    "env",
    "shell",
    "commands",
)
OVERRIDE_ERROR = "Cannot override active run. Stop the run first."
CHANGED_ERROR = "Failed to apply plan. Resource has been changed. Try again or use force apply."


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def changed_fields(old_spec: dict[str, Any], new_spec: dict[str, Any]) -> list[str] | None:
    """The fields a re-apply changes (run spec fields, then configuration fields), or None when one of
    them cannot change in place (dstack: "Cannot override active run")."""
    spec_changes = _changed(old_spec, new_spec)
    if any(k not in UPDATABLE_SPEC_FIELDS for k in spec_changes):
        return None
    old, new = spec_configuration(old_spec), spec_configuration(new_spec)
    if old.get("type") != new.get("type"):
        return None
    allowed = set(UPDATABLE_CONF_FIELDS)
    if old.get("https") in (None, True) and new.get("https") in (None, True):
        allowed.add("https")  # an explicit default and an unset one mean the same
    conf_changes = _changed(old, new)
    if any(k not in allowed for k in conf_changes):
        return None
    return [k for k in spec_changes if k != CONFIGURATION] + conf_changes


def templates_value(cipher: Any, templates: list[dict[str, Any]], deployment_num: int, spec: RunSpec) -> str:
    """``runs.service_templates``: each replica group's job spec (sealed as stored), its scheduling facts (the
    replicas scaled up from it are written with them) and its deployment."""
    return orjson.dumps(
        {
            str(t.get("replica_group") or "0"): {
                "job_spec": dump(run_secrets.sealed_job_spec(cipher(), t)),
                "scheduling_facts": job_facts.encode(derive_facts(spec, t)),
                "deployment_num": deployment_num,
            }
            for t in templates
        }
    ).decode()


async def update(
    conn: Any,
    cipher: Any,
    existing: RunRec,
    spec: RunSpec,
    templates: list[dict[str, Any]],
    user: UserRec,
    current: Mapping[str, Any] | None,
    force: bool,
) -> bool:
    """Start the service's next deployment in place (True), or raise dstack's 400s. ``existing`` is the
    active run of that name, ``spec`` the new run spec (normalised), ``templates`` its groups' job specs,
    ``current`` the run the plan was made against (the request's ``current_resource``)."""
    stored = run_secrets.revealed(cipher, existing).run_spec
    document = spec.as_dict()
    changes = changed_fields(dict(stored), document)
    if changes is None:
        raise ServiceError(OVERRIDE_ERROR)
    if not force:
        if current is None or current.get("id") != existing.id:
            raise ServiceError(CHANGED_ERROR)
        if current.get("deployment_num", existing.deployment_num) != existing.deployment_num:
            raise ServiceError(CHANGED_ERROR)
    number = existing.deployment_num + 1
    updated = await store.update_run(
        conn,
        existing.id,
        {
            "run_spec": dump(run_secrets.sealed_run_spec(cipher(), document)),
            "priority": spec.priority,
            "deployment_num": number,
            "service_templates": templates_value(cipher, templates, number, spec),
            "status_message": None,
        },
        expect_status=(existing.status,),
    )
    if not updated:
        raise ServiceError(CHANGED_ERROR)
    await events.emit(
        conn,
        f"Run updated. Deployment: {number}. Changed fields: {', '.join(changes) or 'none'}",
        user.id,
        [run_target(existing.project_id, existing.id, existing.run_name)],
    )
    return True


__all__ = ["changed_fields", "templates_value", "update"]
