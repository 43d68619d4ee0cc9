"""Plain text tables for people; scripts use ``-o json``."""

from __future__ import annotations

from collections.abc import Sequence

from corral.services.query.present import one_line


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    # A cell is one line: a break in a tenant's text would start a row of its making.
    cells = [[str(h).upper() for h in headers]] + [
        ["" if c is None else one_line(str(c)) for c in r] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
