"""Models: the model services of the user's projects (what ``/proxy/models/<project>/models`` lists: a
live service's ``model``, the newest run of a name winning) and a chat playground for one of them, which
streams answers from the project's model endpoint in the browser with the user's session (the proxy
accepts a UI session with its CSRF token; no token is typed in the page). A project member's, as the
model endpoint is."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from corral.api.deps import ctx_of
from corral.services import accounts, service_routing
from corral.services.errors import ResourceNotExists
from corral.ui import auth
from corral.ui.render import page


async def models_list(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    rows = []
    for p in await accounts.list_projects(ctx.db, s.user, include_not_joined=False):
        for name, run, at in await service_routing.models(ctx, p.name):
            rows.append({"project": p.name, "model": name, "run": run, "created_at": at})
    return page(request, "models.html", title="Models", nav="models", models=rows)


async def playground(request: Request) -> Response:
    s = await auth.require(request)
    ctx = ctx_of(request)
    project = await accounts.project_access(ctx.db, s.user, request.path_params["project"], "member")
    model = request.query_params.get("model", "")
    served = {name: run for name, run, _ in await service_routing.models(ctx, project.name)}
    if model not in served:
        raise ResourceNotExists(f"Model {model} not found in project {project.name}")
    return page(
        request, "playground.html", title=f"Playground: {model}", nav="models", project=project.name, model=model,
        run=served[model], endpoint=f"/proxy/models/{project.name}/chat/completions",
    )  # fmt: skip
