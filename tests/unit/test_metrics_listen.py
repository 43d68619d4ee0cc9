"""Where ``/metrics`` listens: this machine only unless told otherwise (the figures name every
queue and node and what each holds), and an address it cannot listen on is one line, exit 2.
With a token file, only a scraper bearing its token reads them: loopback is not only the
operator, a job's workers share their node's network."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.services.cli import main as cli
from corral.services.runtime import metrics

NOT_HERE = "192.0.2.1"  # TEST-NET-1: never an address of this host


async def test_metrics_listen_on_loopback_unless_told() -> None:
    async with metrics.serving("corral-test", 0) as telemetry:
        assert telemetry is not None and telemetry._server is not None
        assert {s.getsockname()[0] for s in telemetry._server.sockets} == {"127.0.0.1"}
    async with metrics.serving("corral-test", 0, "0.0.0.0") as telemetry:
        assert telemetry is not None and telemetry._server is not None
        assert {s.getsockname()[0] for s in telemetry._server.sockets} == {"0.0.0.0"}


async def test_an_address_not_of_this_host_is_refused_in_one_line() -> None:
    with pytest.raises(metrics.Unavailable, match=f"cannot serve metrics on {NOT_HERE}:0"):
        async with metrics.serving("corral-test", 0, NOT_HERE):
            pass


@pytest.mark.parametrize("role", ["query", "admission"])
def test_serve_with_metrics_it_cannot_listen_for_exits_2(
    role: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before it connects to anything: the server named here does not exist.
    argv = [
        "serve",
        role,
        "--metrics-port",
        "0",
        "--metrics-host",
        NOT_HERE,
        "--server",
        "nats://127.0.0.1:1",
    ]
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"corral: cannot serve metrics on {NOT_HERE}:0"), err


async def _get(port: int, *headers: str) -> tuple[bytes, bytes]:
    """The status line and the rest of the answer to a GET /metrics sending ``headers``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        "".join(
            ["GET /metrics HTTP/1.1\r\nHost: localhost\r\n", *(h + "\r\n" for h in headers), "\r\n"]
        ).encode()
    )
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status, _, rest = answer.partition(b"\r\n")
    return status, rest


async def test_with_a_token_only_a_scraper_bearing_it_reads_the_figures(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-Token\n")  # as an editor leaves it: the newline is not the token's
    async with metrics.serving("corral-test", 0, token_file=str(token)) as telemetry:
        assert telemetry is not None and telemetry.port
        for refused in (
            (),
            ("Authorization: Bearer wrong",),
            ("Authorization: Basic s3cret-Token",),
            ("Authorization: Bearer s3cret-Token-and-more",),
            ("X-Token: s3cret-Token",),
        ):
            status, body = await _get(telemetry.port, *refused)
            assert status == b"HTTP/1.0 401 Unauthorized", refused
            assert b"corral" not in body
        for bearing in ("Authorization: Bearer s3cret-Token", "authorization:  bearer   s3cret-Token"):
            status, body = await _get(telemetry.port, bearing)
            assert status == b"HTTP/1.0 200 OK", bearing
            assert b"Content-Type: text/plain; version=0.0.4" in body  # the figures' format
    async with metrics.serving("corral-test", 0) as telemetry:  # no token: as before, anyone here
        assert telemetry is not None and telemetry.port
        assert (await _get(telemetry.port))[0] == b"HTTP/1.0 200 OK"


@pytest.mark.parametrize("text", [None, "", "  \n", "two words"])
async def test_a_token_file_missing_empty_or_of_several_words_is_refused_in_one_line(
    text: str | None, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    if text is not None:
        token.write_text(text)
    with pytest.raises(metrics.Unavailable, match="metrics token"):
        async with metrics.serving("corral-test", 0, token_file=str(token)):
            pass


def test_serve_with_a_metrics_token_it_cannot_read_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-token"
    argv = ["serve", "query", "--metrics-port", "0", "--metrics-token-file", str(missing)]
    with pytest.raises(SystemExit) as stop:
        cli.main([*argv, "--server", "nats://127.0.0.1:1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"corral: cannot read the metrics token from {missing}"), err
