"""``corral secret [list] | get NAME | set NAME [VALUE] | delete NAME``: a project's secrets, as dstack's
``dstack secret`` has them (``secrets/*``). ``set`` without a VALUE reads it from standard input (or asks
for it without echoing it at a terminal), so that it stays out of the shell's history.
"""

import sys
from typing import Annotated, Optional

import typer

from corral.cli.common import ProjectOption, YesOption


def secret_default(ctx: typer.Context, project: ProjectOption = None) -> None:
    """Manage the project's secrets; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        secret_list(project=project)


def secret_list(project: ProjectOption = None) -> None:
    """List the project's secrets (names only: values are never listed)."""
    from rich.table import Table

    from corral.cli import render
    from corral.cli.common import client_for

    client, project_name = client_for(project)
    with client:
        found = client.secrets_list(project_name)
    out = render.console()
    if not found:
        out.print(f"No secrets in project [code]{project_name}[/]")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("NAME")
    table.add_column("VALUE")
    for s in found:
        table.add_row(str(s["name"]), "******")
    out.print(table)


def secret_get(
    name: Annotated[str, typer.Argument(help="The secret's name.", metavar="NAME")],
    project: ProjectOption = None,
) -> None:
    """Print a secret's value."""
    from corral.cli.common import client_for
    from corral.cli.errors import CLIError
    from corral.sdk.errors import ResourceNotExistsError

    client, project_name = client_for(project)
    with client:
        try:
            found = client.secrets_get(project_name, name)
        except ResourceNotExistsError:
            raise CLIError(f"Secret {name} does not exist in project {project_name}")
    typer.echo(found.get("value") or "")


def _read_value(name: str) -> str:
    if not sys.stdin.isatty():
        return sys.stdin.read().rstrip("\n")
    return str(typer.prompt(f"Value of {name}", hide_input=True))


def secret_set(
    name: Annotated[str, typer.Argument(help="The secret's name (letters, digits, - and _).", metavar="NAME")],
    value: Annotated[
        Optional[str],
        typer.Argument(
            help="The value; without it, read from standard input (or asked for, not echoed).",
            metavar="[VALUE]",
            show_default=False,
        ),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Create a secret or change its value."""
    from corral.cli import render
    from corral.cli.common import client_for

    text = value if value is not None else _read_value(name)
    client, project_name = client_for(project)
    with client:
        client.secrets_create_or_update(project_name, name, text)
    render.console().print("OK")


def secret_delete(
    name: Annotated[str, typer.Argument(help="The secret to delete.", metavar="NAME")],
    project: ProjectOption = None,
    yes: YesOption = False,
) -> None:
    """Delete a secret."""
    from corral.cli import render
    from corral.cli.common import client_for

    out = render.console()
    if not yes and not render.confirm(f"Delete the secret [code]{name}[/]?"):
        out.print("\nExiting...")
        return
    client, project_name = client_for(project)
    with client:
        client.secrets_delete(project_name, [name])
    out.print(f"Secret [code]{name}[/] deleted")
