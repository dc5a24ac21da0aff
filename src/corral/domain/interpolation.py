"""``${{ ns.name }}`` references in configuration values, as dstack 0.22.5 reads them
(``utils/interpolator.py``): a reference is ``${{`` + a name + ``}}`` (spaces allowed inside), ``$$``
escapes a dollar, and a name is ``namespace.name`` whose two parts start with a letter or ``_`` and go on
with letters, digits, ``_`` or ``.``. So a secret may be named ``my-token``, but ``${{ secrets.my-token }}``
is an illegal reference, as in dstack.

Where corral resolves them (as dstack does; an unknown reference is an error, never passed on):

- ``secrets.NAME`` in ``env`` values and ``registry_auth.username``/``.password``: the project's secrets,
  only when the job is sent to its host (the stored spec keeps the reference);
- ``env.NAME`` in ``registry_auth``: the configuration's own ``env`` (dstack's CLI resolves these before it
  sends the configuration; corral's CLI does the same).

Pure: imports nothing but the standard library. Messages never hold a value, only names.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping

OPENING = "${{"
CLOSING = "}}"
_FIRST = frozenset(string.ascii_letters + "_")
_CHARS = _FIRST | frozenset(string.digits + ".")


class InterpolationError(ValueError):
    """A reference that cannot be resolved; the message names it (never a value)."""


def valid_name(name: str) -> bool:
    """dstack's ``validate_name``: exactly one dot, both sides non-empty and starting with a letter or ``_``."""
    if name.count(".") != 1:
        return False
    dot = name.index(".")
    if not 0 < dot < len(name) - 1:
        return False
    if name[0] not in _FIRST or name[dot + 1] not in _FIRST:
        return False
    return all(c in _CHARS for c in name)


def _scan(s: str) -> list[tuple[str, str]]:
    """``s`` as tokens: ``("text", ...)`` and ``("ref", name)``, dstack's scan (an escaped ``$$`` is one ``$``)."""
    out: list[tuple[str, str]] = []
    start = 0
    while start < len(s):
        dollar = s.find("$", start)
        if dollar == -1 or dollar == len(s) - 1:
            out.append(("text", s[start:]))
            break
        if s[dollar + 1] == "$":
            out.append(("text", s[start : dollar + 1]))
            start = dollar + 2
            continue
        opening = s.find(OPENING, start)
        if opening == -1:
            out.append(("text", s[start:]))
            break
        out.append(("text", s[start:opening]))
        closing = s.find(CLOSING, opening)
        if closing == -1:
            raise InterpolationError(f"No pattern closing: {s[opening:]}")
        name = s[opening + len(OPENING) : closing].strip()
        if not valid_name(name):
            raise InterpolationError(f"Illegal reference name: {name}")
        out.append(("ref", name))
        start = closing + len(CLOSING)
    return out


def references(s: str) -> list[str]:
    """The names ``s`` refers to, in order (an illegal one raises)."""
    return [v for kind, v in _scan(s) if kind == "ref"]


def interpolate(s: str, namespaces: Mapping[str, Mapping[str, str]], keep: Iterable[str] = ()) -> str:
    """``s`` with its references resolved from ``namespaces``; references to a namespace in ``keep`` are left
    as they are (resolved later, elsewhere). Any other reference that is not found is an error listing every
    missing name, worded as dstack words it."""
    kept = frozenset(keep)
    tokens: list[str] = []
    missing: list[str] = []
    scanned = _scan(s)
    if not any(kind == "ref" for kind, _ in scanned) and not kept:
        return "".join(v for _, v in scanned)
    for kind, value in scanned:
        if kind == "text":
            tokens.append(value.replace("$", "$$") if kept else value)
            continue
        ns, _, key = value.partition(".")
        if ns in kept:
            tokens.append(f"{OPENING} {value} {CLOSING}")
        elif ns in namespaces and key in namespaces[ns]:
            value_of = namespaces[ns][key]
            tokens.append(value_of.replace("$", "$$") if kept else value_of)
        else:
            missing.append(value)
    if missing:
        raise InterpolationError(f"Failed to interpolate due to missing vars: {missing}")
    return "".join(tokens)


def secret_names(values: Iterable[str]) -> list[str]:
    """The secrets ``values`` refer to (``secrets.NAME``), each once, in order of first use."""
    seen: dict[str, None] = {}
    for v in values:
        for ref in references(v):
            ns, _, key = ref.partition(".")
            if ns == "secrets":
                seen.setdefault(key, None)
    return list(seen)
