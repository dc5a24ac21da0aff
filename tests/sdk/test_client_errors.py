"""Error mapping and headers of CorralClient (httpx.MockTransport is used only here)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import httpx
import pytest

from corral.sdk.client import API_VERSION, CorralClient
from corral.sdk.errors import (
    AuthError,
    ClientError,
    NotFoundError,
    ResourceNotExistsError,
    ServerError,
    ServerUnreachable,
    ValidationError,
)

URL = "http://corral.test:3000"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> CorralClient:
    return CorralClient(URL, "tok", transport=httpx.MockTransport(handler))


def respond(status: int, body: object) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json=body)


def test_sends_bearer_token_and_api_version() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "running"})

    client(handler).runs_get("main", "r1")
    client(handler).projects_get("main")
    assert seen[0].headers["Authorization"] == "Bearer tok"
    assert seen[0].headers["X-API-VERSION"] == API_VERSION == "0.22.5"
    assert seen[0].url.path == "/api/project/main/runs/get"
    assert json.loads(seen[0].content) == {"run_name": "r1"}
    # projects/get goes out with no body, as dstack's CLI sends it
    assert seen[1].url.path == "/api/projects/main/get"
    assert seen[1].content == b""


def test_400_becomes_client_error_with_code() -> None:
    body = {"detail": [{"msg": "Cannot delete active run r: stop it first", "code": "error"}]}
    with pytest.raises(ClientError) as info:
        client(respond(400, body)).runs_delete("main", ["r"])
    assert str(info.value) == "Cannot delete active run r: stop it first"
    assert info.value.code == "error"
    assert not isinstance(info.value, ResourceNotExistsError)


def test_400_resource_not_exists() -> None:
    body = {"detail": [{"msg": "Run not found", "code": "resource_not_exists"}]}
    with pytest.raises(ResourceNotExistsError) as info:
        client(respond(400, body)).runs_get("main", "nope")
    assert str(info.value) == "Run not found"
    assert isinstance(info.value, ClientError)


@pytest.mark.parametrize(
    ("status", "body"),
    [(401, {"detail": "Not authenticated"}), (403, {"detail": {"msg": "Invalid token", "code": None}})],
)
def test_bad_token_is_auth_error(status: int, body: object) -> None:
    with pytest.raises(AuthError) as info:
        client(respond(status, body)).get_my_user()
    assert f"Invalid token for {URL}" in str(info.value)
    assert "corral project add" in str(info.value)


def test_403_access_denied_keeps_the_message() -> None:
    with pytest.raises(AuthError, match="Access denied"):
        client(respond(403, {"detail": {"msg": "Access denied", "code": None}})).projects_delete(["x"])


def test_404_unknown_project() -> None:
    with pytest.raises(NotFoundError) as info:
        client(respond(404, {"detail": {"msg": "Not found", "code": None}})).runs_get("nope", "r")
    assert str(info.value) == f"Project nope not found at {URL}"


def test_422_lists_each_field() -> None:
    body = {
        "detail": [
            {"type": "missing", "loc": ["body", "plan", "spec", "profile"], "msg": "Field required"},
            {"type": "extra_forbidden", "loc": ["body", "bogus"], "msg": "Extra inputs are not permitted"},
        ]
    }
    with pytest.raises(ValidationError) as info:
        client(respond(422, body)).fleets_apply("main", {"spec": {}})
    assert info.value.errors == [
        "plan.spec.profile: Field required",
        "bogus: Extra inputs are not permitted",
    ]
    assert "\n" not in str(info.value)


def test_5xx_is_server_error() -> None:
    handler = lambda request: httpx.Response(500, text="Internal Server Error")  # noqa: E731
    with pytest.raises(ServerError) as info:
        client(handler).runs_list("main")
    assert info.value.status_code == 500
    assert "500" in str(info.value)


def test_507_says_the_servers_message_whole() -> None:
    said = "No space left for the server's state: 0.0 MiB free of 64.0 MiB in /srv/corral, " + "x" * 300
    handler = respond(507, {"detail": [{"msg": said, "code": "error"}]})
    with pytest.raises(ServerError) as info:
        client(handler).runs_list("main")
    assert info.value.status_code == 507
    assert str(info.value) == f"{said} (/api/runs/list at {URL})"


def test_non_json_answer_is_server_error() -> None:
    handler = lambda request: httpx.Response(200, text="<html>")  # noqa: E731
    with pytest.raises(ServerError):
        client(handler).get_info()


def test_connection_refused_is_server_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(ServerUnreachable) as info, CorralClient(url, "tok", timeout=5) as c:
        c.get_info()
    assert str(info.value) == f"Cannot reach the corral server at {url}. Start it with `corral server`."


def test_empty_body_is_none_and_list_shapes_checked() -> None:
    client(lambda r: httpx.Response(200, content=b"")).runs_stop("main", ["r"])  # an empty body: no error
    with pytest.raises(ServerError):
        client(respond(200, {"not": "a list"})).fleets_list("main")
