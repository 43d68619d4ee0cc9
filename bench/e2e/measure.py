"""What the end-to-end benchmark measures, from outside the processes it measures.

- ``Usage``: a process's CPU time (user + system) and peak RSS (``VmHWM``), read from ``/proc``.
- ``Watch``: the log as it is stored, followed from its first record. Every time it reports is
  the stream's own timestamp of a record (JetStream's, set when it was stored), never a
  process's clock: a job's submit→placed is the time of the first placement of it the placer
  stored minus the time of its submit request; a decision's lag is the time it was stored minus
  the time of the record its state was folded up to (its ``based_on``): the service's whole
  cycle, from the last fact it saw to its decision in the log, including any time it spent
  behind the log. (On a quiet log it includes the wait for the service's tick too.) Its part
  from the decision's ``now`` on (the time its cycle began deciding, by the host's clock, which
  on one machine is the server's) is its decide and append; the rest, its wait and fold. A job's
  placed→started is the time of the first ``WorkerStarted`` of its first attempt's rank 0 minus
  that of its placement: the assignments service's fold and write of the node's view, the
  agent's read of it and its report, all in one figure; the job's first appearance in a node's
  view (the stream time of that view's storing in the ``corral_assignments`` bucket) splits it
  in two. The assignments service's lag is a decision's: a view's storing minus the time of the
  log record it was computed at.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

import msgspec

from corral.events import codec, subjects
from corral.events.base import Decision
from corral.events.decisions import JobsPlaced
from corral.events.jobs import JobRejected, JobsAdmitted
from corral.events.log import Record
from corral.events.nodes import WorkerExited, WorkerStarted

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Id(msgspec.Struct):
    request_id: str


_request_id = msgspec.json.Decoder(_Id).decode


class _Job(msgspec.Struct):
    job_id: str
    attempt: int


class _View(msgspec.Struct):
    seq: int = 0  # the log position it was computed at
    jobs: list[_Job] = []


_view = msgspec.json.Decoder(_View).decode


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    rss_mib: float  # now
    peak_mib: float  # the most it ever held


def usage(pid: int) -> Usage | None:
    """CPU seconds and RSS of ``pid`` and of its live threads (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15 of stat)
    kib = lambda key: int(status.get(key, "0 kB").split()[0])  # noqa: E731
    return Usage(cpu, kib("VmRSS") / 1024, kib("VmHWM") / 1024)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; NaN of nothing."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


@dataclass
class Watch:
    """Folds nothing: picks out of each record what the figures need. Without ``per_job`` (a
    soak) it keeps no map of jobs, only the count of those finished, so it does not grow."""

    per_job: bool = True

    submitted: dict[str, float] = field(default_factory=dict)  # job -> stream time of its submit
    admitted: dict[str, float] = field(default_factory=dict)  # job -> of its first admission
    placed: dict[str, float] = field(default_factory=dict)  # job -> of its first placement
    started: dict[str, float] = field(default_factory=dict)  # job -> of its first attempt's rank 0 start
    viewed: dict[str, float] = field(default_factory=dict)  # job -> its first attempt in a node's view
    answered: set[str] = field(default_factory=set)  # jobs admission accepted or rejected
    rejected: dict[str, str] = field(default_factory=dict)  # job -> why
    finished: int = 0  # workers of rank 0 that exited 0: jobs done
    done: set[str] = field(default_factory=set)  # ... and those jobs (with ``per_job``)
    lags: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # role -> (at, lag)
    # role -> (at, the part of its lag from the decision's ``now`` to its storing: decide and append)
    deciding: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    records: int = 0
    _times: dict[int, float] = field(default_factory=dict)
    _order: deque[int] = field(default_factory=deque)
    _views: list[tuple[float, int]] = field(default_factory=list)  # (stored, seq) not yet matched

    def take(self, batch: list[Record]) -> None:
        job_prefix = subjects.job("")
        decision_prefix = subjects.decision("")
        node_prefix = subjects.node("")
        for r in batch:
            self.records += 1
            self._times[r.seq] = r.time
            self._order.append(r.seq)
            if len(self._order) > 500_000:  # a decision is based on a recent record
                del self._times[self._order.popleft()]
            s = r.subject
            if not self.per_job and not s.startswith(decision_prefix) and not s.startswith(node_prefix):
                continue
            if s.endswith(".submit") and s.startswith(subjects.IN):
                job = _request_id(r.data).request_id
                self.submitted.setdefault(job, r.time)
            elif s.startswith(job_prefix):
                job = s[len(job_prefix) :]
                if job not in self.answered:
                    self.answered.add(job)
                    body = codec.decode_envelope(r.data).body
                    if isinstance(body, JobRejected):
                        self.rejected[job] = str(body.reason)
            elif s.startswith(decision_prefix):
                body = codec.decode_envelope(r.data).body
                if isinstance(body, Decision):
                    before = self._times.get(body.based_on)
                    if before is not None:
                        role = s[len(decision_prefix) :]
                        self.lags.setdefault(role, []).append((r.time, r.time - before))
                        self.deciding.setdefault(role, []).append((r.time, r.time - body.now))
                if isinstance(body, JobsPlaced) and self.per_job:
                    for p in body.placements:
                        if p.attempt == 0:
                            self.placed.setdefault(p.job_id, r.time)
                elif isinstance(body, JobsAdmitted) and self.per_job:
                    for a in body.admissions:
                        if a.attempt == 0:
                            self.admitted.setdefault(a.job_id, r.time)
            elif s.startswith(node_prefix) and b"WorkerExited" in r.data:
                body = codec.decode_envelope(r.data).body
                if isinstance(body, WorkerExited) and body.rank == 0 and body.code == 0:
                    self.finished += 1
                    if self.per_job:
                        self.done.add(body.job_id)
            elif self.per_job and s.startswith(node_prefix) and b"WorkerStarted" in r.data:
                body = codec.decode_envelope(r.data).body
                if isinstance(body, WorkerStarted) and body.rank == 0 and body.attempt == 0:
                    self.started.setdefault(body.job_id, r.time)
        self._match_views()

    def take_views(self, batch: list[Record]) -> None:
        """Records of the views' bucket's stream: each a node's view, as the assignments service
        wrote it. Its lag is matched once the log's record it names has been taken."""
        for r in batch:
            try:
                view = _view(r.data)
            except msgspec.DecodeError:
                continue
            self._views.append((r.time, view.seq))
            for job in view.jobs if self.per_job else ():
                if job.attempt == 0:
                    self.viewed.setdefault(job.job_id, r.time)
        self._match_views()

    def _match_views(self) -> None:
        newest = self._order[-1] if self._order else 0
        waiting = []
        for at, seq in self._views:
            if seq > newest:
                waiting.append((at, seq))  # the log's follower is behind the bucket's
            elif (before := self._times.get(seq)) is not None:
                self.lags.setdefault("assignments", []).append((at, at - before))
        self._views = waiting
