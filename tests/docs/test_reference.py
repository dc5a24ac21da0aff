"""The user guide's generated pages (scripts/docs_reference.py): complete, and its notes name real fields."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_reference", module)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_has_every_command_and_option() -> None:
    import typer.core
    import typer.main

    from corral.cli.main import app

    text = _load().cli_reference()
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    ctx = root.context_class(root, info_name="corral")
    for name in root.list_commands(ctx):
        assert f"## `corral {name}`" in text
    assert "## `corral fleet delete`" in text and "## `corral project set-default`" in text
    assert "--max-offers N" in text and "--detach" in text


def test_configuration_reference_lists_every_field_of_every_type() -> None:
    from corral import config

    text = _load().configuration_reference()
    for model in (
        config.TaskConfiguration,
        config.ServiceConfiguration,
        config.DevEnvironmentConfiguration,
        config.FleetConfiguration,
        config.GatewayConfiguration,
        config.ResourcesSpec,
        config.SSHHostParams,
    ):
        for field in model.model_fields:
            assert f"| `{field}` |" in text, (model.__name__, field)
    assert "corral extension: `[]` means *existing instances only*" in text


def test_every_note_names_a_real_field() -> None:
    from corral.config import profiles, runs
    from corral.config.fleets import FleetConfiguration

    models: dict[str, type[BaseModel]] = {
        "BaseRunConfiguration": runs.BaseRunConfiguration,
        "ProfileParams": profiles.ProfileParams,
        "FleetConfiguration": FleetConfiguration,
    }
    for owner, field in _load().NOTES:
        assert field in models[owner].model_fields, f"NOTES names {owner}.{field}, which does not exist"


def test_hook_replaces_markers() -> None:
    out = _load().on_page_markdown("# CLI\n\n<!-- generated: cli -->\n", page=None)
    assert "<!-- generated" not in out and "## `corral apply`" in out


def test_the_lifecycle_diagrams_are_the_transition_tables() -> None:
    """docs/concepts.md shows the tables as they are: `python scripts/docs_reference.py lifecycles --write`."""
    module = _load()
    page = (ROOT / module.LIFECYCLES_PAGE).read_text()
    assert page == module.with_lifecycles(page), "run: python scripts/docs_reference.py lifecycles --write"
    assert "    running --> terminating" in page and "    idle --> busy" in page
