"""``FleetSpec``: a request's fleet spec normalised and typed, a stored one read back, a name set in place."""

from __future__ import annotations

from pathlib import Path

import orjson

from corral.config import fleet_spec
from corral.domain.documents import spec_configuration
from corral.schemas.requests import FleetSpecIn
from corral.services.fleets import normalize_spec
from corral.settings import Settings

SETTINGS = Settings(server_dir=Path("/nonexistent"), database_url="sqlite+aiosqlite://", max_nodes=100)
SSH = {"type": "fleet", "ssh_config": {"user": "u", "hosts": ["10.0.0.1", {"hostname": "h", "blocks": "auto"}]}}
CLOUD = {"type": "fleet", "nodes": "1..3", "resources": {"gpu": "A100:2"}, "backends": ["aws"], "reservation": "cr-1"}


def test_normalized_spec_is_typed_and_reads_back() -> None:
    spec = normalize_spec(FleetSpecIn(configuration=CLOUD, profile={}), ("spec",), SETTINGS)
    assert not spec.is_ssh and spec.name is None
    assert spec.conf.reservation == "cr-1" and spec.conf.resources is not None
    assert list(spec.document) == ["configuration", "configuration_path", "profile", "autocreated"]
    again = fleet_spec.read(orjson.loads(orjson.dumps(spec.document)))
    assert again.conf == spec.conf and again.document == spec.document


def test_named_keeps_the_document_order_and_leaves_the_original() -> None:
    spec = normalize_spec(FleetSpecIn(configuration=SSH, profile={}), ("spec",), SETTINGS)
    named = spec.named("my-fleet")
    assert named.name == "my-fleet" and named.conf.name == "my-fleet"
    assert list(named.configuration) == list(spec.configuration)
    assert spec.name is None and spec.configuration["name"] is None
    assert named.is_ssh and fleet_spec.is_ssh(named.document)


def test_stored_documents_without_configuration() -> None:
    assert spec_configuration(None) == {} and spec_configuration({"configuration": None}) == {}
    assert not fleet_spec.is_ssh({}) and not fleet_spec.is_ssh({"configuration": {"ssh_config": None}})
