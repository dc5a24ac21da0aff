"""No field of dstack 0.22.5's run configurations, profiles, fleet or AWS volume configurations is accepted and then
silently ignored: each is applied (``option_effects.yaml`` names the test that shows its effect) or refused
(it names a configuration the API answers with a 400 naming the field), or both for a field applied in part.

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

# The models whose fields are checked, by the map's section they belong to.
_FIELDS = r"""
import json
from dstack._internal.core.models import configurations, fleets, profiles, volumes
models = {
    "run": [configurations.TaskConfiguration, configurations.ServiceConfiguration,
            configurations.DevEnvironmentConfiguration, profiles.ProfileParams],
    "fleet": [fleets.FleetConfiguration],
    "volume": [volumes.AWSVolumeConfiguration],
}
print(json.dumps({k: sorted({f for m in ms for f in m.model_fields}) for k, ms in models.items()}))
"""


def _dstack_fields() -> dict[str, list[str]]:
    try:
        python = client_venv() / "bin" / "python"
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION} to read its models:\n{e}", pytrace=False)
    out = subprocess.run([str(python), "-c", _FIELDS], capture_output=True, text=True, timeout=120, check=True)
    fields: dict[str, list[str]] = json.loads(out.stdout)
    return fields


def _map() -> dict[str, dict[str, dict[str, Any]]]:
    loaded: dict[str, dict[str, dict[str, Any]]] = yaml.safe_load(MAP.read_text())
    return loaded


def test_every_field_of_dstacks_models_is_applied_or_refused() -> None:
    fields, mapped = _dstack_fields(), _map()
    assert len(fields["run"]) > 50 and "auto_cleanup_duration" in fields["volume"], fields
    problems = []
    for section, names in fields.items():
        have = mapped.get(section, {})
        problems += [f"{section}.{n}: neither a test nor a refusal" for n in names if not have.get(n)]
        problems += [f"{section}.{n}: not a field of dstack {DSTACK_VERSION}" for n in sorted(set(have) - set(names))]
        for n, entry in have.items():
            if set(entry) - {"test", "refused"} or not ({"test", "refused"} & set(entry)):
                problems.append(f"{section}.{n}: an entry has `test` and/or `refused`, not {sorted(entry)}")
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
