"""``corral volume [list] | delete NAME...``: a project's network volumes, as ``dstack volume`` lists and
deletes them (``volumes/list``, ``volumes/delete``). A volume in use is not deleted: the server's answer
names it.
"""

from typing import Annotated

import typer

from corral.cli.common import ProjectOption, YesOption


def volume_default(ctx: typer.Context, project: ProjectOption = None) -> None:
    """Manage the project's volumes; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        volume_list(project=project)


def volume_list(project: ProjectOption = None) -> None:
    """List the project's volumes: where each is, its size, status and the instance it is attached to."""
    from rich.table import Table

    from corral.cli import render
    from corral.cli.common import client_for

    client, project_name = client_for(project)
    with client:
        found = client.volumes_list(project_name)
    out = render.console()
    if not found:
        out.print(f"No volumes in project [code]{project_name}[/]")
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "BACKEND", "REGION", "ZONE", "SIZE", "VOLUME ID", "ATTACHED TO", "STATUS"):
        table.add_column(col)
    for v in found:
        conf, pd = v.get("configuration") or {}, v.get("provisioning_data") or {}
        size = pd.get("size_gb") or conf.get("size")
        attached = ", ".join(str(a["instance"]["name"]) for a in v.get("attachments") or [])
        status = str(v["status"]) + (f" ({v['status_message']})" if v.get("status_message") else "")
        table.add_row(
            str(v["name"]), str(conf.get("backend") or ""), str(conf.get("region") or ""),
            str(pd.get("availability_zone") or conf.get("availability_zone") or "-"),
            f"{size}GB" if size is not None else "-", str(v.get("volume_id") or "-"), attached or "-", status,
        )  # fmt: skip
    out.print(table)


def volume_delete(
    names: Annotated[list[str], typer.Argument(help="The volumes to delete.", metavar="NAME...")],
    project: ProjectOption = None,
    yes: YesOption = False,
) -> None:
    """Delete volumes (in the cloud too, unless they were registered by `volume_id`)."""
    from corral.cli import render
    from corral.cli.common import client_for

    out = render.console()
    listed = ", ".join(names)
    if not yes and not render.confirm(f"Delete the volume(s) [code]{listed}[/]?"):
        out.print("\nExiting...")
        return
    client, project_name = client_for(project)
    with client:
        client.volumes_delete(project_name, names)
    out.print(f"Volume(s) [code]{listed}[/] marked for deletion")
