"""The ``corral`` command: a Typer app whose commands follow dstack's CLI.

Start-up is kept cheap: this module imports only Typer and the command modules, which import
nothing heavy at module level; Rich, httpx, PyYAML and pydantic are imported inside the commands
that need them. Errors reach the user as one red ``Error: ...`` line with exit code 1, never a
traceback (set ``CORRAL_DEBUG=1`` to see one); Ctrl-C exits with 130.

``main()`` runs the Typer app; ``run(argv)`` runs the CLI in-process and returns the exit code. The console
script is ``corral.cli.entry.main``: a plain ``corral server`` starts without building this app at all
(``corral.cli.server_fast_path``, which ``python -m corral.cli.main`` takes first too).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

if __name__ == "__main__":  # `python -m corral.cli.main`: the console script's fast path for `server` first
    from corral.cli.server_fast_path import serve_if_plain_server

    serve_if_plain_server(sys.argv[1:])

import typer

from corral.cli import (
    apply_cmd,
    attach_cmd,
    events_cmd,
    exports_cmd,
    fleets_cmd,
    gateway_cmd,
    metrics_cmd,
    offer_cmd,
    projects_cmd,
    runs_cmd,
    secrets_cmd,
    volumes_cmd,
)
from corral.cli.errors import print_error, print_error_line

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="corral",
    help="corral: an orchestrator for AI and GPU workloads that speaks dstack's API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _guard(func: F) -> F:
    """Turn Ctrl-C inside a command into a quiet exit 130 (Click would print "Aborted!")."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            raise SystemExit(130)

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        from corral import DSTACK_API_VERSION, __version__

        typer.echo(f"corral {__version__} (dstack API {DSTACK_API_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """corral: an orchestrator for AI and GPU workloads that speaks dstack's API."""


_server_app = typer.Typer(
    help="Start the corral server, or back up and restore its database.",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@_server_app.callback()
@_guard
def server(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option("--host", help="The address to listen on.", envvar="CORRAL_SERVER_HOST", metavar="HOST"),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("-p", "--port", help="The port to listen on.", envvar="CORRAL_SERVER_PORT", metavar="PORT"),
    ] = 3000,
    log_level: Annotated[
        str,
        typer.Option(
            "-l",
            "--log-level",
            help="debug, info, warning or error.",
            envvar="CORRAL_SERVER_LOG_LEVEL",
            metavar="LEVEL",
        ),
    ] = "info",
    access_log: Annotated[
        bool,
        typer.Option(
            "--access-log",
            help="Log every HTTP request (method, path, status, duration).",
            envvar="CORRAL_SERVER_ACCESS_LOG",
        ),
    ] = False,
) -> None:
    """Start the corral server (API, scheduler and the local backend) in this process.

    Logs go to stderr, one line per event (CORRAL_LOG_FORMAT=json: one JSON object a line)."""
    if ctx.invoked_subcommand is not None:
        return
    code = _server_module("corral.server").main(host=host, port=port, log_level=log_level, access_log=access_log)
    if code:
        raise SystemExit(code)


def _server_module(name: str) -> Any:
    import importlib

    from corral.cli.errors import CLIError

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and "corral.api" in e.name:
            raise CLIError("The server is not part of this installation (corral.server is missing)")
        raise


def _server_admin(command: str, path: Path) -> None:
    from corral.cli.errors import CLIError

    admin = _server_module("corral.server_admin")
    settings = _server_module("corral.settings").Settings.from_env()
    try:
        getattr(admin, command)(settings, path, typer.echo)
    except admin.AdminError as e:
        raise CLIError(str(e)) from None


@_server_app.command("backup")
@_guard
def server_backup(
    file: Annotated[
        Path, typer.Argument(help="The backup file to write (a directory: corral-backup.db in it).", metavar="FILE")
    ],
) -> None:
    """Copy the server's database to FILE, consistently, while the server runs (SQLite).

    The copy holds no encryption key: it says which key id its secrets need; keep that key apart.
    On Postgres, use pg_dump (see the Postgres docs)."""
    _server_admin("backup", file)


@_server_app.command("restore")
@_guard
def server_restore(
    file: Annotated[Path, typer.Argument(help="A backup made by `corral server backup`.", metavar="FILE")],
) -> None:
    """Make FILE the database of a fresh state directory (CORRAL_SERVER_DIR), with the server stopped.

    The key the backup's secrets were sealed with must be given first (its file at
    CORRAL_SERVER_ENCRYPTION_KEY_FILE or in the state directory, or CORRAL_SERVER_ENCRYPTION_KEY); every sealed
    value is opened before the database is put in place. An older backup is migrated when the server starts."""
    _server_admin("restore", file)


app.add_typer(_server_app, name="server")


_commands: list[tuple[str, Callable[..., Any]]] = [
    ("apply", apply_cmd.apply),
    ("attach", attach_cmd.attach),
    ("ps", runs_cmd.ps),
    ("logs", runs_cmd.logs),
    ("stop", runs_cmd.stop),
    ("delete", runs_cmd.delete),
    ("offer", offer_cmd.offer),
    ("event", events_cmd.event),
    ("metrics", metrics_cmd.metrics),
]
for _name, _func in _commands:
    app.command(_name)(_guard(_func))

_fleet_app = typer.Typer(
    help="List, show and delete fleets.",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_fleet_app.callback()(_guard(fleets_cmd.fleet_list))
_fleet_app.command("list")(_guard(fleets_cmd.fleet_list_cmd))
_fleet_app.command("get")(_guard(fleets_cmd.fleet_get))
_fleet_app.command("delete")(_guard(fleets_cmd.fleet_delete))
app.add_typer(_fleet_app, name="fleet")

_project_app = typer.Typer(
    help="Manage the projects the CLI knows (~/.corral/config.yml).",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_project_app.callback()(_guard(projects_cmd.project_default))
_project_app.command("add")(_guard(projects_cmd.project_add))
_project_app.command("list")(_guard(projects_cmd.project_list))
_project_app.command("set-default")(_guard(projects_cmd.project_set_default))
_project_app.command("delete")(_guard(projects_cmd.project_delete))
_project_app.command("quota")(_guard(projects_cmd.project_quota))
app.add_typer(_project_app, name="project")

_secret_app = typer.Typer(
    help="Manage the project's secrets (used in configurations as ${{ secrets.NAME }}).",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_secret_app.callback()(_guard(secrets_cmd.secret_default))
_secret_app.command("list")(_guard(secrets_cmd.secret_list))
_secret_app.command("get")(_guard(secrets_cmd.secret_get))
_secret_app.command("set")(_guard(secrets_cmd.secret_set))
_secret_app.command("delete")(_guard(secrets_cmd.secret_delete))
app.add_typer(_secret_app, name="secret")

_volume_app = typer.Typer(
    help="List and delete the project's network volumes (EBS on aws).",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_volume_app.callback()(_guard(volumes_cmd.volume_default))
_volume_app.command("list")(_guard(volumes_cmd.volume_list))
_volume_app.command("delete")(_guard(volumes_cmd.volume_delete))
app.add_typer(_volume_app, name="volume")

_gateway_app = typer.Typer(
    help="List, show, update and delete the project's gateways.",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_gateway_app.callback()(_guard(gateway_cmd.gateway_default))
_gateway_app.command("list")(_guard(gateway_cmd.gateway_list))
_gateway_app.command("get")(_guard(gateway_cmd.gateway_get))
_gateway_app.command("update")(_guard(gateway_cmd.gateway_update))
_gateway_app.command("delete")(_guard(gateway_cmd.gateway_delete))
app.add_typer(_gateway_app, name="gateway")


_export_app = typer.Typer(
    help="Share the project's fleets with other projects (as `dstack export`).",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_export_app.callback()(_guard(exports_cmd.export_default))
_export_app.command("list")(_guard(exports_cmd.export_list))
_export_app.command("create")(_guard(exports_cmd.export_create))
_export_app.command("update")(_guard(exports_cmd.export_update))
_export_app.command("delete")(_guard(exports_cmd.export_delete))
app.add_typer(_export_app, name="export")

_import_app = typer.Typer(
    help="The fleets other projects export to this one (as `dstack import`).",
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_import_app.callback()(_guard(exports_cmd.import_default))
_import_app.command("list")(_guard(exports_cmd.import_list))
_import_app.command("delete")(_guard(exports_cmd.import_delete))
app.add_typer(_import_app, name="import")


def run(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    try:
        app(args=argv, prog_name="corral", standalone_mode=True)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print_error_line(str(e.code))
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except Exception as e:
        if os.environ.get("CORRAL_DEBUG"):
            raise
        return print_error(e)
    return 0


def main() -> None:
    """Run the CLI on ``sys.argv`` and exit with its code (the console script, after its fast path)."""
    from corral import known_warnings

    known_warnings.capture_for_cli()
    sys.exit(run())


if __name__ == "__main__":
    main()
