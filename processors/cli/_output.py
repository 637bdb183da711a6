"""Records printed for a person: a table when it fits the terminal, one ``key: value`` block per record when not.

Every command that prints rows goes through :func:`print_records`, so one rule decides the layout
from the console's width (the terminal's, ``COLUMNS``, or 80 when the output is not a terminal).
In a table a cell never wraps: a value longer than its column ends in an ellipsis, and the widest
columns give way first. When even :data:`MIN_COLUMN` characters per column do not fit, the rows are
printed vertically instead, every value whole (long ones wrap). ``--json`` output never comes through
here, so it is never shortened.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["MIN_COLUMN", "Cell", "fit_columns", "print_records"]

#: A cell: plain text (never read as Rich markup, so a value like ``[x]`` prints as it is), styled
#: ``Text``, or None for an empty cell.
Cell = str | Text | None

#: The fewest characters a column keeps in a table: below this a value says too little, and the
#: records are printed vertically instead.
MIN_COLUMN = 10


def _overhead(columns: int) -> int:
    """Characters a Rich table with the default box spends besides cell content: a space either side
    of each cell and a rule between and around the columns."""
    return 3 * columns + 1


def fit_columns(natural: Sequence[int], width: int) -> list[int] | None:
    """The content width of each column for a table ``width`` characters wide, or None when it cannot fit.

    ``natural`` is each column's widest line (header included). The widest columns are capped first,
    at one common width, until the table fits; a table that would need a column narrower than
    :data:`MIN_COLUMN` (or narrower than its content, when that is shorter) does not fit.
    """
    room = width - _overhead(len(natural))
    if sum(natural) <= room:
        return list(natural)
    if sum(min(w, MIN_COLUMN) for w in natural) > room:
        return None
    low, high = MIN_COLUMN, max(natural)
    while low < high:  # the largest common cap that fits
        mid = (low + high + 1) // 2
        if sum(min(w, mid) for w in natural) <= room:
            low = mid
        else:
            high = mid - 1
    widths = [min(w, low) for w in natural]
    spare = room - sum(widths)  # fewer than the capped columns, or the cap would be one higher
    for i, w in enumerate(natural):
        if spare and w > low:
            widths[i] += 1
            spare -= 1
    return widths


def _text(cell: Cell) -> Text:
    if isinstance(cell, Text):
        return cell
    return Text("" if cell is None else cell)


def _width(text: Text) -> int:
    return max((cell_len(line) for line in text.plain.splitlines()), default=0)


def print_records(console: Console, columns: Sequence[str], rows: Iterable[Sequence[Cell]], *,
                  title: str | None = None) -> None:
    """Print ``rows`` under ``columns`` as a table that fits ``console.width``, or vertically when none does."""
    cells = [[_text(c) for c in row] for row in rows]
    headers = [Text(c) for c in columns]
    natural = [max([_width(headers[i])] + [_width(row[i]) for row in cells]) for i in range(len(columns))]
    widths = fit_columns(natural, console.width)
    if widths is None:
        _print_vertical(console, headers, cells, title)
        return
    table = Table(title=title, title_justify="left")
    for header, w in zip(headers, widths, strict=True):
        table.add_column(header, no_wrap=True, overflow="ellipsis", max_width=w)
    for row in cells:
        table.add_row(*row)
    console.print(table)


def _print_vertical(console: Console, headers: list[Text], cells: list[list[Text]], title: str | None) -> None:
    if title:
        console.print(Text(title, style="italic"))
    for number, row in enumerate(cells, start=1):
        console.rule(Text(str(number)), align="left", style="dim")
        block = Table.grid(padding=(0, 1))
        block.add_column(style="bold", no_wrap=True)
        block.add_column(overflow="fold")
        for header, cell in zip(headers, row, strict=True):
            block.add_row(header + ":", cell)
        console.print(block)
