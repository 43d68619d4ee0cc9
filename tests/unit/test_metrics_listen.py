"""Where ``/metrics`` listens: this machine only unless told otherwise (the figures name every
queue and node and what each holds), and an address it cannot listen on is one line, exit 2."""

from __future__ import annotations

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
