"""One queue's waiting jobs for one admission cycle, read from the order the fold keeps
(``State.queued_by_queue``: priority, then submission, then id) only as far as the cycle asks.

Why. A cycle looks at each queue's front: the jobs it admits, at most ``lookahead`` it looks past,
the ``detail`` first it explains. A list of a deep queue's every job, made each cycle, cost a
look-up per job scattered over the whole State, more than the rest of the cycle together. A
``Backlog`` makes its jobs as they are read, and remembers them.

The cycle changes a queue before it reads it: jobs accepted or requeued in the cycle are
``add``-ed (they take their places in the order, as the fold will put them), and jobs admitted
ahead of the order or that no node can host are ``drop``-ped. Its length is known without a
read.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import overload

from corral.projections.indexes import Place, place_of
from corral.projections.state import JobState


class Backlog(Sequence[JobState]):
    def __init__(self, jobs: Mapping[str, JobState], queue: str, places: Sequence[Place]) -> None:
        self._jobs = jobs
        self.queue = queue
        self._places = places
        self._added: dict[str, JobState] = {}  # id -> the job as the cycle queued it
        self._dropped: set[str] = set()
        self._read: list[JobState] = []
        self._rest: Iterator[JobState] | None = None
        self._len = len(places)

    def add(self, job: JobState) -> None:
        """A job the cycle queued (accepted or requeued): not in the fold's order yet."""
        self._added[job.id] = job
        self._len += 1
        self._reset()

    def has(self, job_id: str) -> bool:
        if job_id in self._dropped:
            return False
        if job_id in self._added:
            return True
        job = self._jobs.get(job_id)
        return job is not None and job.phase == "queued" and job.spec.queue == self.queue

    def drop(self, job_id: str) -> None:
        """Take a job out for the rest of the cycle (nothing if it is not in)."""
        if self.has(job_id):
            self._dropped.add(job_id)
            self._len -= 1
            self._reset()

    def added(self, job_id: str) -> bool:
        return job_id in self._added

    def job(self, job_id: str) -> JobState:
        """A job of this backlog, as the cycle sees it (``has``)."""
        found = self._added.get(job_id)
        return self._jobs[job_id] if found is None else found

    def _reset(self) -> None:
        self._read = []
        self._rest = None

    def _walk(self) -> Iterator[JobState]:
        jobs, dropped, added = self._jobs, self._dropped, self._added
        if not added:  # the common case, read at the cost of a look-up a job
            if not dropped:
                return (jobs[place[2]] for place in self._places)
            return (jobs[place[2]] for place in self._places if place[2] not in dropped)
        return self._merged()

    def _merged(self) -> Iterator[JobState]:
        jobs, dropped, added = self._jobs, self._dropped, self._added
        places = heapq.merge(self._places, sorted(place_of(j) for j in added.values()))
        for place in places:
            job_id = place[2]
            if job_id in dropped:
                continue
            job = added.get(job_id)
            yield jobs[job_id] if job is None else job

    def _upto(self, n: int) -> None:
        """Read until ``n`` jobs are read (or all are)."""
        read = self._read
        if len(read) >= n:
            return
        if self._rest is None:
            self._rest = self._walk()
            read.clear()
        read.extend(islice(self._rest, n - len(read)))

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> JobState: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[JobState]: ...
    def __getitem__(self, i: int | slice) -> JobState | Sequence[JobState]:
        if isinstance(i, slice):
            start, stop, step = i.start or 0, i.stop, i.step
            if step is None and stop is not None and start >= 0 and stop >= 0:
                self._upto(stop)  # a window at the front (lookahead): read only as far
                return self._read[start:stop]
            return list(self)[i]
        if i < 0:
            i += self._len
        self._upto(i + 1)
        if not 0 <= i < len(self._read):
            raise IndexError(i)
        return self._read[i]

    def __iter__(self) -> Iterator[JobState]:
        i = 0
        while True:
            self._upto(i + 1)
            if i >= len(self._read):
                return
            yield self._read[i]
            i += 1
