"""Volumes: the volumes of the user's projects (read through the service ``volumes/list`` calls, with its
rule: a member sees their projects' volumes) and a volume's deletion, as ``volumes/delete`` deletes it
(any project member; a volume attached to an instance is refused, naming it)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.api.deps import ctx_of
from corral.services import accounts, volumes
from corral.ui import auth
from corral.ui.render import page


def volume_row(v: dict[str, Any]) -> dict[str, Any]:
    """What the list shows of dstack's ``Volume``: where it is, its size and what it is attached to."""
    conf = v.get(volumes.CONFIGURATION) or {}
    pd = v.get("provisioning_data") or {}
    size = pd.get("size_gb")
    attached = [a["instance"]["name"] for a in v.get("attachments") or [] if a.get("instance")]
    return {
        **v,
        "backend": pd.get("backend") or conf.get("backend") or "—",
        "region": pd.get("availability_zone") or conf.get("region") or "—",
        "size": f"{size}GB" if size else (str(conf["size"]) if conf.get("size") else "—"),
        "attached": ", ".join(attached) or "—",
        "deletable": not v.get("deleted") and v.get("status") not in ("deleted",),
    }


async def volumes_list(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    project = request.query_params.get("project") or None
    ids = await accounts.member_project_ids(ctx.db, s.user, [project] if project else None)
    found = [volume_row(v) for v in await volumes.list_volumes(ctx, ids, limit=1000)]
    return page(request, "volumes.html", title="Volumes", nav="volumes", volumes=found, f_project=project or "")


async def volume_delete(request: Request) -> Response:
    s = await auth.require(request)
    await auth.form_of(request, s)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "member")
    await volumes.delete(ctx, project, [request.path_params["volume"]])
    return RedirectResponse("/volumes", status_code=303)
