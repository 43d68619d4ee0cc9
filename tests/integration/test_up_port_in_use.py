"""``corral up --port`` on a port something else listens on: the nats-server it starts stops at
once, and that is one line naming the port, exit status 2, not a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from corral.services.cli.main import main


def test_a_port_in_use_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stop:
            main(["up", "--nodes", "1", "--port", str(port), "--data", str(tmp_path / "data")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"127.0.0.1:{port}" in err and "address already in use" in err, err
    assert "[INF]" not in err  # the server's banner is in its log, not in the line
