"""The docs' "Not yet" lists and the run options' "refused" rows name only what the API refuses, and the run
options page has a row for every option of dstack's run configurations.

Each refusal the docs state carries the configuration it is about, as ``<!-- refused: {YAML} -->`` on its line
(a run option's snippet without ``type`` is added to a plain task). Every one is applied to a real server
(``runs/apply``, ``fleets/apply``, ``gateways/apply``, ``volumes/create``) and must get a 400; a "Not yet"
item or a "refused" row without one fails, so the lists cannot drift from what the server does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.config.runs import DevEnvironmentConfiguration, TaskConfiguration
from corral.config.services import ServiceConfiguration
from server_harness import make_settings, running_server, task_body

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/index.md", "docs/reference/run-options.md")
MARK = re.compile(r"<!-- refused: (.*?) -->")


def _section(text: str, heading: str) -> list[str]:
    """The lines of the ``## heading`` section."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == heading
            continue
        if inside:
            out.append(line)
    return out


def _claims() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for page in PAGES:
        for n, line in enumerate((ROOT / page).read_text().splitlines(), start=1):
            for snippet in MARK.findall(line):
                conf = yaml.safe_load(snippet)
                assert isinstance(conf, dict), f"{page}:{n}: the snippet is no mapping: {snippet}"
                found.append((f"{page}:{n}", conf))
    return found


def test_every_not_yet_item_and_refused_row_carries_its_configuration() -> None:
    unmarked = []
    for page in ("README.md", "docs/index.md"):
        items = [line for line in _section((ROOT / page).read_text(), "Not yet") if line.startswith("- ")]
        assert items, f"{page}: no items in its Not yet list"
        unmarked += [f"{page}: {line}" for line in items if not MARK.search(line)]
    for line in (ROOT / "docs/reference/run-options.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and "refused" in cells[2] and not MARK.search(line) and cells[1] != "`type`":
            unmarked.append(f"run-options.md: {cells[1]}")
    assert not unmarked, unmarked


def _request(conf: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = conf.get("type")
    if kind == "gateway":
        return "gateways/apply", {"plan": {"spec": {"configuration": conf}}}
    if kind == "volume":
        return "volumes/create", {"configuration": conf}
    if kind == "fleet":
        return "fleets/apply", {"force": False, "plan": {"spec": {"configuration": conf, "profile": {}}}}
    if kind in ("service", "dev-environment"):
        return "runs/apply", {"force": False, "plan": {"run_spec": {"configuration": conf}}}
    return "runs/apply", task_body(["true"], **conf)


async def test_what_the_docs_say_is_refused_is_refused(tmp_path: Path) -> None:
    claims = _claims()
    assert len(claims) >= 10, claims
    async with running_server(make_settings(tmp_path)) as s, s.client() as c:
        accepted = []
        for where, conf in claims:
            path, body = _request(conf)
            r = await c.post(f"/api/project/main/{path}", json=body)
            if r.status_code != 400:
                accepted.append(f"{where}: {conf} -> {r.status_code} {r.text[:200]}")
        assert not accepted, "the docs say these are refused, the server does not:\n" + "\n".join(accepted)


@pytest.mark.parametrize("model", [TaskConfiguration, ServiceConfiguration, DevEnvironmentConfiguration])
def test_the_run_options_page_has_a_row_for_every_option(model: Any) -> None:
    text = (ROOT / "docs/reference/run-options.md").read_text()
    named = set(re.findall(r"^\| ([^|]+) \|", text, flags=re.M))
    listed = {n for cell in named for n in re.findall(r"`([a-z_]+)`", cell)}
    missing = sorted(set(model.model_fields) - listed)
    assert not missing, f"docs/reference/run-options.md has no row for {missing} ({model.__name__})"
