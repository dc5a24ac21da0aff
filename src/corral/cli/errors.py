"""The CLI's own error: a message for the user, printed as one red line, exit code 1.

Standard library only, so the entry point can import it without cost.
"""

from __future__ import annotations


class CLIError(Exception):
    """A user-facing error raised by a command (``Error: <message>``, exit 1)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
