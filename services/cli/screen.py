"""What the CLI prints for people is escaped: much of it is text tenants wrote (job names, queue
names in rejections, cancel reasons, pending reasons that echo a spec), and a control character
in it would reach an operator's terminal as a command (clear the screen, retitle the window,
move the cursor to forge a line of ``corral jobs``). Every C0 and C1 control character but the
tab and the newline, DEL, and the Unicode line separators and direction overrides that reorder
what a line shows, are printed as JSON's escapes (``\\u001b``, ``\\u202e``): inside a JSON
string (``-o json``) they read back as the same character. A job's own output (``corral logs``)
is the job's, printed as it wrote it. On the standard error, where progress bars redraw their line,
the carriage return is kept.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

_OTHERS = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"  # DEL, C1, line and direction marks
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")
_UNSAFE_BUT_CR = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f{_OTHERS}]")


def _escape_one(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def escape(text: str, carriage_return: bool = False) -> str:
    """``text`` with what a terminal would act on written out as escapes (``carriage_return``:
    but the carriage return)."""
    return (_UNSAFE_BUT_CR if carriage_return else _UNSAFE).sub(_escape_one, text)


class Escaping:
    """A text stream that escapes what is written to it (``escape``) before passing it on."""

    def __init__(self, inner: TextIO, carriage_return: bool = False) -> None:
        self._inner = inner
        self._cr = carriage_return

    def write(self, text: str) -> int:
        return self._inner.write(escape(text, self._cr))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install() -> None:
    """Escape what this process prints to its standard output and error from now on."""
    if not isinstance(sys.stdout, Escaping):
        sys.stdout = Escaping(sys.stdout)
    if not isinstance(sys.stderr, Escaping):
        sys.stderr = Escaping(sys.stderr, carriage_return=True)  # progress bars redraw with it
