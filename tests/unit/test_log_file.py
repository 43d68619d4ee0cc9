"""The log written to a file is as private as the credentials: every tenant's jobs are in it."""

from __future__ import annotations

import stat
from pathlib import Path

from corral.events.log import Record
from corral.services.cli import logfile


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_exported_log_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    # Written 0644 in the directory corral up ran from, it was read by another tenant's job,
    # whose sandbox shows that directory.
    records = [Record(1, "corral.in.team-a.submit", b"{}", time=1.0)]
    fresh, old = tmp_path / "log.jsonl", tmp_path / "old.jsonl"
    old.write_text("")
    old.chmod(0o644)
    for path in (fresh, old):
        assert logfile.write(path, records) == 1
        assert _mode(path) == 0o600, oct(_mode(path))
        assert [r.seq for r in logfile.read(path)] == [1]
