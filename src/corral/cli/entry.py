"""The ``corral`` console script: a plain ``corral server`` starts without the Typer app
(``corral.cli.server_fast_path``); everything else goes to the Typer app (``corral.cli.main``).

Standard library only at import.
"""

from __future__ import annotations

import sys

from corral.cli.server_fast_path import serve_if_plain_server


def main() -> None:
    """The ``corral`` console script."""
    serve_if_plain_server(sys.argv[1:])
    from corral.cli.main import main as typer_main  # (which keeps dependencies' warnings out of the output)

    typer_main()
