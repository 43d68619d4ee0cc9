"""A node agent's spans of its own work, in its jobs' traces: each worker's run and each gang's
start on the node. The agent reads no log, so it finds a job's trace in its node's view (the job's
span, as a ``traceparent``); the ids are those every other emitter derives
(``projections/trace_ids.py``), so a worker's span sits under its attempt and the job's own spans
(``TRACEPARENT``) under it.

A worker's run is a span from its start report to its exit report, emitted at the exit. A worker
an earlier agent left running and this one took back (``Runtime.reattach``) has no start this
agent saw: its span runs from the taking back to the exit, marked ``corral.reattached`` with an
event saying so. It has the worker's own span id, which no agent emitted before (a run's span is
made at its exit), so the job's own spans keep their parent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from corral.events.base import Event
from corral.events.nodes import WorkerExited, WorkerStarted
from corral.projections.trace_ids import JobTrace
from corral.services.runtime import tracing

ROLE = "agent"

TraceOf = Callable[[str], JobTrace | None]


class WorkerSpans:
    """The spans of node ``node``'s workers; ``trace_of(job)``: the job's trace from the node's
    view, None when it is not known (or spans go nowhere)."""

    def __init__(self, node: str, trace_of: TraceOf) -> None:
        tracing.setup(ROLE)
        self.enabled = tracing.enabled(ROLE)
        self.node = node
        self.trace_of = trace_of
        # Runs started and not yet exited: (job, attempt, rank, pid) -> (trace, start time)
        self._runs: dict[tuple[str, int, int, int], tuple[JobTrace, float]] = {}
        # Workers taken back from an earlier agent: (job, attempt, rank) -> when
        self._taken: dict[tuple[str, int, int], float] = {}

    def taken_back(self, keys: Iterable[tuple[str, int, int]], now: float | None = None) -> None:
        """Workers an earlier agent left running, watched by this one from ``now`` on."""
        at = time.time() if now is None else now
        for key in keys:
            self._taken[tuple(key)] = at  # type: ignore[index]

    def reported(self, body: Event, now: float) -> None:
        """A report stored in the log: a run starts or ends."""
        if not self.enabled:
            return
        if isinstance(body, WorkerStarted):
            if (body.job_id, body.attempt, body.rank) in self._taken:
                return  # started under the earlier agent: its run here began when taken back
            trace = self.trace_of(body.job_id)
            if trace is not None:
                self._runs[(body.job_id, body.attempt, body.rank, body.pid)] = (trace, now)
            return
        if not isinstance(body, WorkerExited):
            return
        taken = self._taken.pop((body.job_id, body.attempt, body.rank), None)
        run = self._runs.pop((body.job_id, body.attempt, body.rank, body.pid), None)
        if run is None and taken is not None:
            trace = self.trace_of(body.job_id)
            run = (trace, taken) if trace is not None else None
        if run is None:
            return  # started under an earlier agent that was not this node's (nothing known)
        trace, started = run
        failed = body.code != 0 and not body.stopped
        events = [tracing.Event("re-attached", started, {"corral.node": self.node})] if taken else []
        events.append(
            tracing.Event("stopped" if body.stopped else "exited", now, {"corral.exit_code": body.code})
        )
        tracing.emit(
            ROLE,
            f"worker rank {body.rank}",
            trace_id=trace.trace_id,
            span_id=trace.worker_span(body.attempt, body.rank),
            parent=trace.attempt_span(body.attempt),
            start=started,
            end=now,
            attributes={
                "corral.job.id": body.job_id,
                "corral.attempt": body.attempt,
                "corral.rank": body.rank,
                "corral.node": self.node,
                "process.pid": body.pid,
                "corral.exit_code": body.code,
                "corral.stopped": body.stopped,
                "corral.reattached": taken is not None,
            },
            events=events,
            error=f"rank {body.rank} exited with code {body.code}" if failed else "",
        )

    def gang(
        self,
        job_id: str,
        attempt: int,
        ranks: list[int],
        gpus: int,
        started: float,
        task: asyncio.Task[Any],
    ) -> None:
        """This node's part of a gang's start (``task`` done): its ranks launched together
        behind the barrier."""
        trace = self.trace_of(job_id) if self.enabled else None
        if trace is None:
            return
        error = ""
        if task.cancelled():
            error = "start cancelled"
        elif task.exception() is not None:
            error = repr(task.exception())
        else:
            result = task.result()
            if getattr(result, "reason", None):
                error = str(result.reason)
        tracing.emit(
            ROLE,
            f"start on {self.node}",
            trace_id=trace.trace_id,
            span_id=trace.start_span(attempt, self.node),
            parent=trace.attempt_span(attempt),
            start=started,
            end=time.time(),
            attributes={
                "corral.job.id": job_id,
                "corral.attempt": attempt,
                "corral.node": self.node,
                "corral.rank": ranks,
                "corral.gpus": gpus,
            },
            error=error,
        )
