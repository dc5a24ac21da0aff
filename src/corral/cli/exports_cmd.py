"""``corral export [list] | create | update | delete`` and ``corral import [list] | delete``: sharing fleets
across projects, as dstack 0.22.5's ``dstack export`` and ``dstack import`` do (``exports/*``,
``imports/*``), with the same tables (``NAME FLEETS GATEWAYS IMPORTERS``; ``*`` for a global export).
"""

from typing import Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption, YesOption

ListOption = Optional[list[str]]


def export_default(ctx: typer.Context, project: ProjectOption = None) -> None:
    """Manage the project's exports; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        export_list(project=project)


def export_list(project: ProjectOption = None) -> None:
    """List the project's exports: the fleets each shares and the projects that import it."""
    from corral.cli.common import client_for

    client, project_name = client_for(project)
    with client:
        answer = client.exports_list(project_name)
    _warn(answer)
    _print_exports(answer.get("exports") or [])


def export_create(
    name: Annotated[str, typer.Argument(help="The name of the export.", metavar="NAME")],
    importers: Annotated[
        ListOption, typer.Option("--importer", help="A project that imports it; repeatable.", metavar="PROJECT")
    ] = None,
    fleets: Annotated[
        ListOption, typer.Option("--fleet", help="A fleet to export; repeatable.", metavar="FLEET")
    ] = None,
    gateways: Annotated[
        ListOption, typer.Option("--gateway", help="A gateway to export; repeatable.", metavar="GATEWAY")
    ] = None,
    is_global: Annotated[bool, typer.Option("--global", help="Make it global: imported into every project.")] = False,
    project: ProjectOption = None,
) -> None:
    """Create an export of fleets to other projects."""
    from corral.cli import render
    from corral.cli.common import client_for

    body = {
        "name": name, "is_global": is_global, "importer_projects": importers or [],
        "exported_fleets": fleets or [], "exported_gateways": gateways or [],
    }  # fmt: skip
    client, project_name = client_for(project)
    with client, render.console().status("Creating export..."):
        export = client.exports_create(project_name, body)
    _print_exports([export])


def export_update(
    name: Annotated[str, typer.Argument(help="The name of the export.", metavar="NAME")],
    add_importers: Annotated[
        ListOption, typer.Option("--add-importer", help="A project to add; repeatable.", metavar="PROJECT")
    ] = None,
    remove_importers: Annotated[
        ListOption, typer.Option("--remove-importer", help="A project to remove; repeatable.", metavar="PROJECT")
    ] = None,
    add_fleets: Annotated[
        ListOption, typer.Option("--add-fleet", help="A fleet to add; repeatable.", metavar="FLEET")
    ] = None,
    remove_fleets: Annotated[
        ListOption, typer.Option("--remove-fleet", help="A fleet to remove; repeatable.", metavar="FLEET")
    ] = None,
    add_gateways: Annotated[
        ListOption, typer.Option("--add-gateway", help="A gateway to add; repeatable.", metavar="GATEWAY")
    ] = None,
    remove_gateways: Annotated[
        ListOption, typer.Option("--remove-gateway", help="A gateway to remove; repeatable.", metavar="GATEWAY")
    ] = None,
    set_global: Annotated[bool, typer.Option("--set-global", help="Make it global.")] = False,
    unset_global: Annotated[bool, typer.Option("--unset-global", help="Make it no longer global.")] = False,
    project: ProjectOption = None,
) -> None:
    """Change an export's fleets, importers or global flag."""
    from corral.cli import render
    from corral.cli.common import client_for

    if set_global and unset_global:
        raise typer.BadParameter("use one of them", param_hint="--set-global / --unset-global")
    body = {
        "name": name, "set_global": set_global, "unset_global": unset_global,
        "add_importer_projects": add_importers or [], "remove_importer_projects": remove_importers or [],
        "add_exported_fleets": add_fleets or [], "remove_exported_fleets": remove_fleets or [],
        "add_exported_gateways": add_gateways or [], "remove_exported_gateways": remove_gateways or [],
    }  # fmt: skip
    client, project_name = client_for(project)
    with client, render.console().status("Updating export..."):
        export = client.exports_update(project_name, body)
    _print_exports([export])


def export_delete(
    name: Annotated[str, typer.Argument(help="The name of the export.", metavar="NAME")],
    project: ProjectOption = None,
    yes: YesOption = False,
) -> None:
    """Delete an export (its importers lose its fleets)."""
    from corral.cli import render
    from corral.cli.common import client_for

    out = render.console()
    if not yes and not render.confirm(f"Delete the export [code]{name}[/]?"):
        out.print("\nExiting...")
        return
    client, project_name = client_for(project)
    with client, out.status("Deleting export..."):
        client.exports_delete(project_name, name)
    out.print(f"Export [code]{name}[/] deleted")


def import_default(ctx: typer.Context, project: ProjectOption = None) -> None:
    """Manage the project's imports; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        import_list(project=project)


def import_list(project: ProjectOption = None) -> None:
    """List what the project imports: each export (``project/name``) and its fleets."""
    from corral.cli import render
    from corral.cli.common import client_for

    client, project_name = client_for(project)
    with client:
        answer = client.imports_list(project_name)
    _warn(answer)
    table = _table("NAME", "FLEETS", "GATEWAYS")
    for imp in answer.get("imports") or []:
        export = imp.get("export") or {}
        table.add_row(f"{export.get('project_name')}/{export.get('name')}", *_shared(export))
    render.console().print(table)
    render.console().print()


def import_delete(
    name: Annotated[str, typer.Argument(help="The import, as export-project/export-name.", metavar="NAME")],
    project: ProjectOption = None,
    yes: YesOption = False,
) -> None:
    """Delete an import: the project no longer sees that export's fleets."""
    from corral.cli import render
    from corral.cli.common import client_for

    owner, _, export_name = name.partition("/")
    if not owner or not export_name or "/" in export_name:
        raise typer.BadParameter(f"{name!r}: expected <export-project>/<export-name>", param_hint="NAME")
    out = render.console()
    if not yes and not render.confirm(f"Delete the import [code]{name}[/]?"):
        out.print("\nExiting...")
        return
    client, project_name = client_for(project)
    with client, out.status("Deleting import..."):
        client.imports_delete(project_name, owner, export_name)
    out.print(f"Import [code]{name}[/] deleted")


def _warn(answer: dict[str, Any]) -> None:
    from corral.cli import render

    for warning in answer.get("warnings") or []:
        render.console().print(f"[warning]{warning}[/]")


def _table(*columns: str) -> Any:
    from rich.table import Table

    table = Table(box=None)
    table.add_column(columns[0], no_wrap=True)
    for col in columns[1:]:
        table.add_column(col)
    return table


def _shared(export: dict[str, Any]) -> tuple[str, str]:
    """An export's FLEETS and GATEWAYS cells."""
    fleets = ", ".join(str(f.get("name")) for f in export.get("exported_fleets") or []) or "-"
    gateways = ", ".join(str(g.get("name")) for g in export.get("exported_gateways") or []) or "-"
    return fleets, gateways


def _print_exports(exports: list[dict[str, Any]]) -> None:
    from corral.cli import render

    table = _table("NAME", "FLEETS", "GATEWAYS", "IMPORTERS")
    for export in exports:
        importers = (
            "*"
            if export.get("is_global")
            else ", ".join(str(i.get("project_name")) for i in export.get("imports") or []) or "-"
        )
        table.add_row(str(export.get("name")), *_shared(export), importers)
    render.console().print(table)
    render.console().print()
