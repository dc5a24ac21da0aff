"""How ``corral server`` logs: one line per event on stderr, as text (the default) or as one JSON object a
line (``CORRAL_LOG_FORMAT=json``), at the server's level, with the chatty libraries kept at warnings.

Events are logged where they happen, by name (``corral.runs``, ``corral.scheduler``, ``corral.instances``,
``corral.api`` for refused requests, ``corral.access`` for the access log, ``corral.server`` for start and
stop); this module only decides how lines look. Python's warnings come through here too (``py.warnings``),
less the known, harmless ones of dependencies (``corral.known_warnings``). Standard library only, and cheap:
it is on the start path.
Imported by the composition root (``corral.server``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from corral import known_warnings

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Libraries whose INFO lines are noise for an operator (one per HTTP call, migration step, SSH channel).
QUIET = ("httpx", "alembic", "asyncssh", "uvicorn.error", "uvicorn.asgi", "aiosqlite", "asyncio")

# Attributes every LogRecord has: whatever else a record carries came from ``extra=`` and goes into JSON.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class LogSetupError(ValueError):
    """A log level or format the server cannot use."""


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra fields, "exception"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def check(level: str, fmt: str) -> None:
    """Refuse a level or format that is not one of ours, naming the setting and the choices."""
    if level.lower() not in LEVELS:
        raise LogSetupError(f"--log-level / CORRAL_SERVER_LOG_LEVEL={level!r}: use one of {', '.join(LEVELS)}")
    if fmt.lower() not in FORMATS:
        raise LogSetupError(f"CORRAL_LOG_FORMAT={fmt!r}: use one of {', '.join(FORMATS)}")


def configure(level: str = "info", fmt: str = "text", stream: Any = None) -> logging.Handler:
    """Send every logger's lines to ``stream`` (default stderr) in ``fmt``; returns the handler installed."""
    check(level, fmt)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt.lower() == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # Python warnings become log records in this format (a raw warning line would break a JSON log), less the
    # known, harmless ones from dependencies.
    known_warnings.capture_for_server()
    return handler
