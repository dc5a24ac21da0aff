"""The CLI's errors and how the user sees them: :class:`CLIError` (a message for the user, exit code 1), and
any error shown as one red ``Error: ...`` line (:func:`print_error`), never a traceback.

Standard library only at import, so the entry point can import it without cost.
"""

from __future__ import annotations

import os
import sys


class CLIError(Exception):
    """A user-facing error raised by a command (``Error: <message>``, exit 1)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


def error_message(exc: BaseException) -> str:
    """The one line shown for ``exc``."""
    from corral.sdk.errors import CorralError

    config_mod = sys.modules.get("corral.config")
    config_error = getattr(config_mod, "ConfigError", None)
    if isinstance(exc, (CLIError, CorralError)) or (isinstance(config_error, type) and isinstance(exc, config_error)):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    else:
        text = f"{type(exc).__name__}: {exc} (set CORRAL_DEBUG=1 to see the traceback)"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


def print_error_line(message: str) -> None:
    """``Error: <message>`` on stderr, red on a terminal (unless ``NO_COLOR``)."""
    line = f"Error: {message}"
    if sys.stderr.isatty() and not os.environ.get("NO_COLOR"):
        line = f"\x1b[31m{line}\x1b[0m"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def print_error(exc: Exception) -> int:
    """Show ``exc`` as the one ``Error: ...`` line and return the exit code it calls for."""
    print_error_line(error_message(exc))
    return exc.exit_code if isinstance(exc, CLIError) else 1
