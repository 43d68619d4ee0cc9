"""The CLI against a server where the role that answers a command does not run: one line that
names that role, since ``corral status`` lists only the leased ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.events.server import EmbeddedServer
from corral.services.cli.main import main


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["jobs"], "the read service, corral serve query"),
        (["explain", "j1"], "the read service, corral serve query"),
        (["submit", "--queue", "team-a", "--gpus", "1", "--", "true"], "the intake, corral serve intake"),
    ],
    ids=["jobs", "explain", "submit"],
)
async def test_a_command_nobody_answers_names_the_role_that_should(
    argv: list[str], role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with EmbeddedServer(tmp_path / "nats") as server:
        with pytest.raises(SystemExit) as stop:
            await asyncio.to_thread(main, [argv[0], "--server", server.url, *argv[1:]])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"({role}, is not running)" in err, err
