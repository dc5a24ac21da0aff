"""The API's OpenAPI document and its Swagger UI page, built from the route tables on the first request to
``/api/openapi.json`` (imported only then: the schema machinery costs nothing at start-up).

Operation ids, summaries, parameters and the 422 shape follow what FastAPI generated for these routes
before; request bodies come from the models the routes record (``body=`` in :mod:`corral.api.routing`).
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

_PATH_PARAM = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")
_REF = "#/components/schemas/{model}"

_VALIDATION_SCHEMAS: dict[str, Any] = {
    "HTTPValidationError": {
        "properties": {
            "detail": {"items": {"$ref": "#/components/schemas/ValidationError"}, "type": "array", "title": "Detail"}
        },
        "type": "object",
        "title": "HTTPValidationError",
    },
    "ValidationError": {
        "properties": {
            "loc": {
                "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "type": "array",
                "title": "Location",
            },
            "msg": {"type": "string", "title": "Message"},
            "type": {"type": "string", "title": "Error Type"},
            "input": {"title": "Input"},
            "ctx": {"type": "object", "title": "Context"},
        },
        "type": "object",
        "required": ["loc", "msg", "type"],
        "title": "ValidationError",
    },
}


def _title(name: str) -> str:
    return name.replace("_", " ").title()


def _operation(spec: RouteSpec, body_refs: dict[type[Any], dict[str, Any]]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": _title(spec.name),
        "operationId": re.sub(r"\W", "_", spec.name + spec.path) + "_" + spec.method.lower(),
    }
    params = [(name, "path") for name in _PATH_PARAM.findall(spec.path)]
    params += [(name, "query") for name in spec.query_params]
    if params:
        op["parameters"] = [
            {"name": n, "in": where, "required": True, "schema": {"type": "string", "title": _title(n)}}
            for n, where in params
        ]
    if spec.body is not None:
        op["requestBody"] = {"content": {"application/json": {"schema": body_refs[spec.body]}}}
    op["responses"] = {"200": {"description": "Successful Response", "content": {"application/json": {"schema": {}}}}}
    if params or spec.body is not None:
        op["responses"]["422"] = {
            "description": "Validation Error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
        }
    return op


def build_openapi(tables: Iterable[RouteTable]) -> dict[str, Any]:
    specs = [spec for table in tables for spec in table.routes]
    models: list[type[BaseModel]] = []
    for spec in specs:
        if spec.body is not None and spec.body not in models:
            models.append(spec.body)
    refs, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    body_refs: dict[type[Any], dict[str, Any]] = {m: dict(refs[(m, "validation")]) for m in models}
    paths: dict[str, dict[str, Any]] = {}
    for spec in specs:
        paths.setdefault(spec.path, {})[spec.method.lower()] = _operation(spec, body_refs)
    schemas = {**defs.get("$defs", {}), **_VALIDATION_SCHEMAS}
    return {
        "openapi": "3.1.0",
        "info": {"title": "corral", "version": __version__},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items()))},
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
