"""The API's OpenAPI document and its Swagger UI page, built from the route tables on the first request to
``/api/openapi.json`` (imported only then: the schema machinery costs nothing at start-up).

Operation ids, summaries and parameters follow what FastAPI generated for these routes before. What a
route recorded (:mod:`corral.api.routing`) makes the rest: the request body from the model the handler
parses (``NoBody`` for a route that reads none, a multipart ``file`` for uploads), the 200 from its
response model (:mod:`corral.schemas.responses`), the bearer security scheme unless it is public, and
the errors it can answer, in dstack's shapes:

- 400 ``{"detail": [{"msg", "code"}]}``: any ``/api/`` route (an incompatible ``X-API-Version``; a
  service's refusal);
- 401 ``{"detail": "Not authenticated"}`` and 403 (``{"detail": {"msg", "code"}}``, or the bare
  ``{"msg", "code"}`` of a service's own check): routes that need a token;
- 404 ``{"detail": {"msg": "Not found", "code": null}}``: routes of a project (there is no such project);
- 413 ``{"detail": [{"msg", "code"}]}``: routes that read a body (it is over its size limit);
- 422 ``{"detail": [{"loc", "msg", "type"}]}``: routes with a body or query parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.datastructures import State
from starlette.responses import HTMLResponse, Response

from corral import __version__
from corral.api.routing import RouteSpec, RouteTable
from corral.schemas import requests as rq
from corral.schemas import responses as out

_PATH_PARAM = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")
_REF = "#/components/schemas/{model}"
SECURITY_SCHEME = "bearer"

#: status -> (description, model) of the errors a route may answer (which ones: :func:`error_statuses`)
ERRORS: dict[str, tuple[str, type[BaseModel]]] = {
    "400": ("Bad request: refused by the server (`code` says why) or an incompatible client", out.BadRequest),
    "401": ("Not authenticated: no `Authorization: Bearer <token>` header", out.NotAuthenticated),
    "403": ("Invalid token, or the caller's role does not allow this", out.Forbidden),
    "404": ("No such project", out.DetailError),
    "413": ("The request body is over its size limit", out.BadRequest),
    "422": ("Validation error: `loc` names the field", out.ValidationFailed),
}

_UPLOAD_SCHEMA = {
    "type": "object",
    "properties": {"file": {"type": "string", "format": "binary", "description": "named by its SHA-256"}},
    "required": ["file"],
}


def _title(name: str) -> str:
    return name.replace("_", " ").title()


def error_statuses(spec: RouteSpec) -> list[str]:
    """The error statuses ``spec`` can answer."""
    codes = []
    if spec.path.startswith("/api/"):
        codes.append("400")
    if not spec.public:
        codes += ["401", "403"]
    if "{project_name}" in spec.path:
        codes.append("404")
    if spec.path == "/metrics":  # Prometheus: its own token (403), and off unless enabled (404)
        codes += ["403", "404"]
    reads_body = spec.upload or (spec.body is not None and spec.body is not rq.NoBody)
    if reads_body:
        codes.append("413")
    if reads_body or spec.query_params:
        codes.append("422")
    return codes


def _operation(spec: RouteSpec, refs: dict[type[Any], dict[str, Any]]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": _title(spec.name),
        "operationId": re.sub(r"\W", "_", spec.name + spec.path) + "_" + spec.method.lower(),
    }
    if spec.handler.__doc__:
        op["description"] = " ".join(spec.handler.__doc__.split())
    params = [(name, "path") for name in _PATH_PARAM.findall(spec.path)]
    params += [(name, "query") for name in spec.query_params]
    if params:
        op["parameters"] = [
            {"name": n, "in": where, "required": True, "schema": {"type": "string", "title": _title(n)}}
            for n, where in params
        ]
    if spec.upload:
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": _UPLOAD_SCHEMA}}}
    elif spec.body is not None:
        op["requestBody"] = {
            # a route that reads no body, and one whose fields all have defaults, take an empty body too
            "required": any(f.is_required() for f in spec.body.model_fields.values()),
            "content": {"application/json": {"schema": refs[spec.body]}},
        }
    op["security"] = [] if spec.public else [{SECURITY_SCHEME: []}]
    responses: dict[str, Any] = {}
    if spec.response is not None:
        model = out.model(spec.response)
        responses["200"] = {
            "description": " ".join((model.__doc__ or "Successful Response").split()),
            "content": {"application/json": {"schema": refs[model]}},
        }
    for code in error_statuses(spec):
        description, model = ERRORS[code]
        responses[code] = {"description": description, "content": {"application/json": {"schema": refs[model]}}}
    op["responses"] = responses
    return op


def build_openapi(tables: Iterable[RouteTable]) -> dict[str, Any]:
    specs = [spec for table in tables for spec in table.routes]
    models: list[type[BaseModel]] = [model for _d, model in ERRORS.values()]
    for spec in specs:
        if spec.body is not None:
            models.append(spec.body)
        if spec.response is not None:
            models.append(out.model(spec.response))
    unique = list(dict.fromkeys(models))
    # requests validate what comes in; responses are what corral serialises (same names in both modes)
    keyed, defs = models_json_schema(
        [(m, "serialization" if out.is_answer(m) else "validation") for m in unique], ref_template=_REF
    )
    refs = {m: dict(ref) for (m, _mode), ref in keyed.items()}
    schemas = defs.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for spec in specs:
        paths.setdefault(spec.path, {})[spec.method.lower()] = _operation(spec, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "corral",
            "version": __version__,
            "description": "dstack 0.22.5's REST API as corral serves it. Every route but the public ones "
            "takes `Authorization: Bearer <token>`.",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {SECURITY_SCHEME: {"type": "http", "scheme": "bearer"}},
        },
    }


def openapi_response(state: State, tables: Iterable[RouteTable]) -> Response:
    """The document, built once per app."""
    body: bytes | None = getattr(state, "openapi_json", None)
    if body is None:
        body = orjson.dumps(build_openapi(tables))
        state.openapi_json = body
    return Response(body, media_type="application/json")


_SWAGGER_UI = """<!DOCTYPE html>
<html>
<head>
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
<title>corral - Swagger UI</title>
</head>
<body>
<div id="swagger-ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>
const ui = SwaggerUIBundle({
    url: '__OPENAPI_URL__',
    dom_id: '#swagger-ui',
    layout: 'BaseLayout',
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
})
</script>
</body>
</html>
"""


def swagger_ui(openapi_url: str) -> HTMLResponse:
    """Swagger UI (from the jsDelivr CDN, as FastAPI served it) for the document at ``openapi_url``."""
    return HTMLResponse(_SWAGGER_UI.replace("__OPENAPI_URL__", openapi_url))
