"""The agent's file operations in directories its workers own (``agent.confined``): a link, a
FIFO or a directory a worker planted is never followed, read, waited on or written through."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.services.agent import confined


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(top, the worker's checkpoint directory below it, a file of someone else's outside)."""
    top = tmp_path / "checkpoints" / "job"
    ckpt = top / "run-1" / "attempt-0" / "rank-0"
    ckpt.mkdir(parents=True)
    victim = tmp_path / "etc-passwd"
    victim.write_text("root:x:0:0\n")
    return top, ckpt, victim


def test_a_file_is_written_in_place_of_a_planted_link_not_through_it(tmp_path: Path) -> None:
    top, ckpt, victim = _tree(tmp_path)
    (ckpt / "REQUEST.tmp").symlink_to(victim)
    (ckpt / "REQUEST").symlink_to(victim)
    with confined.directory(top, ckpt) as d:
        confined.write(d, "REQUEST", b"12.5\n")
    assert victim.read_text() == "root:x:0:0\n"
    assert not (ckpt / "REQUEST").is_symlink() and (ckpt / "REQUEST").read_text() == "12.5\n"


@pytest.mark.parametrize("linked", ["run-1", "attempt-0", "rank-0"])
def test_a_directory_replaced_by_a_link_is_not_followed(tmp_path: Path, linked: str) -> None:
    top, ckpt, victim = _tree(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "DONE").write_text('{"step": 1, "location": "/secret"}')
    path = {"run-1": top / "run-1", "attempt-0": top / "run-1" / "attempt-0", "rank-0": ckpt}[linked]
    os.rename(path, tmp_path / "moved")
    path.symlink_to(elsewhere)
    with pytest.raises(confined.Escaped), confined.directory(top, ckpt, create=True):
        pass
    assert sorted(p.name for p in elsewhere.iterdir()) == ["DONE"]  # nothing made or removed there


def test_a_fifo_or_a_link_is_not_read_and_a_large_file_only_in_part(tmp_path: Path) -> None:
    top, ckpt, victim = _tree(tmp_path)
    os.mkfifo(ckpt / "DONE")  # opened for reading, it would wait for a writer for ever
    with confined.directory(top, ckpt) as d:
        with pytest.raises(confined.Escaped):
            confined.read(d, "DONE", 100)
        confined.remove(d, "DONE")
        (ckpt / "DONE").symlink_to(victim)
        with pytest.raises(confined.Escaped):
            confined.read(d, "DONE", 100)
        confined.remove(d, "DONE")
        assert victim.exists()  # the link went, not what it named
        (ckpt / "DONE").write_bytes(b"x" * 10_000)
        assert confined.read(d, "DONE", 100) == b"x" * 101
        assert confined.read(d, "MISSING", 100) is None


def test_missing_directories_are_made_below_the_top_only(tmp_path: Path) -> None:
    top = tmp_path / "job"
    top.mkdir()
    with confined.directory(top, top / "run-2" / "attempt-1" / "rank-3", create=True):
        pass
    assert (top / "run-2" / "attempt-1" / "rank-3").is_dir()
    with pytest.raises(ValueError), confined.directory(top, tmp_path / "other", create=True):
        pass


def test_a_device_or_a_hard_link_is_not_opened_for_reading(tmp_path: Path) -> None:
    # A container's root (CAP_MKNOD) could make a device node where the agent reads DONE: opened,
    # a device's driver acts (a watchdog arms, a terminal becomes the agent's).
    top, ckpt, victim = _tree(tmp_path)
    try:
        os.mknod(ckpt / "DONE", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    with confined.directory(top, ckpt) as d:
        with pytest.raises(confined.Escaped):
            confined.read(d, "DONE", 100)
        assert confined.remove(d, "DONE")
        os.link(victim, ckpt / "DONE")  # another file's contents, under the worker's name
        with pytest.raises(confined.Escaped):
            confined.read(d, "DONE", 100)
        confined.remove(d, "DONE")
        (ckpt / "DONE").mkdir()
        with pytest.raises(confined.Escaped):
            confined.read(d, "DONE", 100)
        assert not confined.remove(d, "DONE")  # a directory: said so, not pretended removed
