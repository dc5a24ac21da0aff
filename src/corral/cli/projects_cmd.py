"""``corral project add|list|set-default|delete``: the projects in ``~/.corral/config.yml``; ``corral project
quota [NAME]``: a project's quota on its server (nominal, max, used, borrowed, entitlement).

``add`` checks the URL and token with ``POST /api/projects/{name}/get`` (no body, as dstack's
CLI sends it) before writing the file.
"""

from typing import Annotated, Optional

import typer

from corral.cli.common import YesOption


def project_default(ctx: typer.Context) -> None:
    """Manage the projects the CLI knows; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        project_list(verbose=False, json_=False)


def project_add(
    name: Annotated[str, typer.Option("--name", help="The project's name on the server.", metavar="NAME")],
    url: Annotated[str, typer.Option("--url", help="The server's URL, e.g. http://127.0.0.1:3000.", metavar="URL")],
    token: Annotated[str, typer.Option("--token", help="Your user token on that server.", metavar="TOKEN")],
    yes: YesOption = False,
    no: Annotated[bool, typer.Option("-n", "--no", help="Add the project without making it the default.")] = False,
) -> None:
    """Add a project (or update its URL and token) and make it the default."""
    from corral.cli import render
    from corral.cli.errors import CLIError
    from corral.domain.names import project_name_error
    from corral.sdk import config_file
    from corral.sdk.client import CorralClient
    from corral.sdk.errors import AuthError, NotFoundError

    bad = project_name_error(name)
    if bad is not None:
        raise typer.BadParameter(bad, param_hint="'--name'")
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    with CorralClient(url, token) as client:
        try:
            client.projects_get(name)
        except AuthError:
            raise CLIError(f"Forbidden: the token is not valid at {url}")
        except NotFoundError:
            raise CLIError(f"Project {name} not found at {url}")
    projects = config_file.list_projects()
    current = next((p for p in projects if p["default"]), None)
    if no:
        default = False
    elif yes or current is None or current["name"] == name:
        default = True
    else:
        default = render.confirm(f"Set [code]{name}[/] as your default project?")
    path = config_file.add_project(name, url, token, default=default)
    render.console().print(f"Configuration updated at {path}")


def project_list(
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Also ask each server who you are.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the projects as JSON (without tokens).")] = False,
) -> None:
    """List the configured projects."""
    from corral.sdk import config_file
    from corral.sdk.client import CorralClient
    from corral.sdk.errors import CorralError

    listed: list[dict[str, object]] = []
    for p in config_file.list_projects():
        entry: dict[str, object] = {"name": p["name"], "url": p["url"], "default": p["default"]}
        if verbose:
            try:
                with CorralClient(p["url"], p["token"], timeout=5) as client:
                    entry["user"] = client.get_my_user().get("username")
            except CorralError:
                entry["user"] = None
        listed.append(entry)
    if json_:
        import json

        print(json.dumps({"projects": listed}))
        return
    from rich.table import Table

    from corral.cli import render

    table = Table(box=None)
    table.add_column("PROJECT", style="bold", no_wrap=True)
    table.add_column("URL", style="grey58")
    if verbose:
        table.add_column("USER", style="grey58")
    table.add_column("DEFAULT", justify="center")
    for e in listed:
        row = [str(e["name"]), str(e["url"])]
        if verbose:
            row.append("(unavailable)" if e["user"] is None else str(e["user"]))
        row.append("✓" if e["default"] else "")
        table.add_row(*row, style="bold" if e["default"] else None)
    render.console().print(table)


def project_set_default(
    name: Annotated[str, typer.Argument(help="The project to make the default.", metavar="NAME")],
) -> None:
    """Make a configured project the default."""
    from corral.cli import render
    from corral.sdk import config_file

    config_file.set_default(name)
    render.console().print("[grey58]OK[/]")


def project_delete(
    name: Annotated[str, typer.Option("--name", help="The project to forget.", metavar="NAME")],
    yes: YesOption = False,
) -> None:
    """Remove a project from the CLI's configuration (the server keeps it)."""
    from corral.cli import render
    from corral.sdk import config_file

    if yes or render.confirm(f"Are you sure you want to delete project [code]{name}[/]?"):
        config_file.delete_project(name)
        render.console().print("[grey58]OK[/]")


def project_quota(
    name: Annotated[
        Optional[str], typer.Argument(help="The project (default: the default project).", show_default=False)
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the server's answer as JSON.")] = False,
) -> None:
    """Show the project's quota: nominal, max, used, borrowed and entitlement, by resource."""
    from corral.cli import common, render

    client, project = common.client_for(name)
    with client:
        usage = client.quotas_usage(project)
    if json_:
        import json

        render.console().print_json(json.dumps(usage))
        return
    render.console().print(render.quota_table(usage))
