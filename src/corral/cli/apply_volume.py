"""``corral apply -f volume.yml``: create a network volume, as dstack 0.22.5's ``dstack apply`` of a
``type: volume`` configuration does: the plan's header (project, user, configuration, volume type, backend,
region, size), ``Volume NAME does not exist yet.`` or ``Found volume NAME.`` with whether its configuration
changed, a confirmation, the old volume deleted first when one is re-created (``volumes/delete``, then
``volumes/get`` until it is gone), ``volumes/create``, then the volume followed until it is ``active`` or
``failed`` (``-d``: not followed).
"""

from __future__ import annotations

import time
from typing import Any

from corral.sdk.errors import ResourceNotExistsError

POLL_S = 1.0


def _same(current: dict[str, Any], raw: dict[str, Any]) -> bool:
    """Whether the stored configuration and the file's say the same, once both are parsed."""
    from corral.config import ConfigError, parse_volume_configuration

    try:
        return parse_volume_configuration(current) == parse_volume_configuration(raw)
    except (ConfigError, ValueError):
        return False


def _header(client: Any, project: str, raw: dict[str, Any], path: str) -> None:
    from corral.cli import render

    size = raw.get("size")
    rows = [
        ("Project", project),
        ("User", str(client.get_my_user().get("username") or "")),
        ("Configuration", path),
        ("Type", "volume"),
        ("Volume type", "external" if raw.get("volume_id") else "managed"),
        ("Backend", str(raw.get("backend") or "")),
        ("Region", str(raw.get("region") or "")),
        ("Size", "-" if size is None else str(size)),
    ]
    render.console().print(render.props_table(rows))
    render.console().print()


def apply_volume(
    client: Any, project: str, raw: dict[str, Any], path: str, yes: bool, detach: bool, force: bool
) -> int:
    """Create (or re-create) the volume; the exit code (1: it failed to provision)."""
    from corral.cli import render

    out = render.console()
    name = raw.get("name")
    current = None
    if name:
        try:
            current = client.volumes_get(project, str(name))
        except ResourceNotExistsError:
            pass
    _header(client, project, raw, path)
    if current is None:
        action, ask = (f"Volume [code]{name}[/] does not exist yet." if name else ""), "Create the volume?"
    else:
        same = _same(current.get("configuration") or {}, raw)
        if same and yes and not force:
            out.print("No configuration changes detected. Use --force to apply anyway.")
            return 0
        changes = "No configuration changes detected." if same else "Configuration changes detected."
        action, ask = f"Found volume [code]{name}[/]. {changes}", "Re-create the volume?"
    out.print(action)
    if not yes and not render.confirm(ask):
        out.print("\nExiting...")
        return 0
    if current is not None:
        with out.status("Deleting existing volume..."):
            client.volumes_delete(project, [str(name)])
            _wait_gone(client, project, str(name))
    with out.status("Creating volume..."):
        volume = client.volumes_create(project, raw)
    if detach:
        out.print("Volume configuration submitted. Exiting...")
        return 0
    with out.status(f"Provisioning [code]{volume['name']}[/]..."):
        while volume.get("status") not in ("active", "failed"):
            time.sleep(POLL_S)
            volume = client.volumes_get(project, str(volume["name"]))
    out.print(f"Volume [code]{volume['name']}[/] {volume['status']}")
    if volume["status"] == "failed":
        out.print(f"\n[error]Provisioning failed. Error: {volume.get('status_message') or 'unknown'}[/]")
        return 1
    return 0


def _wait_gone(client: Any, project: str, name: str) -> None:
    while True:
        try:
            client.volumes_get(project, name)
        except ResourceNotExistsError:
            return
        time.sleep(POLL_S)
