"""``corral status`` from the status board: every leased role is accounted for, a role whose
replicas all stopped as much as one that runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.services.cli import cluster
from corral.services.cli import main as cli
from corral.services.runtime import status
from corral.services.runtime.status import ServiceStatus

LIVE = ("admission", "preemptor", "health", "assignments", "forecast")  # the placer died


class _Log:
    nc: Any = None

    async def close(self) -> None:
        return None


def _board(monkeypatch: pytest.MonkeyPatch, roles: tuple[str, ...]) -> None:
    async def open_log(*_: Any, **__: Any) -> _Log:
        return _Log()

    async def read(_: Any) -> tuple[dict[str, str], list[ServiceStatus]]:
        replicas = [ServiceStatus(r, f"{r}@host:1", True, 9, 3, 0, 0, 0.0) for r in roles]
        return {r.role: r.replica for r in replicas}, replicas

    monkeypatch.setattr(cluster, "open_log", open_log)
    monkeypatch.setattr(status, "read", read)


def test_a_role_with_no_replica_left_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _board(monkeypatch, LIVE)
    cli.main(["status", "--server", "nats://127.0.0.1:1"])
    lines = capsys.readouterr().out.splitlines()
    placer = [line for line in lines if line.startswith("placer")]
    assert len(placer) == 1 and "none running" in placer[0], lines
    assert len(lines) == 1 + len(LIVE) + 1

    cli.main(["status", "--server", "nats://127.0.0.1:1", "-o", "json"])
    assert json.loads(capsys.readouterr().out)["missing"] == ["placer"]


def test_a_board_with_every_role_names_none_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _board(monkeypatch, (*LIVE, "placer"))
    cli.main(["status", "--server", "nats://127.0.0.1:1"])
    out = capsys.readouterr().out
    assert "none running" not in out and len(out.splitlines()) == 1 + len(LIVE) + 1
