"""The fast path for a plain ``corral server``, taken before the Typer app is built.

Building the Typer app and parsing with it costs the server's start-up about a sixth of its CPU time, for
a few options. So ``corral server`` with nothing but ``--host``, ``-p/--port``, ``-l/--log-level`` and
``--access-log`` (or their ``CORRAL_SERVER_*`` variables) goes straight to ``corral.server.main``; anything
else -- ``--help``, an unknown option, a port that is not a number, every other command -- returns, and the
caller goes on to the Typer app in ``corral.cli.main``, which gives the usual help and errors. Both ways in
take it first: the console script (``corral.cli.entry``) and ``python -m corral.cli.main``.
``tests/cli/test_server_fast_path.py`` checks that it and the Typer command parse the same arguments the same
way.

Standard library only at import.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence

from corral.cli.errors import print_error

#: Each option of ``corral server`` (as declared in ``corral.cli.main``): its names, and its environment variable.
OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "host": (("--host",), "CORRAL_SERVER_HOST"),
    "port": (("-p", "--port"), "CORRAL_SERVER_PORT"),
    "log_level": (("-l", "--log-level"), "CORRAL_SERVER_LOG_LEVEL"),
    "access_log": (("--access-log",), "CORRAL_SERVER_ACCESS_LOG"),
}
DEFAULTS: dict[str, str | int | bool] = {"host": "127.0.0.1", "port": 3000, "log_level": "info", "access_log": False}
#: Flags (no value); their variables read as Click reads a boolean.
FLAGS = {"access_log"}
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def plain_server_options(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str | int | bool] | None:  # noqa: C901
    """The options of ``argv`` when it is ``server`` with only known, well-formed options; else None."""
    if not argv or argv[0] != "server":
        return None
    by_name = {name: key for key, (names, _) in OPTIONS.items() for name in names}
    given: dict[str, str] = {}
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg in by_name and by_name[arg] in FLAGS:
            given[by_name[arg]] = "1"
            continue
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
        elif arg in by_name:
            if not args:
                return None
            name, value = arg, args.pop(0)
        elif len(arg) > 2 and arg[:2] in by_name and not arg.startswith("--"):
            name, value = arg[:2], arg[2:]
        else:
            return None
        if name not in by_name or by_name[name] in FLAGS:
            return None
        given[by_name[name]] = value
    options: dict[str, str | int | bool] = dict(DEFAULTS)
    for key, (_, var) in OPTIONS.items():
        raw = given.get(key, env.get(var) or None)
        if raw is None:
            continue
        if key in FLAGS:
            if raw.strip().lower() not in _TRUE | _FALSE:
                return None
            options[key] = raw.strip().lower() in _TRUE
        elif key == "port":
            try:
                options[key] = int(raw)
            except ValueError:
                return None
        else:
            options[key] = raw
    return options


def serve_if_plain_server(argv: Sequence[str]) -> None:
    """Run the server and exit when ``argv`` is a plain ``server`` invocation; return otherwise."""
    options = plain_server_options(argv, os.environ)
    if options is None:
        return
    try:
        serve = importlib.import_module("corral.server").main  # (an installation without the server:
    except ModuleNotFoundError:  # the Typer command says so)
        return
    try:
        code = serve(
            host=str(options["host"]),
            port=int(options["port"]),
            log_level=str(options["log_level"]),
            access_log=bool(options["access_log"]),
        )
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        code = 130
    except Exception as e:
        if os.environ.get("CORRAL_DEBUG"):
            raise
        code = print_error(e)
    sys.exit(code)
