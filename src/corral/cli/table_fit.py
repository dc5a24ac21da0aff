"""Fitting a table to the width it is printed in: the columns that fit are kept (the least useful are
dropped first), long free text wraps instead of being cut, and nothing ends in an ellipsis.

The width is the console's: the terminal's, else ``$COLUMNS``, else 80 (Rich's default when the output
is a pipe or a file). Used by ``render`` (``corral ps``, ``corral fleet``); imports Rich only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

#: Cell padding of a borderless Rich table: one space each side.
PADDING = 2


@dataclass(frozen=True)
class Column:
    header: str
    style: str | None = None
    #: Dropped when the table does not fit: lowest first; None = always kept.
    drop_rank: int | None = None
    #: Free text (errors, resources): wraps within ``min_width`` and more instead of widening the table.
    wraps: bool = False
    min_width: int = 16
    #: How narrow a wrapping column may get on a very narrow screen.
    narrowest: int = 8


def plain_width(markup: str) -> int:
    """The printed width of a cell given in Rich markup (the longest line)."""
    text = Text.from_markup(markup)
    return max((len(line) for line in text.plain.splitlines()), default=0)


def _natural(col: Column, rows: Sequence[dict[str, str]]) -> int:
    return max([len(col.header), *(plain_width(r.get(col.header, "")) for r in rows)])


def _longest_word(col: Column, rows: Sequence[dict[str, str]]) -> int:
    words = [w for r in rows for w in Text.from_markup(r.get(col.header, "")).plain.split()]
    return max([len(col.header), *(len(w) for w in words)])


def choose_columns(columns: Sequence[Column], rows: Sequence[dict[str, str]], width: int) -> dict[str, int]:
    """The columns to show at ``width`` and how wide each is: all of them if they fit, else drop by
    ``drop_rank`` until they do (wrapping columns count at their ``min_width``); the room left goes to the
    wrapping columns, each up to what its longest cell needs, in proportion to what it lacks."""
    natural = {c.header: _natural(c, rows) for c in columns}
    needed = {
        c.header: min(natural[c.header], max(c.min_width, _longest_word(c, rows))) if c.wraps else natural[c.header]
        for c in columns
    }
    kept = list(columns)
    droppable = sorted((c for c in columns if c.drop_rank is not None), key=lambda c: c.drop_rank or 0)
    while sum(needed[c.header] + PADDING for c in kept) > width and droppable:
        kept.remove(droppable.pop(0))
    widths = {c.header: needed[c.header] for c in kept}
    spare = width - sum(w + PADDING for w in widths.values())
    wrapping = [c.header for c in kept if c.wraps]
    if spare < 0 and wrapping:  # a very narrow screen: the free text gets narrower still (never under `narrowest`)
        narrowest = {c.header: c.narrowest for c in kept}
        for header in wrapping:
            cut = min(-spare, widths[header] - narrowest[header])
            if cut > 0:
                widths[header] -= cut
                spare += cut
        return widths
    lacking = {c.header: natural[c.header] - widths[c.header] for c in kept if c.wraps}
    total_lack = sum(lacking.values())
    if spare > 0 and total_lack > 0:
        if total_lack <= spare:
            for header, lack in lacking.items():
                widths[header] += lack
        else:
            for header, lack in lacking.items():
                widths[header] += spare * lack // total_lack
    return widths


def fitted_table(
    columns: Sequence[Column],
    rows: Sequence[tuple[dict[str, str], str | None]],
    width: int,
) -> Table:
    """A borderless table of ``rows`` (cells by header, a row style) with the columns that fit ``width``."""
    widths = choose_columns(columns, [r for r, _ in rows], width)
    kept = [c for c in columns if c.header in widths]
    table = Table(box=None)
    for col in kept:
        if col.wraps:
            table.add_column(col.header, style=col.style, overflow="fold", width=widths[col.header])
        else:
            table.add_column(col.header, style=col.style, no_wrap=True, overflow="fold")
    for cells, style in rows:
        table.add_row(*(cells.get(c.header, "") for c in kept), style=style)
    return table
