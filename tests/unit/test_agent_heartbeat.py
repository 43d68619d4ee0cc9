"""An agent's heartbeat says whether it can start workers: one whose work or checkpoint directory
is out of space says so, and why, so that the health monitor takes its node out of placement
before jobs placed there fail to start and are charged restarts for it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from corral.events.log import InMemoryLog
from corral.services.agent import service
from corral.services.agent.service import MIN_FREE_BYTES, NodeAgent
from corral.services.runtime.views import MemoryViews


class Usage(NamedTuple):
    total: int
    used: int
    free: int


@pytest.mark.parametrize(
    ("full", "why"),
    [
        pytest.param("", "", id="room-everywhere"),
        pytest.param("work", "has 0 MiB free", id="work-dir-full"),
        pytest.param("ckpt", "has 15 MiB free", id="checkpoint-dir-short"),
    ],
)
async def test_a_heartbeat_says_the_agent_is_unwell_while_a_directory_it_starts_workers_in_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full: str, why: str
) -> None:
    (tmp_path / "ckpt").mkdir()
    agent = NodeAgent(
        "node-00", InMemoryLog(), MemoryViews(), work_dir=tmp_path / "work", checkpoint_root=tmp_path / "ckpt"
    )
    (tmp_path / "work").mkdir(exist_ok=True)
    free = {"work": 0, "ckpt": MIN_FREE_BYTES - (1 << 20)}

    def disk_usage(path: str | Path) -> Usage:
        name = Path(path).name
        left = free[name] if name == full else 1 << 40
        return Usage(1 << 40, (1 << 40) - left, left)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    beat = await agent._heartbeat()
    assert beat.ok == (not why)
    assert why in beat.why and (not why or str(tmp_path / full) in beat.why)
    if full:
        free[full] = MIN_FREE_BYTES
        beat = await agent._heartbeat()
        assert beat.ok and beat.why == ""


def test_a_directory_not_made_yet_is_no_reason_to_say_the_agent_is_unwell(tmp_path: Path) -> None:
    assert service.short_of_space((tmp_path / "missing",)) == ""


async def test_a_directory_that_does_not_answer_holds_no_heartbeat_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint root on a network filesystem that hangs: asked in the event loop, the agent's
    # heartbeats stopped and the monitor lost the node, interrupting every job on it.
    import asyncio
    import threading

    agent = NodeAgent("node-00", InMemoryLog(), MemoryViews(), work_dir=tmp_path / "work")
    answer, asked = threading.Event(), []

    def disk_usage(path: str | Path) -> Usage:
        asked.append(path)
        answer.wait(30)
        return Usage(1 << 40, 0, 0)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(service, "SPACE_WAIT_S", 0.05)
    for _ in range(3):
        beat = await asyncio.wait_for(agent._heartbeat(), 5)
        assert beat.ok  # no answer yet: as last said
    assert len(asked) == 1  # one question at a time, however many heartbeats wait for it
    answer.set()
    assert agent._space_asked is not None
    await agent._space_asked
    answer.clear()  # the next question hangs: the answer heard meanwhile is what is said
    beat = await agent._heartbeat()
    assert not beat.ok and "0 MiB free" in beat.why  # heard: the next heartbeat says it
    answer.set()
    await agent._space_asked
