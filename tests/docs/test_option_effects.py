"""No field of dstack 0.22.5's run configurations, profiles, fleet or AWS volume configurations, nested fields
included (``resources.gpu.vendor``, ``probes.headers.name``), is accepted and then silently ignored: each is
applied (``option_effects.yaml`` names the test that shows its effect) or refused (it names a configuration the
API answers with a 400 naming the field), or both for a field applied in part.

The field list comes from the official client's own pydantic models (its virtualenv is the end-to-end tests',
``tests/e2e/dstack_client_env.py``), so a field a new dstack adds fails here until it is mapped. Every test
named is collected by pytest (a renamed or deleted test fails here), and every refusal is applied to a real
server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dstack_client_env import DSTACK_VERSION, ClientInstallError, client_venv

from server_harness import fleet_body, make_settings, running_server, task_body

ROOT = Path(__file__).resolve().parents[2]
MAP = Path(__file__).with_name("option_effects.yaml")

# The models whose fields are checked, by the map's section they belong to, walked down into every nested model
# (``resources.gpu.vendor``, ``probes.headers.name``, ``ssh_config.hosts.proxy_jump.user``...). A root model (``env``)
# is looked through; dstack's value types are not walked into: a range (``Range``: ``1..2``, written whole), a size
# (``Memory``) and the client's placeholder of an ``env`` name given without a value (``EnvSentinel``).
_FIELDS = r"""
import json, typing
import pydantic
from dstack._internal.core.models import configurations, fleets, profiles, volumes
VALUES = {"Range", "Memory", "EnvSentinel"}
def nested(ann):
    if typing.get_origin(ann) is not None:
        return [m for a in typing.get_args(ann) for m in nested(a)]
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        if ann.__name__.split("[")[0] in VALUES:
            return []
        if issubclass(ann, pydantic.RootModel):
            return nested(ann.model_fields["root"].annotation)
        return [ann]
    return []
def walk(model, prefix, seen, out):
    for name, f in model.model_fields.items():
        out.add(prefix + name)
        for m in nested(f.annotation):
            if m not in seen:
                walk(m, prefix + name + ".", seen | {m}, out)
models = {
    "run": [configurations.TaskConfiguration, configurations.ServiceConfiguration,
            configurations.DevEnvironmentConfiguration, profiles.ProfileParams],
    "fleet": [fleets.FleetConfiguration],
    "volume": [volumes.AWSVolumeConfiguration],
}
fields = {}
for section, ms in models.items():
    out = set()
    for m in ms:
        walk(m, "", {m}, out)
    fields[section] = sorted(out)
print(json.dumps(fields))
"""


def _dstack_fields() -> dict[str, list[str]]:
    try:
        python = client_venv() / "bin" / "python"
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION} to read its models:\n{e}", pytrace=False)
    out = subprocess.run([str(python), "-c", _FIELDS], capture_output=True, text=True, timeout=120, check=True)
    fields: dict[str, list[str]] = json.loads(out.stdout)
    return fields


Map = dict[str, dict[str, dict[str, Any]]]


def _map() -> Map:
    loaded: Map = yaml.safe_load(MAP.read_text())
    return loaded


def _parts_as(section: str, value: str | list[str]) -> tuple[str, str]:
    return (value[0], value[1]) if isinstance(value, list) else (section, value)


def _covered(mapped: Map, section: str, name: str) -> bool:
    """Whether ``name`` has its entry, or is a part of an option refused whatever it holds (an entry with
    ``refused`` and no ``test``: none of its parts can be accepted and ignored), or a part of a field whose
    ``parts_as`` names another field that covers the same part."""
    have = mapped.get(section, {})
    if have.get(name):
        return True
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        entry = have.get(".".join(parts[:i]))
        if entry is not None and "test" not in entry:
            return True
        if entry is not None and "parts_as" in entry:
            to_section, to_field = _parts_as(section, entry["parts_as"])
            return _covered(mapped, to_section, ".".join([to_field, *parts[i:]]))
    return False


def _entry_problems(mapped: Map, section: str, name: str, entry: dict[str, Any]) -> list[str]:
    if set(entry) - {"test", "refused", "parts_as"} or not ({"test", "refused"} & set(entry)):
        return [f"{section}.{name}: an entry has `test` and/or `refused` (and `parts_as`), not {sorted(entry)}"]
    if "parts_as" in entry:
        to_section, to_field = _parts_as(section, entry["parts_as"])
        if to_field not in mapped.get(to_section, {}):
            return [f"{section}.{name}: parts_as names {to_section}.{to_field}, which has no entry"]
    return []


def test_every_field_of_dstacks_models_is_applied_or_refused() -> None:
    fields, mapped = _dstack_fields(), _map()
    assert len(fields["run"]) > 50 and "auto_cleanup_duration" in fields["volume"], fields
    assert {"resources.gpu.vendor", "probes.headers.name", "groups.router.type"} <= set(fields["run"]), fields
    assert "ssh_config.hosts.proxy_jump.user" in fields["fleet"], fields
    problems = []
    for section, names in fields.items():
        have = mapped.get(section, {})
        problems += [f"{section}.{n}: neither a test nor a refusal" for n in names if not _covered(mapped, section, n)]
        problems += [f"{section}.{n}: not a field of dstack {DSTACK_VERSION}" for n in sorted(set(have) - set(names))]
        for n, entry in have.items():
            problems += _entry_problems(mapped, section, n, entry)
    assert not problems, "option_effects.yaml:\n" + "\n".join(problems)


def test_every_test_the_map_names_exists() -> None:
    ids = sorted({e["test"] for section in _map().values() for e in section.values() if "test" in e})
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    collected = {line.split("[")[0] for line in out.stdout.splitlines() if "::" in line}
    missing = [i for i in ids if i not in collected]
    assert not missing, f"option_effects.yaml names tests pytest does not collect: {missing}\n{out.stdout[-3000:]}"


def _request(section: str, conf: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if section == "volume":
        return "volumes/create", {"configuration": {"type": "volume", "backend": "aws", "region": "r", **conf}}
    if section == "fleet":
        return "fleets/apply", fleet_body(**conf)
    if conf.get("type") in ("service", "dev-environment"):
        return "runs/apply", {"force": False, "plan": {"run_spec": {"configuration": conf}}}
    return "runs/apply", task_body(["true"], **conf)


async def test_every_refusal_the_map_names_is_a_400_naming_the_field(tmp_path: Path) -> None:
    refusals = [(s, n, e["refused"]) for s, entries in _map().items() for n, e in entries.items() if "refused" in e]
    assert refusals
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        wrong = []
        for section, name, refusal in refusals:
            path, body = _request(section, refusal["conf"])
            r = await c.post(f"/api/project/main/{path}", json=body)
            if r.status_code != 400 or refusal["says"] not in r.text:
                wrong.append(f"{section}.{name}: {refusal['conf']} -> {r.status_code} {r.text[:300]}")
        assert not wrong, "these are accepted, or refused without naming the field:\n" + "\n".join(wrong)
