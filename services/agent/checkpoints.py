"""Checkpoint requests, the agent's side of the checkpoint contract (``workers.py``): write
``REQUEST`` with the deadline, send SIGUSR1 once the worker handles it, and report the ``DONE``
the worker writes (``Checkpoints``).

A worker still starting (no handler yet) still hears a request made before: the signal is owed
until it can be sent, and the file is there for workers that cannot take signals.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

from corral.events.nodes import MAX_LOCATION, location_problem
from corral.services.agent import confined
from corral.services.agent.decide import Checkpointed, Report, WorkerKey
from corral.services.agent.stopping import Stopping
from corral.services.agent.worker import DONE, REQUEST, Worker, kill, log

# What a worker's ``DONE`` may say: read whole only up to this size (a worker could leave a file
# of any size there, for the agent to read into memory), a location as long as a path may be, a
# step an event's integer holds.
MAX_DONE_BYTES = 64 * 1024
MAX_STEP = 2**63 - 1
# A worker's checkpoints written unasked are reported at most once in this many seconds, and
# only past the step last reported: every report is a record of the log, which nothing purges
# and every service folds, and a worker writing ``DONE`` in a loop (any tenant's, a CPU-only job
# needing no quota) grew it by a record a poll. The newest ``DONE`` waits in place for its turn;
# one asked for (a preemption waits on it) and the last, as the worker exits, go at once, and one
# waiting when a request comes goes as the request is made.
REPORT_EVERY_S = 30.0


class Checkpoints(Stopping):
    """The runtime's part that asks workers to checkpoint and reports their checkpoints."""

    # The runtime's state this part reads, set by ``Runtime.__init__`` (``workers.py``).
    reports: asyncio.Queue[Report]
    report_every = REPORT_EVERY_S

    async def request_checkpoint(self, key: WorkerKey, deadline: float) -> None:
        w = self._workers.get(key)
        if w is None or w.code is not None or w.phase in ("stopping", "exited", "checkpoint-requested"):
            return
        # A DONE the worker wrote before it was asked, waiting for its turn, is reported now as
        # the unasked checkpoint it is: only one written after the request answers it (a worker
        # that watches the file would otherwise see its request taken away unanswered).
        self._poll_checkpoint(w, final=False, now=True)
        try:
            with confined.directory(w.checkpoint_top, w.checkpoints, create=True) as d:
                confined.write(d, REQUEST, f"{deadline:.3f}\n".encode())
        except (OSError, ValueError) as e:  # the worker's to break; the signal still asks
            log.warning("worker %s: its checkpoint request could not be written: %s", w.key, e)
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

    def _poll_checkpoint(self, w: Worker, final: bool, now: bool = False) -> None:
        """Report the worker's ``DONE`` if there is one and it is its turn (``REPORT_EVERY_S``;
        always when it was asked for one, when it has exited (``final``), or ``now``)."""
        last = w.checkpoint_reported_at
        if (
            not final
            and not now
            and w.phase != "checkpoint-requested"
            and last is not None
            and time.monotonic() - last < self.report_every
        ):
            return  # not its turn: its newest DONE waits in place
        try:
            with confined.directory(w.checkpoint_top, w.checkpoints) as d:
                self._take_done(w, d, final)
        except (OSError, ValueError) as e:
            if isinstance(e, confined.Escaped) or final:
                log.warning("worker %s: its checkpoint directory cannot be read: %s", w.key, e)
        except Exception:  # noqa: BLE001 - a worker's file must not end the watch of its worker
            log.exception("worker %s: its checkpoint could not be read", w.key)

    def _take_done(self, w: Worker, d: int, final: bool) -> None:
        """Report the checkpoint ``DONE`` says (in the worker's checkpoint directory ``d``)."""
        try:
            raw = confined.read(d, DONE, MAX_DONE_BYTES)
        except confined.Escaped as e:  # a link or a FIFO: never followed, never waited on
            if confined.remove(d, DONE):
                log.warning("worker %s: %s; removed", w.key, e)
            elif not w.done_unreadable:  # a directory: said once, not every poll
                log.warning("worker %s: %s, and cannot be removed; ignored", w.key, e)
                w.done_unreadable = True
            return
        if raw is None:
            return
        if len(raw) > MAX_DONE_BYTES:  # a worker's file, read by the agent: bounded
            log.warning("worker %s wrote a %s of over %d bytes; ignored", w.key, DONE, MAX_DONE_BYTES)
            confined.remove(d, DONE)
            return
        try:
            body = json.loads(raw)
        except ValueError:
            if final:
                log.warning("worker %s wrote an unreadable %s: %r", w.key, DONE, raw[:200])
                confined.remove(d, DONE)
            return  # maybe half-written by a worker that does not rename; read it next time
        confined.remove(d, DONE)
        step = _step(body.get("step")) if isinstance(body, dict) else None
        location = body.get("location") if isinstance(body, dict) else None
        if (
            step is None
            or not 0 <= step <= MAX_STEP
            or not isinstance(location, str)
            or location_problem(location) is not None
        ):
            # (a NUL would be the next attempt's CORRAL_RESUME_FROM, which no process can be
            # given; a lone surrogate, a report no codec can write)
            log.warning(
                "worker %s wrote a %s no checkpoint can be taken from (a step 0..%d, a location of "
                "1..%d printable characters): %r",
                w.key,
                DONE,
                MAX_STEP,
                MAX_LOCATION,
                raw[:200],
            )
            return
        asked = w.phase == "checkpoint-requested"
        last = w.checkpoint_step
        # The same step again is the same checkpoint: its report has the same message id, which
        # the log stores once (``service.msg_id``).
        if not asked and last is not None and step <= last:
            log.debug("worker %s: checkpoint step %d not past %d: not reported", w.key, step, last)
            return
        confined.remove(d, REQUEST)
        if asked:
            w.phase = "checkpointed"
        w.checkpoint_reported_at, w.checkpoint_step = time.monotonic(), step
        self.reports.put_nowait(Checkpointed(w.key, step, location))


def _step(value: object) -> int | None:
    """A checkpoint's step as ``DONE`` gives it: a whole number (``12``, ``12.0``, ``"12"``); None
    for anything else (``true``, ``Infinity``, ``1.5``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


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
