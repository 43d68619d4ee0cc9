"""Progress of long work (``sim``, ``replay``, ``log export|import``) on a terminal.

A bar with its rate and the time left, on stderr, only when stderr is a terminal: piped or
redirected, nothing is written, so scripts and logs read the same as before. The work itself
(the simulator, the verifier, the log file's reader) knows nothing of bars: it takes a
``Progress``, a callable told how much more is done, and the command hands it a bar's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm


class Bar:
    """What the work is given: called with how many more units are done; ``at`` for work that
    says how far it is in all (and, once it knows, out of how many)."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def __call__(self, more: int) -> None:
        self._bar.update(more)

    def at(self, done: int, total: int | None = None) -> None:
        if total is not None and total != self._bar.total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)


@contextmanager
def shown(what: str, total: int | None, unit: str, *, scale: bool = False) -> Iterator[Bar]:
    """A bar for ``total`` ``unit`` of ``what`` (None: not known, a count and a rate only),
    closed and wiped when the work ends, so the terminal keeps only the command's answer.
    ``scale``: show large counts as k/M (bytes as kB/MB)."""
    # disable=None: tqdm itself leaves out the bar when its file is not a terminal.
    with tqdm(
        total=total,
        desc=what,
        unit=unit,
        unit_scale=scale,
        unit_divisor=1024 if unit == "B" else 1000,
        file=sys.stderr,
        disable=None,
        leave=False,
        dynamic_ncols=True,
        mininterval=0.25,
        smoothing=0.1,
    ) as bar:
        yield Bar(bar)


def on_terminal() -> bool:
    """Whether a bar would be shown: worth the work of counting what it would show."""
    return sys.stderr.isatty()
