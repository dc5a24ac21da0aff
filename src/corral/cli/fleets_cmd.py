"""``corral fleet [list]``, ``corral fleet get NAME --json`` and ``corral fleet delete NAME [-i NUM]``.

``list`` is ``POST /api/project/{p}/fleets/list {"include_imported": true}``; ``delete`` checks
the fleet with ``fleets/get`` and calls ``fleets/delete`` or ``fleets/delete_instances``; ``get`` prints
``fleets/get``'s answer (by name, or ``--id``) as indented JSON, as dstack's ``fleet get`` does.
"""

from typing import Annotated, Optional

import typer

from corral.cli.common import ProjectOption, YesOption

VerboseOption = Annotated[
    bool, typer.Option("-v", "--verbose", help="Show resources and errors of fleets and instances.")
]
WatchOption = Annotated[bool, typer.Option("-w", "--watch", help="Refresh the table until Ctrl-C.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the fleets as JSON.")]


def fleet_list(
    ctx: typer.Context,
    project: ProjectOption = None,
    verbose: VerboseOption = False,
    watch: WatchOption = False,
    json_: JsonOption = False,
) -> None:
    """List fleets and their instances (the default subcommand)."""
    if ctx.invoked_subcommand is None:
        _list(project, verbose, watch, json_)


def fleet_list_cmd(
    project: ProjectOption = None,
    verbose: VerboseOption = False,
    watch: WatchOption = False,
    json_: JsonOption = False,
) -> None:
    """List fleets and their instances."""
    _list(project, verbose, watch, json_)


def _list(project: Optional[str], verbose: bool, watch: bool, json_: bool = False) -> None:
    import time

    from corral.cli import render
    from corral.cli.common import client_for
    from corral.cli.errors import CLIError

    if watch and json_:
        raise CLIError("--json cannot be used with --watch")
    client, project_name = client_for(project)
    with client:
        if json_:
            import json

            print(json.dumps({"project": project_name, "fleets": client.fleets_list(project_name)}))
            return
        if not watch:
            fleets = client.fleets_list(project_name)
            render.console().print(render.fleets_table(fleets, project_name, verbose))
            return
        from rich.live import Live

        try:
            with Live(console=render.console(), refresh_per_second=1) as live:
                while True:
                    fleets = client.fleets_list(project_name)
                    live.update(render.fleets_table(fleets, project_name, verbose))
                    time.sleep(2)
        except KeyboardInterrupt:
            pass


def fleet_delete(
    name: Annotated[str, typer.Argument(help="The fleet to delete.", metavar="NAME")],
    instances: Annotated[
        Optional[list[int]],
        typer.Option(
            "-i",
            "--instance",
            help="Delete only this instance (its number in the fleet); repeatable.",
            metavar="NUM",
        ),
    ] = None,
    project: ProjectOption = None,
    yes: YesOption = False,
) -> None:
    """Delete a fleet, or some of its instances."""
    from corral.cli import render
    from corral.cli.common import client_for
    from corral.cli.errors import CLIError
    from corral.sdk.errors import ResourceNotExistsError

    client, project_name = client_for(project)
    out = render.console()
    with client:
        try:
            client.fleets_get(project_name, name)
        except ResourceNotExistsError:
            raise CLIError(f"Fleet {name} does not exist")
        if not instances:
            if not yes and not render.confirm(f"Delete the fleet [code]{name}[/]?"):
                out.print("\nExiting...")
                return
            with out.status("Deleting fleet..."):
                client.fleets_delete(project_name, [name])
            out.print(f"Fleet [code]{name}[/] deleted")
            return
        nums = sorted(set(instances))
        if not yes and not render.confirm(f"Delete the fleet [code]{name}[/] instances {nums}?"):
            out.print("\nExiting...")
            return
        with out.status("Deleting fleet instances..."):
            client.fleets_delete_instances(project_name, name, nums)
        out.print(f"Fleet [code]{name}[/] instances deleted")


def fleet_get(
    name: Annotated[
        Optional[str], typer.Argument(help="The fleet (`project/name` for an imported one).", metavar="NAME")
    ] = None,
    fleet_id: Annotated[Optional[str], typer.Option("--id", help="The fleet's id (UUID) instead of its name.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the fleet as JSON (required, as in dstack).")] = False,
    project: ProjectOption = None,
) -> None:
    """Print a fleet as JSON (`fleets/get`), as `dstack fleet get NAME --json` does."""
    import json
    import uuid

    from corral.cli.common import client_for
    from corral.cli.errors import CLIError
    from corral.sdk.errors import ResourceNotExistsError

    if (name is None) == (fleet_id is None):
        raise typer.BadParameter("give the fleet's NAME or --id, not both", param_hint="NAME / --id")
    if not json_:
        raise typer.BadParameter("only JSON output is available: add --json", param_hint="--json")
    if fleet_id is not None:
        try:
            uuid.UUID(fleet_id)
        except ValueError:
            raise CLIError(f"Invalid UUID format: {fleet_id}") from None
    client, project_name = client_for(project)
    with client:
        try:
            if fleet_id is not None:
                fleet = client.fleets_get_by_id(project_name, fleet_id)
            else:
                assert name is not None
                owner, _, short = name.rpartition("/")
                fleet = client.fleets_get(owner or project_name, short)
        except ResourceNotExistsError:
            raise CLIError(f"Fleet {name or fleet_id} not found") from None
    print(json.dumps(fleet, indent=2))
