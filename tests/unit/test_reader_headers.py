"""The log reader's parse of a record's header block: the shortcut for the blocks the writers
store reads exactly what the general loop reads, and the blocks they store take the shortcut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.events import reader

MSG = "Nats-Msg-Id"


def block(*lines: tuple[str, str]) -> bytes:
    """A header block as nats-py writes it (and the stream stores it): in the dict's order."""
    return b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in lines) + b"\r\n"


def general(raw: bytes) -> dict[str, str] | None:
    """The rule, line by line: the writer's headers, the server's own (``Nats-*``) dropped."""
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n")[1:]:
        if line and not line.startswith(b"Nats-"):
            key, _, value = line.partition(b":")
            out[key.strip().decode()] = value.strip().decode(errors="replace")
    return out or None


# What the writers store (events/jetstream.py puts the message id after the writer's headers):
# a service's record with the trace of the job it names, one with none, a tenant's request.
STORED = [
    block(("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), (MSG, "placer:41:0")),
    block((MSG, "register:node-00")),
    block(("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")),
    block(("traceparent", "t"), (MSG, "team-a/x: y traceparent: z")),
]


@pytest.mark.parametrize("raw", STORED)
def test_the_blocks_the_writers_store_take_the_shortcut(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(raw: bytes) -> dict[str, str] | None:
        raise AssertionError(f"read line by line: {raw!r}")

    monkeypatch.setattr(reader, "_general", refused)
    assert reader._headers(raw) == general(raw)


ODD = [
    *STORED,
    block((MSG, "m"), ("traceparent", "t")),  # the id first, then the trace
    block(("traceparent", "t"), ("x-k", "v"), (MSG, "m")),  # a header of the writer's besides
    block(("traceparent", "t"), ("tracestate", "a=b"), (MSG, "m")),  # a tenant's trace headers
    block(("traceparent", "t"), (MSG, "m"), ("Nats-Expected-Last-Subject-Sequence", "0")),
    block(("traceparent", "t"), (MSG, "m"), ("x-late", "v")),
    block(("traceparent", "t"), ("traceparent", "u"), (MSG, "m")),
    block(("Traceparent", "t"), (MSG, "m")),
    block(("traceparent", ""), (MSG, "")),
    block((MSG, "m"), (MSG, "n")),
    block(("Nats-Msg-Id-Other", "m")),
    b"NATS/1.0\r\ntraceparent: t\r\nNats-Msg-Id: m\r\nx-k",  # a block cut short
    b"NATS/1.0\r\nNats-Msg-Id: m\r\n\r\nx-k: v\r\n\r\n",
    b"NATS/1.0\r\ntraceparent : t\r\nNats-Msg-Id: m\r\n\r\n",
    b"NATS/1.0\r\ntraceparent: \xff\xfe\r\nNats-Msg-Id: m\r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id: m",
    b"NATS/1.0\r\n\r\n",
]


@pytest.mark.parametrize("raw", ODD)
def test_any_block_reads_as_the_general_rule(raw: bytes) -> None:
    assert reader._headers(raw) == general(raw)


# Header values as nats-py sends them: stripped, no line breaks.
values = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20).map(
    str.strip
)
keys = st.sampled_from(["traceparent", "tracestate", "x-k", MSG, "Nats-Batch-Id", "Traceparent"])


@given(st.lists(st.tuples(keys, values), max_size=5))
def test_generated_blocks_read_as_the_general_rule(lines: list[tuple[str, str]]) -> None:
    raw = block(*lines)
    assert reader._headers(raw) == general(raw)
