"""Node groups of a multi-node task (dstack 0.22.5's ``groups``): the addresses of the run's nodes by
group, and ``${{ groups[i].nodes[j].IP_ADDRESS }}`` in a job's commands, checked at submission and
filled in when the job starts (dstack's ``nodes_interpolator``). Pure.

``groups[0].nodes[0]`` is the run's master node (``DSTACK_MASTER_NODE_IP``); a task without ``groups`` is
one group (index 0) of ``nodes`` nodes. ``$${{ ... }}`` is an escape, left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_REF = re.compile(r"(?<!\$)\$\{\{\s*groups\[(\d+)\]\.nodes\[(\d+)\]\.IP_ADDRESS\s*\}\}")
_ANY = re.compile(r"(?<!\$)\$\{\{\s*([^}]+?)\s*\}\}")
_VALID_NAME = re.compile(r"^groups\[(\d+)\]\.nodes\[(\d+)\]\.IP_ADDRESS$")


def refs(command: str) -> list[tuple[int, int]]:
    """The (group, node) of every address reference in ``command``."""
    return [(int(m.group(1)), int(m.group(2))) for m in _REF.finditer(command)]


def check_refs(command: str, group_sizes: Sequence[int]) -> str | None:
    """Why ``command``'s ``groups`` references are wrong (a typo, a group or node the run does not have),
    or None."""
    for m in _ANY.finditer(command):
        name = m.group(1).strip()
        if name.split(".", 1)[0].split("[", 1)[0] != "groups":
            continue
        found = _VALID_NAME.match(name)
        if found is None:
            return f"illegal reference `{name}`: use groups[i].nodes[j].IP_ADDRESS"
        group, node = int(found.group(1)), int(found.group(2))
        if group >= len(group_sizes) or node >= group_sizes[group]:
            sizes = ", ".join(f"groups[{i}] has {n}" for i, n in enumerate(group_sizes))
            return f"`{name}` is out of range: the run's groups[{group}].nodes[{node}] does not exist ({sizes} node(s))"
    return None


def addresses_view(nodes: Iterable[tuple[int, int, str]]) -> list[list[str]]:
    """The nodes' addresses by group, from (group index, index in the group, address) of each job."""
    view: list[list[str]] = []
    for group, index, address in nodes:
        while len(view) <= group:
            view.append([])
        row = view[group]
        while len(row) <= index:
            row.append("")
        row[index] = address
    return view


def fill_refs(command: str, view: Sequence[Sequence[str]]) -> str:
    """``command`` with every address reference replaced by the node's address ("" where unknown)."""

    def address(m: re.Match[str]) -> str:
        group, node = int(m.group(1)), int(m.group(2))
        return view[group][node] if group < len(view) and node < len(view[group]) else ""

    return _REF.sub(address, command)
