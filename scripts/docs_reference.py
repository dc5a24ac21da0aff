"""The user guide's generated reference pages: the CLI (from the Typer app) and the `.dstack.yml` fields
(from the configuration models), so that neither can drift from the code.

MkDocs loads this file as a hook (``hooks:`` in ``mkdocs.yml``): a page containing the marker
``<!-- generated: cli -->`` or ``<!-- generated: configuration -->`` gets the generated text in its place.
``python scripts/docs_reference.py cli|configuration`` prints the same text.

The lifecycle diagrams (``lifecycles``: from the transition tables of ``domain/statuses.py``) are kept in their
page between markers instead, so that the page reads as it renders: ``lifecycles --write`` rewrites them, and a
test fails while the page differs from the tables.

Compatibility notes for single fields live in ``NOTES`` below; every key must name a real field (a test
checks it), so a renamed field cannot leave a stale note behind.
"""

from __future__ import annotations

import enum
import re
import sys
import types
import typing
from typing import Any

#: Per model and field: how corral treats it, where that differs from dstack 0.22.5 or is a corral extension.
#: "corral extension" in a note marks a meaning dstack does not have.
NOTES: dict[tuple[str, str], str] = {
    ("BaseRunConfiguration", "image"): "Runs in a container through the host's Docker engine; none: a host process "
    "(or `CORRAL_DEFAULT_IMAGE`).",
    ("BaseRunConfiguration", "repos"): "corral extension: a directory without a git remote travels as an archive "
    "(a *local* repo; dstack's CLI refuses it).",
    ("BaseRunConfiguration", "volumes"): "Instance volumes (`/host:/container`) only; network volumes are a 400.",
    ("BaseRunConfiguration", "python"): "Without `image`: a virtualenv of that Python (uv, or the host's "
    "`python3 -m venv` of that version), else the job fails saying why. See Run options.",
    ("BaseRunConfiguration", "docker"): "`true` is a 400 (not supported yet).",
    ("BaseRunConfiguration", "dstack"): "`true` is a 400 (not supported yet).",
    ("ProfileParams", "instances"): "corral extension: `[]` means *existing instances only* (dstack rejects an "
    "empty list).",
    ("ProfileParams", "retry"): "Divergence: with no `retry` a job that finds its fleets full *waits* in the queue "
    "(see Concepts); `duration` counts from the first failure of a streak of quick ones.",
    ("ProfileParams", "backends"): "corral's backends are `local` and `ssh` (fleets; `remote` on the wire); cloud "
    "names validate. A run sees only the instances and offers of the backends it lists.",
    ("ProfileParams", "utilization_policy"): "A 400 in runs: it needs job metrics (not collected yet).",
    ("ProfileParams", "schedule"): "Tasks and dev environments; a scheduled service is a 400. See Run options.",
    ("FleetConfiguration", "nodes"): "A hard limit: `nodes.max` is never exceeded, under any concurrency.",
    ("FleetConfiguration", "ssh_config"): "An SSH fleet; cloud-only fields beside it are a 400 naming them.",
}


def _type_name(t: Any) -> str:
    """A short, readable rendering of a field's annotation."""
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " | ".join(dict.fromkeys(names))
    if origin in (list, tuple, set):
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"dict[{_type_name(args[0])}, {_type_name(args[1])}]" if args else "dict"
    if isinstance(t, type) and issubclass(t, enum.Enum):
        if len(t) > 8:
            return f"{t.__name__} (one of {len(t)} names)"
        return " | ".join(f'"{m.value}"' for m in t)
    if isinstance(t, type):
        return t.__name__
    return re.sub(r"\b[a-z_]+\.", "", str(t))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return ""
    value = field.default
    if value is None or repr(value) == "PydanticUndefined":
        return "required" if field.is_required() else ""
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`" if not isinstance(value, str) else f'`"{value}"`'


def _table(model: type[Any], fields: list[str], owner: dict[str, str]) -> str:
    rows = ["| field | type | default | notes |", "|---|---|---|---|"]
    for name in fields:
        field = model.model_fields[name]
        note = NOTES.get((owner.get(name, model.__name__), name), "")
        cell = _type_name(field.annotation).replace("|", "\\|")
        rows.append(f"| `{name}` | {cell} | {_default(field)} | {note} |")
    return "\n".join(rows)


def _owners(model: type[Any]) -> dict[str, str]:
    """Each field of ``model`` and the most basic class in its hierarchy that declares it."""
    owners: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        for name in getattr(cls, "__annotations__", {}):
            if name in model.model_fields and name not in owners:
                owners[name] = cls.__name__
    return owners


def configuration_reference() -> str:
    """Markdown tables of every `.dstack.yml` field corral accepts, per configuration type."""
    from corral import config
    from corral.config.profiles import ProfileParams
    from corral.config.runs import BaseRunConfiguration

    run_types = [
        ("task", config.TaskConfiguration),
        ("service", config.ServiceConfiguration),
        ("dev-environment", config.DevEnvironmentConfiguration),
    ]
    shared_run = list(BaseRunConfiguration.model_fields)
    profile = list(ProfileParams.model_fields)
    task_owners = _owners(config.TaskConfiguration)
    out = [
        "## Fields every run type shares",
        "",
        "`task`, `service` and `dev-environment` all accept these (dstack's `BaseRunConfiguration`).",
        "",
        _table(config.TaskConfiguration, [f for f in shared_run if f != "type"], task_owners),
        "",
        "## Profile fields (runs and `.dstack/profiles.yml`)",
        "",
        _table(
            config.TaskConfiguration, [f for f in profile if f in config.TaskConfiguration.model_fields], task_owners
        ),
    ]
    for type_name, model in run_types:
        own = [f for f in model.model_fields if f not in shared_run and f not in profile]
        out += ["", f"## `type: {type_name}`", "", _table(model, own, _owners(model))]
    others: list[tuple[str, Any]] = [
        ("fleet", config.FleetConfiguration),
        ("gateway", config.GatewayConfiguration),
    ]
    for type_name, model in others:
        out += ["", f"## `type: {type_name}`", "", _table(model, list(model.model_fields), _owners(model))]
    parts: list[tuple[str, Any]] = [
        ("`resources`", config.ResourcesSpec),
        ("`resources.gpu`", config.GPUSpec),
        ("`resources.cpu`", config.CPUSpec),
        ("`resources.disk`", config.DiskSpec),
        ("`retry`", config.RetrySpec),
        ("`repos[]`", config.RepoSpec),
        ("fleet `nodes`", config.FleetNodesSpec),
        ("fleet `ssh_config`", config.SSHParams),
        ("fleet `ssh_config.hosts[]`", config.SSHHostParams),
    ]
    out += ["", "## Nested objects"]
    for title, model in parts:
        out += ["", f"### {title}", "", _table(model, list(model.model_fields), _owners(model))]
    return "\n".join(out) + "\n"


def cli_reference() -> str:
    """``--help`` of every ``corral`` command, as the CLI prints it."""
    import typer.main

    from corral.cli.main import app

    root = typer.main.get_command(app)
    out: list[str] = []

    def walk(cmd: Any, path: list[str], parent: Any) -> None:
        # Typer builds on its own copy of Click: take the context class from the command itself.
        ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent, terminal_width=100, max_content_width=100)
        title = " ".join(path)
        out.extend([f"## `{title}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""])
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk(sub, [*path, name], ctx)

    walk(root, ["corral"], None)
    return "\n".join(out)


def lifecycles() -> str:
    """Mermaid state diagrams of the statuses of jobs, runs, instances and fleets, from the transition tables."""
    from corral.domain.statuses import INITIAL, TRANSITIONS

    out: list[str] = []
    for kind, (statuses, table) in TRANSITIONS.items():
        out += [f"**{kind.capitalize()}**", "", "```mermaid", "stateDiagram-v2"]
        out += [f"    [*] --> {s.value}" for s in INITIAL[kind]]
        for old in statuses:
            out += [f"    {old.value} --> {new.value}" for new in statuses if new in table[old]]
            if not table[old]:
                out.append(f"    {old.value} --> [*]")
        out += ["```", ""]
    return "\n".join(out)


#: The page with the lifecycle diagrams, and the markers the generated text sits between (kept in the page, so
#: that it reads as it renders; ``lifecycles --write`` rewrites it, and a test fails while it differs).
LIFECYCLES_PAGE = "docs/concepts.md"
LIFECYCLES_BEGIN = (
    "<!-- lifecycles: generated from the tables of src/corral/domain/statuses.py; "
    "run `python scripts/docs_reference.py lifecycles --write` after changing them -->"
)
LIFECYCLES_END = "<!-- /lifecycles -->"


def with_lifecycles(page: str) -> str:
    """``page`` with the text between the lifecycle markers generated anew."""
    head, begin, rest = page.partition(LIFECYCLES_BEGIN)
    _, end, tail = rest.partition(LIFECYCLES_END)
    if not begin or not end:
        raise ValueError(f"{LIFECYCLES_PAGE} lacks the lifecycle markers")
    return f"{head}{LIFECYCLES_BEGIN}\n\n{lifecycles()}{LIFECYCLES_END}{tail}"


GENERATORS = {"cli": cli_reference, "configuration": configuration_reference, "lifecycles": lifecycles}


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    """MkDocs hook: replace each ``<!-- generated: NAME -->`` marker with its generated text."""
    for name, generate in GENERATORS.items():
        if name == "lifecycles":
            continue  # kept in its page (``with_lifecycles``)
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown


if __name__ == "__main__":
    if sys.argv[1:] == ["lifecycles", "--write"]:
        from pathlib import Path

        page = Path(__file__).resolve().parents[1] / LIFECYCLES_PAGE
        page.write_text(with_lifecycles(page.read_text()))
        sys.exit(0)
    if len(sys.argv) != 2 or sys.argv[1] not in GENERATORS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(GENERATORS)} | lifecycles --write")
    sys.stdout.write(GENERATORS[sys.argv[1]]())
