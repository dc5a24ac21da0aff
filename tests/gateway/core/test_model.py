"""The gateway's state model: management bodies parsed (every error naming its field), changes, the state file."""

from __future__ import annotations

from typing import Any

import pytest

from corral.gateway.core import model
from corral.gateway.core.model import BadRequest, State


def _svc(**fields: Any) -> dict[str, Any]:
    return {"host": "a.gw.test", "https": True, "auth": False, "upstream_path": "/proxy/services/p/r/", **fields}


LIMITS = [
    {"prefix": "/", "key": {"type": "ip_address"}, "rps": 2},
    {"prefix": "/v1", "key": {"type": "header", "header": "X-Api-Key"}, "rps": 0.5, "burst": 4},
]


def test_a_full_service() -> None:
    svc = model.parse_service("p", "r", _svc(host="A.GW.test", rate_limits=LIMITS, read_timeout=9))
    assert svc.host == "a.gw.test" and svc.read_timeout == 9
    # dstack 0.22.5 defaults: DSTACK_DEFAULT_SERVICE_CLIENT_MAX_BODY_SIZE 64 MiB, DSTACK_SERVICE_CLIENT_TIMEOUT 300 s
    plain = model.parse_service("p", "r", _svc())
    assert (plain.client_max_body_size, plain.read_timeout) == (64 * 1024 * 1024, 300)
    assert svc.rate_limits == (model.RateLimit("/", None, 2.0, 0), model.RateLimit("/v1", "X-Api-Key", 0.5, 4))
    assert model.parse_service("p", "r", model.service_json(svc)) == svc


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("x", "service: the body must be a JSON object"),
        (_svc(more=1), "service: unknown field 'more'"),
        ({"https": True}, "service.upstream_path is required"),
        (_svc(upstream_path=""), "service.upstream_path must be a non-empty string"),
        (_svc(upstream_path="x/"), "service.upstream_path must be a path"),
        (_svc(upstream_path="/a b"), "service.upstream_path must be a path"),
        (_svc(rate_limits={}), "service.rate_limits must be a list"),
        (_svc(rate_limits=[1]), "service.rate_limits[0]: the body must be a JSON object"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}, "rps": 1, "x": 1}]), "rate_limits[0]: unknown field 'x'"),
        (_svc(rate_limits=[{"prefix": 5, "key": {}, "rps": 1}]), "rate_limits[0].prefix must start with '/'"),
        (_svc(rate_limits=[{"prefix": "/" * 4095, "key": {}, "rps": 1}]), "rate_limits[0].prefix"),
        (_svc(rate_limits=[{"rps": 1}]), "service.rate_limits[0].key is required"),
        (_svc(rate_limits=[{"key": {"type": "header"}, "rps": 1}]), "rate_limits[0].key.header is required"),
        (_svc(rate_limits=[{"key": {"type": "header", "header": "a b"}, "rps": 1}]), "key.header must be letters"),
        (
            _svc(rate_limits=[{"key": {"type": "header", "header": "h", "x": 1}, "rps": 1}]),
            "rate_limits[0].key: unknown field 'x'",
        ),
        (_svc(rate_limits=[{"key": {"type": "ip_address", "header": "h"}, "rps": 1}]), "key: unknown field 'header'"),
        (_svc(rate_limits=[{"key": {"type": "cookie"}, "rps": 1}]), "key.type must be 'ip_address' or 'header'"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}}]), "rate_limits[0].rps is required"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}, "rps": True}]), "rate_limits[0].rps must be a number"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}, "rps": "1"}]), "rate_limits[0].rps must be a number"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}, "rps": 0.01}]), "rate_limits[0].rps must be a number"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}, "rps": 2**62}]), "rate_limits[0].rps must be a number"),
        (_svc(rate_limits=[{"key": {"type": "ip_address"}, "rps": 1, "burst": -1}]), "burst must be an integer >= 0"),
        (_svc(rate_limits=[LIMITS[0], LIMITS[0]]), "service.rate_limits: each prefix may appear once"),
        (_svc(client_max_body_size=True), "service.client_max_body_size must be an integer >= 0"),
        (_svc(client_max_body_size=1.5), "service.client_max_body_size must be an integer >= 0"),
        (_svc(host="-bad-"), "service.host '-bad-' is not a valid host name"),
        (_svc(auth=1), "service.auth must be true or false"),
    ],
)
def test_bad_service_bodies(body: Any, detail: str) -> None:
    with pytest.raises(BadRequest) as e:
        model.parse_service("p", "r", body)
    assert detail in str(e.value)


def test_names_tokens_config_entrypoint_challenge_certificate() -> None:
    with pytest.raises(BadRequest, match=r"project 'b/d' is not a valid name"):
        model.parse_service("b/d", "r", _svc())
    with pytest.raises(BadRequest, match=r"challenge token"):
        model.check_token("a.b")
    assert model.check_token("a-b_C") == "a-b_C"
    config = model.parse_config({"server_url": "http://127.0.0.1:8100/", "secret": "s"})
    assert (config.server_url, config.host, config.port) == ("http://127.0.0.1:8100", "127.0.0.1", 8100)
    assert model.parse_config({"server_url": "http://[::1]:80", "secret": "s"}).host == "::1"
    for url in ("http://h:0", "http://h:99999", "http://h", "ftp://h:1"):
        with pytest.raises(BadRequest, match=r"config.server_url"):
            model.parse_config({"server_url": url, "secret": "s"})
    with pytest.raises(BadRequest, match=r"config.secret is required"):
        model.parse_config({"server_url": "http://h:1"})
    assert model.parse_entrypoint("Gateway.GW.test", {"project": "p", "https": False}) == model.Entrypoint(
        "gateway.gw.test", "p", False
    )
    with pytest.raises(BadRequest, match=r"entrypoint: unknown field 'x'"):
        model.parse_entrypoint("g.t", {"project": "p", "https": True, "x": 1})
    assert model.parse_challenge({"key_authorization": "tok.thumb-_"}) == "tok.thumb-_"
    with pytest.raises(BadRequest, match=r"key_authorization must be"):
        model.parse_challenge({"key_authorization": "a b"})
    with pytest.raises(BadRequest, match=r"challenge: unknown field"):
        model.parse_challenge({"key_authorization": "a", "b": 1})
    assert model.parse_certificate({"fullchain_pem": "c", "key_pem": "k"}) == ("c", "k")
    with pytest.raises(BadRequest, match=r"certificate: unknown field"):
        model.parse_certificate({"fullchain_pem": "c", "key_pem": "k", "chain": 1})


def test_changes_and_host_conflicts() -> None:
    svc = model.parse_service("p", "r", _svc())
    state = model.put_service(State(), svc)
    assert model.put_service(state, svc) == state  # the same service again: the same state
    moved = model.parse_service("p", "r", _svc(host="b.gw.test"))
    assert model.put_service(state, moved).services == {("p", "r"): moved}
    with pytest.raises(BadRequest, match=r"service.host 'a.gw.test' is already used by the service p/r"):
        model.put_service(state, model.parse_service("q", "r", _svc()))
    with pytest.raises(BadRequest, match=r"entrypoint host 'a.gw.test' is already used by the service p/r"):
        model.put_entrypoint(state, model.Entrypoint("a.gw.test", "p", True))
    ep = model.Entrypoint("gateway.gw.test", "p", True)
    state = model.put_entrypoint(model.put_entrypoint(state, ep), ep)
    with pytest.raises(BadRequest, match=r"already used by the entrypoint of project p"):
        model.put_service(state, model.parse_service("q", "s", _svc(host="gateway.gw.test")))
    state = model.put_challenge(state, "tok", "tok.t")
    state = model.put_certificate(state, "a.gw.test", "2031-01-01T00:00:00Z")
    assert model.delete_challenge(state, "tok").challenges == {}
    assert model.delete_entrypoint(state, "gateway.gw.test").entrypoints == {}
    assert model.delete_service(state, "p", "r").services == {}
    assert model.delete_service(state, "p", "none") == state


def test_the_state_file_round_trips() -> None:
    state = State(config=model.parse_config({"server_url": "http://127.0.0.1:9", "secret": "s"}))
    state = model.put_service(state, model.parse_service("p", "r", _svc(rate_limits=LIMITS)))
    state = model.put_entrypoint(state, model.Entrypoint("gateway.gw.test", "p", True))
    state = model.put_certificate(model.put_challenge(state, "tok", "tok.t"), "a.gw.test", "2031-01-01T00:00:00Z")
    assert model.from_json(model.to_json(state)) == state
    assert model.from_json({}) == State()
    assert model.to_json(State())["config"] is None


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        ([], "state: the body must be a JSON object"),
        ({"services": {}}, "state.services must be a list"),
        ({"services": [{"project": "p", "run": "r", "spec": {}}]}, "service.upstream_path is required"),
        ({"entrypoints": [{"host": "g.t", "project": "p"}]}, "entrypoint.https must be true or false"),
        ({"challenges": []}, "state.challenges: the body must be a JSON object"),
        ({"challenges": {"tok": 1}}, "state.challenges must map names to strings"),
        ({"certificates": {"bad host": "x"}}, "state.certificates 'bad host' is not a valid host name"),
    ],
)
def test_a_damaged_state_file_is_named(data: Any, detail: str) -> None:
    with pytest.raises(BadRequest) as e:
        model.from_json(data)
    assert detail in str(e.value)
