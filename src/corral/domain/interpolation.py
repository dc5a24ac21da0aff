"""``${{ ns.name }}`` references in configuration values, as dstack 0.22.5 reads them
(``utils/interpolator.py``): a reference is ``${{`` + a name + ``}}`` (spaces allowed inside), ``$$``
escapes a dollar, and a name is ``namespace.name`` whose two parts start with a letter or ``_`` and go on
with letters, digits, ``_`` or ``.``. So a secret may be named ``my-token``, but ``${{ secrets.my-token }}``
is an illegal reference, as in dstack.

Where corral resolves them (as dstack does; an unknown reference is an error, never passed on):

- ``secrets.NAME`` in ``env`` values and ``registry_auth.username``/``.password``: the project's secrets,
  only when the job is sent to its host (the stored spec keeps the reference);
- ``env.NAME`` in ``registry_auth``: the configuration's own ``env``, and ``run.args`` in ``commands``: the
  arguments given to ``apply`` after the file (dstack's CLI resolves both before it sends the
  configuration, leaving ``secrets`` and ``groups[i].nodes[j].IP_ADDRESS`` references as they are;
  corral's CLI does the same).

Pure: imports nothing but the standard library. Messages never hold a value, only names.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping

OPENING = "${{"
CLOSING = "}}"
_FIRST = frozenset(string.ascii_letters + "_")
_CHARS = _FIRST | frozenset(string.digits + ".")


#: dstack's ``groups[i].(nodes|replicas)[j].IP_ADDRESS`` (``utils/nodes_interpolator.py``), left by the CLI.
_GROUPS_IP_REF = re.compile(r"^groups\[(\d+)\]\.(nodes|replicas)\[(\d+)\]\.IP_ADDRESS$")


def valid_groups_ref(name: str) -> bool:
    return _GROUPS_IP_REF.fullmatch(name.strip()) is not None


def namespace_of(name: str) -> str:
    """``groups[0].nodes[0].IP_ADDRESS`` -> ``groups``; ``secrets.x`` -> ``secrets``."""
    return name.split(".")[0].split("[")[0]


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


Validators = Mapping[str, Callable[[str], bool]]


def _scan(s: str, kept: Validators | None = None) -> list[tuple[str, str, str]]:
    """``s`` as tokens: ``("text", text, text)`` and ``("ref", name, as written)``, dstack's scan (an escaped
    ``$$`` is one ``$``);
    a reference to a namespace in ``kept`` is checked by its validator, any other by :func:`valid_name`."""
    out: list[tuple[str, str, str]] = []
    start = 0
    while start < len(s):
        dollar = s.find("$", start)
        if dollar == -1 or dollar == len(s) - 1:
            out.append(("text", s[start:], ""))
            break
        if s[dollar + 1] == "$":
            out.append(("text", s[start : dollar + 1], ""))
            start = dollar + 2
            continue
        opening = s.find(OPENING, start)
        if opening == -1:
            out.append(("text", s[start:], ""))
            break
        out.append(("text", s[start:opening], ""))
        closing = s.find(CLOSING, opening)
        if closing == -1:
            raise InterpolationError(f"No pattern closing: {s[opening:]}")
        name = s[opening + len(OPENING) : closing].strip()
        check = (kept or {}).get(namespace_of(name), valid_name)
        if not check(name):
            raise InterpolationError(f"Illegal reference name: {name}")
        out.append(("ref", name, s[opening : closing + len(CLOSING)]))
        start = closing + len(CLOSING)
    return out


def references(s: str) -> list[str]:
    """The names ``s`` refers to, in order (an illegal one raises)."""
    return [v for kind, v, _ in _scan(s) if kind == "ref"]


def interpolate(
    s: str,
    namespaces: Mapping[str, Mapping[str, str]],
    keep: Iterable[str] | Validators = (),
    *,
    again: bool = True,
) -> str:
    """``s`` with its references resolved from ``namespaces``; references to a namespace in ``keep`` are left
    as they are (``keep`` may map a namespace to the validator of its names, as dstack's ``skip``). Any other
    reference that is not found is an error listing every missing name, worded as dstack words it.

    With references kept and ``again`` (they are resolved by a later pass: ``registry_auth``'s secrets, on
    the server), the ``$`` of the text and of the values put in are escaped again for that pass; without
    ``again`` (``commands``: the shell gets them next, as from dstack's CLI) the text is left unescaped."""
    kept: Validators = keep if isinstance(keep, Mapping) else {ns: valid_name for ns in keep}
    escape = bool(kept) and again
    tokens: list[str] = []
    missing: list[str] = []
    scanned = _scan(s, kept)
    if not any(kind == "ref" for kind, _, _ in scanned) and not escape:
        return "".join(v for _, v, _ in scanned)
    for kind, value, written in scanned:
        if kind == "text":
            tokens.append(value.replace("$", "$$") if escape else value)
            continue
        ns, _, key = value.partition(".")
        if namespace_of(value) in kept:
            tokens.append(written)
        elif ns in namespaces and key in namespaces[ns]:
            value_of = namespaces[ns][key]
            tokens.append(value_of.replace("$", "$$") if escape else value_of)
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
