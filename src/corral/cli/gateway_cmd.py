"""``corral gateway [list] | get NAME | update NAME | delete NAME``: a project's gateways, as dstack 0.22.5's
``dstack gateway`` shows and changes them (``gateways/list``, ``get``, ``set_default``, ``set_wildcard_domain``,
``delete``). ``list`` prints dstack's columns (``NAME BACKEND HOSTNAME DOMAIN DEFAULT STATUS``; ``-v`` adds
``CREATED`` and ``ERROR``; ``-w`` refreshes it); ``delete`` waits until the gateway is gone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption, YesOption

if TYPE_CHECKING:
    from rich.table import Table

JSON = dict[str, Any]
NameArg = Annotated[str, typer.Argument(help="The gateway's name.", metavar="NAME")]
VerboseOption = Annotated[bool, typer.Option("-v", "--verbose", help="Show when each was created and its error.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the answer as JSON (dstack's `Gateway`).")]
POLL_S = 1.0


WatchOption = Annotated[bool, typer.Option("-w", "--watch", help="Refresh the table until Ctrl-C.")]


def gateway_default(
    ctx: typer.Context,
    project: ProjectOption = None,
    verbose: VerboseOption = False,
    watch: WatchOption = False,
    json_: JsonOption = False,
) -> None:
    """Manage the project's gateways; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        gateway_list(project=project, verbose=verbose, watch=watch, json_=json_)


def gateway_list(
    project: ProjectOption = None, verbose: VerboseOption = False, watch: WatchOption = False, json_: JsonOption = False
) -> None:
    """List the project's gateways: backend (region), host address, domain, default, status."""
    from corral.cli import render
    from corral.cli.common import client_for
    from corral.cli.errors import CLIError

    if watch and json_:
        raise CLIError("--json cannot be used with --watch")
    client, project_name = client_for(project)
    with client:
        if json_:
            import json

            print(json.dumps(client.gateways_list(project_name), indent=2))
            return
        if not watch:
            render.console().print(gateways_table(client.gateways_list(project_name), verbose))
            return
        from rich.live import Live

        try:
            with Live(console=render.console(), refresh_per_second=1) as live:
                while True:
                    live.update(gateways_table(client.gateways_list(project_name), verbose))
                    time.sleep(2)
        except KeyboardInterrupt:
            pass


def _cells(g: JSON) -> tuple[str, str, str]:
    """BACKEND, HOSTNAME and STATUS of a gateway with at most one replica (as dstack's table shows it)."""
    conf = g.get("configuration") or {}
    replicas = g.get("replicas") or []
    backend = f"{conf.get('backend') or ''} ({conf.get('region') or ''})"
    if len(replicas) == 1:
        r = replicas[0]
        return f"{r.get('backend')} ({r.get('region')})", str(r.get("hostname") or "-"), str(g.get("status"))
    return backend, str(g.get("hostname") or "-"), str(g.get("status"))


def gateways_table(found: list[JSON], verbose: bool = False) -> Table:
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    cols = ["NAME", "BACKEND", "HOSTNAME", "DOMAIN", "DEFAULT", "STATUS"] + (["CREATED", "ERROR"] if verbose else [])
    for col in cols:
        table.add_column(col)
    for g in found:
        backend, hostname, status = _cells(g)
        row = [str(g["name"]), backend, hostname, str(g.get("wildcard_domain") or "-"), "✓" if g.get("default") else ""]
        row.append(status)
        if verbose:
            row += [str(g.get("created_at") or ""), str(g.get("status_message") or "")]
        table.add_row(*row)
        if len(g.get("replicas") or []) > 1:
            for r in g["replicas"]:
                extra = [str(r.get("created_at") or ""), str(r.get("status_message") or "")] if verbose else []
                table.add_row(
                    f"   replica={r.get('replica_num')}", f"{r.get('backend')} ({r.get('region')})",
                    str(r.get("hostname") or "-"), "", "", str(r.get("status")), *extra,
                )  # fmt: skip
    return table


def gateway_get(name: NameArg, project: ProjectOption = None, json_: JsonOption = False) -> None:
    """Show a gateway (`--json`: dstack's `Gateway` as the server answers it)."""
    from corral.cli import render
    from corral.cli.common import client_for

    client, project_name = client_for(project)
    with client:
        g = _get_or_fail(client, project_name, name)
    if json_:
        import json

        print(json.dumps(g, indent=2))
        return
    render.console().print(gateways_table([g], verbose=True))


def _get_or_fail(client: Any, project: str, name: str) -> JSON:
    from corral.cli.errors import CLIError
    from corral.sdk.errors import ResourceNotExistsError

    try:
        return dict(client.gateways_get(project, name))
    except ResourceNotExistsError:
        raise CLIError(f"Gateway {name} does not exist in project {project}") from None


def gateway_update(
    name: NameArg,
    set_default: Annotated[bool, typer.Option("--set-default", help="Make it the project's default gateway.")] = False,
    domain: Annotated[
        Optional[str], typer.Option("--domain", help="Its wildcard domain (services get <run>.<domain>).", metavar="D")
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Change a gateway: make it the project's default, or set its domain."""
    from corral.cli import render
    from corral.cli.common import client_for
    from corral.cli.errors import CLIError

    if not set_default and domain is None:
        raise CLIError("Nothing to update: give --set-default and/or --domain D")
    client, project_name = client_for(project)
    with client:
        _get_or_fail(client, project_name, name)
        if set_default:
            client.gateways_set_default(project_name, name)
        if domain is not None:
            client.gateways_set_wildcard_domain(project_name, name, domain)
        g = client.gateways_get(project_name, name)
    render.console().print(gateways_table([g]))


def gateway_delete(name: NameArg, project: ProjectOption = None, yes: YesOption = False) -> None:
    """Delete a gateway, and wait until it is gone (its host is given back to its fleet)."""
    from corral.cli import render
    from corral.cli.common import client_for

    out = render.console()
    client, project_name = client_for(project)
    with client:
        _get_or_fail(client, project_name, name)
        if not yes and not render.confirm(f"Delete the gateway [code]{name}[/]?"):
            out.print("\nExiting...")
            return
        with out.status(f"Deleting gateway [code]{name}[/]..."):
            client.gateways_delete(project_name, [name])
            wait_gone(client, project_name, name)
    out.print(f"Gateway [code]{name}[/] deleted")


def wait_gone(client: Any, project: str, name: str) -> None:
    """Poll ``gateways/get`` until the gateway is gone (as dstack's CLI waits for ``resource_not_exists``)."""
    from corral.sdk.errors import ResourceNotExistsError

    while True:
        try:
            client.gateways_get(project, name)
        except ResourceNotExistsError:
            return
        time.sleep(POLL_S)
