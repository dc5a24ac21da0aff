"""``corral apply -f gateway.yml``: create, update or re-create a gateway, as dstack 0.22.5's ``dstack apply`` of a
``type: gateway`` configuration does: ``gateways/get_plan``, the plan's header (project, user, configuration,
type, backend, region, domain, replicas), a confirmation ("Create the gateway?", "Update the gateway?", or
"Re-create the gateway?" for a change that cannot be made in place: the gateway is deleted and waited for
first), ``gateways/apply``, then the gateway followed until it is ``running`` or ``failed`` (``-d``: not followed).
"""

from __future__ import annotations

import time
from typing import Any

from corral.cli.gateway_cmd import POLL_S, gateways_table, wait_gone
from corral.domain.gateways import changed_fields

JSON = dict[str, Any]


def _header(client: Any, project: str, plan: JSON, path: str) -> None:
    from corral.cli import render

    conf = plan["spec"]["configuration"]
    rows = [
        ("Project", project),
        ("User", str(plan.get("user") or client.get_my_user().get("username") or "")),
        ("Configuration", path),
        ("Type", "gateway"),
        ("Backend", str(conf.get("backend") or "")),
        ("Region", str(conf.get("region") or "")),
        ("Domain", str(conf.get("domain") or "-")),
    ]
    if conf.get("replicas") is not None:
        rows.append(("Replicas", str(conf["replicas"])))
    render.console().print(render.props_table(rows))
    render.console().print()


def apply_gateway(client: Any, project: str, raw: JSON, path: str, yes: bool, detach: bool, force: bool) -> int:
    """Apply the gateway configuration; the exit code (1: the gateway failed)."""
    from corral.cli import render

    out = render.console()
    plan = client.gateways_get_plan(project, raw, path)
    _header(client, project, plan, path)
    current = plan.get("current_resource")
    if current is None:
        question = "Create the gateway?"
    else:
        name = current["name"]
        changed = changed_fields(current.get("configuration") or {}, plan["spec"]["configuration"])
        if not changed and yes and not force:
            out.print("No configuration changes detected. Use --force to apply anyway.")
            return 0
        detected = "Configuration changes detected." if changed else "No configuration changes detected."
        out.print(f"Found gateway [code]{name}[/]. {detected}")
        question = "Update the gateway?" if plan["action"] == "update" else "Re-create the gateway?"
    if not yes and not render.confirm(question):
        out.print("\nExiting...")
        return 0
    if current is not None and plan["action"] == "create":
        with out.status(f"Deleting gateway [code]{current['name']}[/]..."):
            client.gateways_delete(project, [current["name"]])
            wait_gone(client, project, current["name"])
        plan = client.gateways_get_plan(project, raw, path)
    gateway = client.gateways_apply(project, plan, force)
    if detach:
        out.print("Gateway configuration submitted. Exiting...")
        return 0
    with out.status(f"Provisioning gateway [code]{gateway['name']}[/]..."):
        while gateway.get("status") not in ("running", "failed"):
            time.sleep(POLL_S)
            gateway = client.gateways_get(project, str(gateway["name"]))
    out.print(gateways_table([gateway]))
    if gateway["status"] == "failed":
        out.print(f"\n[error]Gateway failed: {gateway.get('status_message') or 'unknown'}[/]")
        return 1
    return 0
