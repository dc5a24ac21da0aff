"""An HTTP/1.1 request's head as the agent reads it: its fields in a plain map, with ``http.client``'s limits.

``http.server`` parses every request's fields with :mod:`email.parser` into an email message whose every ``get``
goes through a header policy, most of the CPU of a small keep-alive request; the agent's handler
(:mod:`corral.agent.server`) reads an HTTP/1.1 head with :func:`read_head` instead. Standard library only.
"""

from __future__ import annotations

import http.client
import io

#: The limits ``http.client`` reads a request's head with: a line's length and the number of lines.
MAX_HEAD_LINE = 65536
MAX_HEAD_FIELDS = 100


class RequestHead:
    """The fields of a request's head, read without the email package: ``http.server`` parses them with
    :mod:`email.parser` into an email message whose every ``get`` goes through a header policy, most of the CPU
    of a small keep-alive request. ``get`` compares names without case and gives the first field of a name, as
    the email message's does."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self._fields = fields
        self._first: dict[str, str] = {}
        for name, value in fields:
            self._first.setdefault(name.lower(), value)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._first.get(name.lower(), default)

    def __getitem__(self, name: str) -> str | None:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)

    def __str__(self) -> str:
        return "".join(f"{name}: {value}\n" for name, value in self._fields) + "\n"


def read_head(rfile: io.BufferedIOBase) -> RequestHead:
    """The head's fields, up to its empty line (or the end of the stream). ``http.client.LineTooLong`` for a
    line over :data:`MAX_HEAD_LINE`, ``http.client.HTTPException`` past :data:`MAX_HEAD_FIELDS` lines, as
    ``http.client`` does."""
    fields: list[tuple[str, str]] = []
    lines = 0
    while True:
        line = rfile.readline(MAX_HEAD_LINE + 1)
        if len(line) > MAX_HEAD_LINE:
            raise http.client.LineTooLong("header line")
        lines += 1
        if lines > MAX_HEAD_FIELDS:
            raise http.client.HTTPException(f"got more than {MAX_HEAD_FIELDS} headers")
        if line in (b"\r\n", b"\n", b""):
            return RequestHead(fields)
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and fields:  # a folded line continues the field before it
            name, value = fields[-1]
            fields[-1] = (name, value + " " + text.strip())
            continue
        name, colon, value = text.partition(":")
        if colon:
            fields.append((name.strip(), value.strip()))
