"""``corral logs``: a job's worker output from the agents' directories on this machine.

Each worker writes its output to ``<agent work dir>/logs/<job>/attempt-<a>.rank-<r>.log``; the
agents of ``corral up`` keep their work dirs under one root. ``Reader`` finds those files and
prints what is new in each since it last looked, under a ``==> node: file <==`` line whenever the
file changes (as ``tail`` does); ``follow`` keeps doing so until the read service says the job
has ended. Files are looked at twice a second: the output is on this machine's disk, not in the
log, and the standard library has no portable way to be told a file grew.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path
from typing import TextIO

from corral.services.agent.workers import job_logs
from corral.services.client import Client, CorralError

FOLLOW_EVERY = 0.5  # seconds between looks at the files while following
_RANK = re.compile(r"attempt-(\d+)\.rank-(\d+)\.log")


class Reader:
    def __init__(self, root: Path, job_id: str, rank: int | None = None) -> None:
        self.root, self.job_id, self.rank = root, job_id, rank
        self._read: dict[Path, int] = {}  # file -> bytes of it printed
        self._last: Path | None = None

    @property
    def which(self) -> str:
        return f" rank {self.rank}" if self.rank is not None else ""

    def files(self) -> list[Path]:
        agents = sorted({p.parent.parent.parent for p in self.root.glob(f"**/logs/{self.job_id}/*.log")})
        # Attempt by attempt, rank by rank, wherever each ran.
        found = sorted((f for agent in agents for f in job_logs(agent, self.job_id)), key=_order)
        if self.rank is None:
            return found
        return [f for f in found if (m := _RANK.fullmatch(f.name)) and int(m.group(2)) == self.rank]

    def print_new(self, out: TextIO, tail: int | None = None) -> bool:
        """Print what each file holds past what was printed of it (of a file seen for the first
        time, its last ``tail`` lines only, when given); whether anything was printed."""
        printed = False
        for f in self.files():
            start = self._read.get(f)
            try:
                with f.open("rb") as fh:
                    fh.seek(start or 0)
                    data = fh.read()
            except OSError:
                continue
            first = start is None
            self._read[f] = (start or 0) + len(data)
            if first and tail is not None:
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-tail:]) if tail else b""
            if not data and not first:
                continue
            if f != self._last:
                out.write(f"==> {f.parent.parent.parent.name}: {f.name} <==\n")
                self._last = f
            out.write(data.decode(errors="replace"))
            out.flush()
            printed = True
        return printed


def _order(f: Path) -> tuple[int, int, str]:
    m = _RANK.fullmatch(f.name)
    return (int(m.group(1)), int(m.group(2)), str(f)) if m else (1 << 30, 0, str(f))


def follow(reader: Reader, client: Client, out: TextIO, tail: int | None) -> None:
    """Print the job's output as its workers write it, until the job has ended (succeeded,
    failed, cancelled or rejected), then what they wrote last."""
    ended = threading.Event()
    failed: list[CorralError] = []

    def wait_for_end() -> None:
        try:
            client.wait(reader.job_id, "succeeded", timeout=math.inf)  # returns on any final phase
        except CorralError as e:
            failed.append(e)
        finally:
            ended.set()

    threading.Thread(target=wait_for_end, name="corral-logs-end", daemon=True).start()
    reader.print_new(out, tail)
    while not ended.wait(FOLLOW_EVERY):
        reader.print_new(out)
    reader.print_new(out, tail)
    if failed:
        raise failed[0]
