"""Checkpoint requests, the agent's side of the checkpoint contract (``workers.py``): write
``REQUEST`` with the deadline, send SIGUSR1 once the worker handles it, and report the ``DONE``
the worker writes (``Checkpoints``).

A worker still starting (no handler yet) still hears a request made before: the signal is owed
until it can be sent, and the file is there for workers that cannot take signals.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

from corral.services.agent.decide import Checkpointed, Report, WorkerKey
from corral.services.agent.stopping import Stopping
from corral.services.agent.worker import DONE, REQUEST, Worker, kill, log


class Checkpoints(Stopping):
    """The runtime's part that asks workers to checkpoint and reports their checkpoints."""

    # The runtime's state this part reads, set by ``Runtime.__init__`` (``workers.py``).
    reports: asyncio.Queue[Report]

    async def request_checkpoint(self, key: WorkerKey, deadline: float) -> None:
        w = self._workers.get(key)
        if w is None or w.code is not None or w.phase in ("stopping", "exited", "checkpoint-requested"):
            return
        request = w.checkpoints / REQUEST
        tmp = w.checkpoints / (REQUEST + ".tmp")
        w.checkpoints.mkdir(parents=True, exist_ok=True)
        tmp.write_text(f"{deadline:.3f}\n")
        os.replace(tmp, request)
        w.phase = "checkpoint-requested"
        w.signal_owed = True
        self._signal_checkpoint(w)

    def _signal_checkpoint(self, w: Worker) -> None:
        """SIGUSR1 to a worker asked to checkpoint, once it handles the signal: one that installs
        its handler a moment after it started still hears a request made before."""
        if w.phase != "checkpoint-requested":
            w.signal_owed = False
            return
        pid = self._main_pid(w)
        if pid is None or not _handles(pid, signal.SIGUSR1):
            return
        w.signal_owed = False
        if w.container is not None:
            self._to_container(w, signal.SIGUSR1)
        else:
            kill(pid, signal.SIGUSR1)

    def _poll_checkpoint(self, w: Worker, final: bool) -> None:
        done = w.checkpoints / DONE
        try:
            raw = done.read_bytes()
        except OSError:
            return
        try:
            body = json.loads(raw)
            step, location = int(body["step"]), str(body["location"])
        except (ValueError, KeyError, TypeError):
            if final:
                log.warning("worker %s wrote an unreadable %s: %r", w.key, done, raw[:200])
                done.unlink(missing_ok=True)
            return  # maybe half-written by a worker that does not rename; read it next time
        done.unlink(missing_ok=True)
        (w.checkpoints / REQUEST).unlink(missing_ok=True)
        if w.phase == "checkpoint-requested":
            w.phase = "checkpointed"
        self.reports.put_nowait(Checkpointed(w.key, step, location))


def _handles(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` catches or ignores ``sig``: SIGUSR1's default action is to terminate, and a
    worker still starting up (or one that only watches the file) must not die of a request."""
    bit = 1 << (int(sig) - 1)
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return bool((int(fields["SigCgt"], 16) | int(fields["SigIgn"], 16)) & bit)
    except (OSError, KeyError, ValueError):
        return False
