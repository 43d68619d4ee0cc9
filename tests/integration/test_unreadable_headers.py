"""A message whose header block nats-py cannot read, from whoever may publish to a subject a
corral connection subscribes to (a tenant's own client speaking the protocol itself, to the
intake's or the read service's subjects), is dropped: the connection reads on. It raised out of
nats-py's read loop, which ended, and the service heard nothing until its pings went stale."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats.aio.msg
import pytest

from corral.events.log import Append
from corral.events.nats_client import Client, open_client
from corral.events.server import EmbeddedServer

# Header blocks a careless or hostile client may send, each one nats-py's parser raised on.
UNREADABLE = [
    pytest.param(b"NATS/1.0", id="version-without-line-end"),
    pytest.param(b"NATS/1.0 \xff\xfe\r\n\r\n", id="status-not-utf8"),
]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    async with EmbeddedServer(tmp_path / "nats") as s:
        yield s


async def _raw_publish(
    server: EmbeddedServer, subject: bytes, header: bytes, body: bytes, *more: bytes
) -> None:
    """HPUB as a client of its own writes it, the server passing the header block on as is;
    ``more``: further (subject, header, body) triples, sent after it on the same connection, so
    that subscribers get them in that order (NATS keeps one publisher's order, not two's)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"headers":true,"verbose":false}\r\n')
        triples = [(subject, header, body), *zip(more[0::3], more[1::3], more[2::3], strict=True)]
        for subj, head, data in triples:
            writer.write(b"HPUB %s %d %d\r\n%s%s\r\n" % (subj, len(head), len(head) + len(data), head, data))
        writer.write(b"PING\r\n")
        await writer.drain()
        assert (await reader.readline()).strip() == b"PONG"
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("header", UNREADABLE)
@pytest.mark.parametrize("direct", [False, True], ids=["subscription", "direct"])
async def test_an_unreadable_header_drops_that_message_only(
    server: EmbeddedServer, header: bytes, direct: bool
) -> None:
    nc: Client = await open_client(server.url)
    heard: asyncio.Queue[bytes] = asyncio.Queue()
    try:
        if direct:

            def delivered(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
                if headers is not None and not headers.startswith(b"NATS/1.0\r\n"):
                    raise ValueError("a header block this handler cannot read")
                heard.put_nowait(data)

            await nc.subscribe_direct("ask.>", delivered)
        else:

            async def on_message(msg: nats.aio.msg.Msg) -> None:
                heard.put_nowait(msg.data)

            await nc.subscribe("ask.>", cb=on_message)
        await nc.flush()
        await _raw_publish(
            server, b"ask.bad", header, b"garbage", b"ask.good", b"NATS/1.0\r\nx: 1\r\n\r\n", b"after"
        )
        assert await asyncio.wait_for(heard.get(), 5.0) == b"after"
        assert nc.unreadable_total == 1 and nc.is_connected
    finally:
        await nc.close()


async def test_a_record_stored_with_bytes_no_reader_expected_is_read_not_skipped(tmp_path: Path) -> None:
    # A writer of the stream (an agent of a node taken over, anyone on a server without logins)
    # stored a record whose subject or header name is not UTF-8: every service's reader raised
    # on it and went on after it, each folding a log without that record, refused by nobody.
    from corral.events.jetstream import JetStreamLog

    async with EmbeddedServer(tmp_path / "nats") as server:
        log = await JetStreamLog.connect(server.url, create=True)
        try:
            await _raw_publish(server, b"corral.in.\xff\xfe.submit", b"NATS/1.0\r\nx: 1\r\n\r\n", b"{}")
            await _raw_publish(server, b"corral.in.a.submit", b"NATS/1.0\r\n\xff\xfe: 1\r\n\r\n", b"{}")
            await log.append(Append("corral.ev.job.j1", b"{}"))
            got = [r async for batch in log.read(1, None) for r in batch]
        finally:
            await log.close()
    assert [r.seq for r in got] == [1, 2, 3]
    assert got[0].subject == "corral.in.\ufffd\ufffd.submit" and got[1].headers == {"\ufffd\ufffd": "1"}


async def test_a_record_the_reader_cannot_take_ends_the_read_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection drops a delivery its handler raises on: a record of the log so dropped
    # would be folded by no service, and nothing would say so. The read ends with the error.
    from corral.events import reader
    from corral.events.jetstream import JetStreamLog
    from corral.events.log import LogError

    def broken(raw: bytes) -> dict[str, str] | None:
        raise RuntimeError("a reader's bug")

    async with EmbeddedServer(tmp_path / "nats") as server:
        log = await JetStreamLog.connect(server.url, create=True)
        try:
            await log.append(Append("corral.ev.job.j1", b"{}", headers={"traceparent": "x"}))
            monkeypatch.setattr(reader, "_headers", broken)
            with pytest.raises(LogError, match="could not be read: RuntimeError"):
                async with asyncio.timeout(10):
                    [r async for batch in log.read(1, None) for r in batch]
        finally:
            await log.close()
