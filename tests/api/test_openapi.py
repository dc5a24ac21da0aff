"""The OpenAPI document: a valid OpenAPI 3.1 document (``openapi-spec-validator``), built from the models
the handlers use, with the bearer scheme where dstack needs a token and each route's error responses.
(What the server really answers is checked against it in ``test_fuzz.py``.)"""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate
from rbac_table import ROUTES

from corral.api.app import TABLES
from corral.api.openapi import build_openapi
from corral.schemas import requests as rq
from corral.schemas import responses as out

SPECS = [spec for table in TABLES for spec in table.routes]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return build_openapi(TABLES)


def _ref(schema: dict[str, Any]) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[-1]


def test_the_document_is_valid_openapi(doc: dict[str, Any]) -> None:
    validate(doc)  # raises on the first problem, naming where it is
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}


def test_every_post_has_a_request_body_from_the_model_its_handler_parses(doc: dict[str, Any]) -> None:
    posts = [spec for spec in SPECS if spec.method == "POST"]
    assert len(posts) >= 69
    for spec in posts:
        op = doc["paths"][spec.path]["post"]
        assert "requestBody" in op, spec.path
        content = op["requestBody"]["content"]
        if spec.upload:
            assert content["multipart/form-data"]["schema"]["required"] == ["file"]
            continue
        assert spec.body is not None, f"{spec.path}: no body model recorded"
        assert _ref(content["application/json"]["schema"]) == spec.body.__name__
        required = any(f.is_required() for f in spec.body.model_fields.values())
        assert op["requestBody"]["required"] is required, spec.path
    for spec in SPECS:
        if spec.method == "GET":
            assert "requestBody" not in doc["paths"][spec.path]["get"]
    # the body a no-body route documents takes anything, as the route ignores it
    assert doc["components"]["schemas"]["NoBody"]["additionalProperties"] is True


def test_every_answer_has_a_schema_from_its_response_model(doc: dict[str, Any]) -> None:
    for spec in SPECS:
        op = doc["paths"][spec.path][spec.method.lower()]
        assert spec.response is not None, f"{spec.method} {spec.path}: no response model"
        model = out.model(spec.response)
        assert _ref(op["responses"]["200"]["content"]["application/json"]["schema"]) == model.__name__
    schemas = doc["components"]["schemas"]
    assert set(schemas["GatewayStatus"]["enum"]) == {"submitted", "provisioning", "running", "failed"}
    # a few of dstack's shapes, spelled out (the fuzzing test checks real answers against all of them)
    assert {"id", "run_spec", "jobs", "status", "latest_job_submission"} <= set(schemas["Run"]["required"])
    assert set(schemas["RunStatus"]["enum"]) == {
        "pending",
        "submitted",
        "provisioning",
        "running",
        "terminating",
        "terminated",
        "failed",
        "done",
    }
    assert schemas["Null"] == {"title": "Null", "type": "null", "description": "``null``: the action was done."}
    assert schemas["UsersList"]["anyOf"][1]["$ref"].endswith("/UsersInfoList")


def test_security_and_error_responses_follow_each_route(doc: dict[str, Any]) -> None:
    public = {(m, p.split("?")[0].replace("{p}", "{project_name}")) for m, p, rule, *_ in ROUTES if rule == "none"}
    assert public == {(spec.method, spec.path) for spec in SPECS if spec.public}
    for spec in SPECS:
        op = doc["paths"][spec.path][spec.method.lower()]
        codes = set(op["responses"]) - {"200"}
        reads = spec.upload or (spec.body is not None and spec.body is not rq.NoBody)
        if spec.path == "/metrics":  # Prometheus: no user token, its own (403), and off unless enabled (404)
            assert op["security"] == [] and codes == {"403", "404"}, codes
            continue
        if spec.public:
            assert op["security"] == [] and not codes & {"401", "403"}, spec.path
        else:
            assert op["security"] == [{"bearer": []}] and {"401", "403"} <= codes, spec.path
        assert ("404" in codes) == ("{project_name}" in spec.path), spec.path
        assert ("413" in codes) == reads, spec.path
        assert ("422" in codes) == (reads or bool(spec.query_params)), spec.path
        assert ("400" in codes) == spec.path.startswith("/api/"), spec.path
        for code in codes:
            assert "$ref" in op["responses"][code]["content"]["application/json"]["schema"]
    schemas = doc["components"]["schemas"]
    # dstack's error bodies
    assert schemas["BadRequest"]["properties"]["detail"]["items"]["$ref"].endswith("/ErrorDetail")
    assert schemas["NotAuthenticated"]["properties"]["detail"]["const"] == "Not authenticated"
    assert {_ref(s) for s in schemas["Forbidden"]["anyOf"]} == {"DetailError", "ErrorDetail"}
    assert set(schemas["ValidationIssue"]["required"]) == {"loc", "msg", "type"}
