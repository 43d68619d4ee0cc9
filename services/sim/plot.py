"""A small line chart written straight to PNG, with no plotting library.

The trace simulator draws its allocation curves with it: lines on a white canvas, axes with
ticks, and a legend, labelled with a built-in 5x7 pixel font (upper-case letters, digits and a
few signs). The PNG is a plain 8-bit RGB image, one zlib stream, written with the standard
library only.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

RGB = tuple[int, int, int]

PALETTE: tuple[RGB, ...] = (
    (127, 127, 127),
    (31, 119, 180),
    (44, 160, 44),
    (148, 103, 189),
    (255, 127, 14),
    (214, 39, 40),
    (0, 0, 0),
    (23, 190, 207),
    (188, 189, 34),
)

# 5x7 glyphs, one string of 7 rows of 5 bits each.
_FONT: dict[str, str] = {
    "A": "01110100011000111111100011000110001", "B": "11110100011000111110100011000111110",
    "C": "01110100011000010000100001000101110", "D": "11110100011000110001100011000111110",
    "E": "11111100001000011110100001000011111", "F": "11111100001000011110100001000010000",
    "G": "01110100011000010111100011000101111", "H": "10001100011000111111100011000110001",
    "I": "01110001000010000100001000010001110", "J": "00111000100001000010000101001001100",
    "K": "10001100101010011000101001001010001", "L": "10000100001000010000100001000011111",
    "M": "10001110111010110101100011000110001", "N": "10001100011100110101100111000110001",
    "O": "01110100011000110001100011000101110", "P": "11110100011000111110100001000010000",
    "Q": "01110100011000110001101011001001101", "R": "11110100011000111110101001001010001",
    "S": "01111100001000001110000010000111110", "T": "11111001000010000100001000010000100",
    "U": "10001100011000110001100011000101110", "V": "10001100011000110001100010101000100",
    "W": "10001100011000110101101011010101010", "X": "10001100010101000100010101000110001",
    "Y": "10001100010101000100001000010000100", "Z": "11111000010001000100010001000011111",
    "0": "01110100011001110101110011000101110", "1": "00100011000010000100001000010001110",
    "2": "01110100010000100010001000100011111", "3": "11111000100010000010000011000101110",
    "4": "00010001100101010010111110001000010", "5": "11111100001111000001000011000101110",
    "6": "00110010001000011110100011000101110", "7": "11111000010001000100010000100001000",
    "8": "01110100011000101110100011000101110", "9": "01110100011000101111000010001001100",
    " ": "00000000000000000000000000000000000", ".": "00000000000000000000000000110001100",
    "%": "11000110010001000100010001001100011", "-": "00000000000000011111000000000000000",
    "@": "01110100011011110101101111000001110", "(": "00010001000100001000010000010000010",
    ")": "01000001000001000010000100010001000", "/": "00000000010001000100010001000000000",
    ":": "00000011000110000000011000110000000", "=": "00000000001111100000111110000000000",
}  # fmt: skip


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, c: RGB) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.px[i : i + 3] = bytes(c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: RGB, thick: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            x = x0 + (x1 - x0) * s // steps
            y = y0 + (y1 - y0) * s // steps
            for dx in range(thick):
                for dy in range(thick):
                    self.dot(x + dx, y + dy, c)

    def rect(self, x: int, y: int, w: int, h: int, c: RGB) -> None:
        for yy in range(y, y + h):
            for xx in range(x, x + w):
                self.dot(xx, yy, c)

    def text(self, x: int, y: int, s: str, c: RGB = (0, 0, 0), scale: int = 1) -> None:
        for ch in s.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for row in range(7):
                for col in range(5):
                    if glyph[row * 5 + col] == "1":
                        self.rect(x + col * scale, y + row * scale, scale, scale, c)
            x += 6 * scale

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.px[y * self.width * 3 : (y + 1) * self.width * 3])
            for y in range(self.height)
        )

        def chunk(tag: bytes, data: bytes) -> bytes:
            return (
                struct.pack(">I", len(data))
                + tag
                + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
            )

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    title: str = "",
    x_label: str = "",
    y_label: str = "",
    ticks: tuple[int, int] = (10, 10),
    size: tuple[int, int] = (900, 600),
) -> Path:
    """Draw each series (its points, x ascending) and write the PNG to ``path``."""
    width, height = size
    left, right, top, bottom = 70, 20, 40, 60
    cv = Canvas(width, height)
    (x0, x1), (y0, y1) = x_range, y_range

    def px(x: float, y: float) -> tuple[int, int]:
        u = left + (x - x0) / (x1 - x0) * (width - left - right)
        v = height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)
        return round(u), round(v)

    grey = (220, 220, 220)
    for i in range(ticks[0] + 1):
        xv = x0 + (x1 - x0) * i / ticks[0]
        gx, _ = px(xv, y0)
        cv.line(gx, top, gx, height - bottom, grey)
        cv.text(gx - 8, height - bottom + 8, f"{xv:g}")
    for i in range(ticks[1] + 1):
        yv = y0 + (y1 - y0) * i / ticks[1]
        _, gy = px(x0, yv)
        cv.line(left, gy, width - right, gy, grey)
        cv.text(8, gy - 3, f"{yv:g}")
    cv.line(left, height - bottom, width - right, height - bottom, (0, 0, 0))
    cv.line(left, top, left, height - bottom, (0, 0, 0))
    cv.text(left + 60, 10, title, scale=2)
    cv.text(width // 2 - 3 * len(x_label), height - 22, x_label)
    cv.text(8, top - 14, y_label)
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        prev = None
        for x, y in pts:
            cur = px(x, max(y0, min(y1, y)))
            if prev is not None:
                cv.line(prev[0], prev[1], cur[0], cur[1], color, thick=2)
            prev = cur
        ly = top + 14 + 14 * i
        cv.rect(left + 16, ly, 18, 4, color)
        cv.text(left + 40, ly - 2, name, color)
    out = Path(path)
    out.write_bytes(cv.png())
    return out
