"""Every edge of the lifecycle, driven through the fold by the real records that take it.

The table in ``projections/lifecycle.py`` says which moves are legal; this says which ones
happen. For each edge there is a log that brings job ``j`` to the edge's phase and then one
record (an agent's report, a service's decision, a client's request) that must move it to the
edge's target, accepted by the fold. An edge of the table with no such recipe fails
``test_every_edge_of_the_table_is_driven``: either no record can take it (then it does not
belong in the table) or its recipe is missing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.events import subjects
from corral.events.base import Reason
from corral.events.jobs import CancelJob, JobRejected
from corral.projections import fold_moves
from corral.projections.fold import fold
from corral.projections.lifecycle import FINAL, PHASES, TRANSITIONS, Phase, Trigger
from tests.builders import Cluster, LogBuilder, job, placement, whole, worker

NODE = "node-00"
Step = Callable[[LogBuilder], LogBuilder]


def _log(replicas: int = 1, restarts: int = 3) -> LogBuilder:
    """Job ``j`` of ``replicas`` one-GPU workers submitted to team-a; ``b``, of higher priority
    in the same queue, is there to be preempted for."""
    spec = job("team-a").replicas(replicas).restarts(restarts)
    return (
        LogBuilder()
        .nodes(Cluster(1))
        .queues("team-a", "team-b")
        .submit("alice", "j", spec)
        .submit("bob", "b", job("team-a"))
        .accept("b", priority=10)
    )


def _placed(replicas: int) -> Step:
    return lambda lb: (
        lb.accept("j")
        .admit("j", replicas=replicas)
        .place(placement("j", *(worker(r, NODE, whole(r)) for r in range(replicas))))
    )


def _started(*ranks: int) -> Step:
    def step(lb: LogBuilder) -> LogBuilder:
        for r in ranks:
            lb.started(NODE, "j", rank=r)
        return lb

    return step


def _exited(rank: int, code: int) -> Step:
    return lambda lb: lb.exited(NODE, "j", rank=rank, code=code)


def _lost(lb: LogBuilder) -> LogBuilder:
    return lb.condition(NODE, "lost")


def _preempt(lb: LogBuilder) -> LogBuilder:
    return lb.preempt("b", "j")


def _reject(lb: LogBuilder) -> LogBuilder:
    body = JobRejected(job_id="j", request_seq=1, reason=Reason("invalid", "no"))
    return lb.event(subjects.job("j"), body)


def _cancel(lb: LogBuilder) -> LogBuilder:
    return lb.request("alice", "cancel", CancelJob(job_id="j"))


# Logs that bring ``j`` to each phase: (replicas, restarts, steps). Gangs of two or three workers
# where a phase needs some of them started but not all.
TO: dict[Phase, tuple[int, int, list[Step]]] = {
    "submitted": (1, 3, []),
    "queued": (1, 3, [lambda lb: lb.accept("j")]),
    "admitted": (1, 3, [lambda lb: lb.accept("j").admit("j")]),
    "placed": (2, 3, [_placed(2)]),
    "starting": (3, 0, [_placed(3), _started(0)]),
    "running": (1, 0, [_placed(1), _started(0)]),
    "checkpointing": (1, 3, [_placed(1), _started(0), _preempt]),
    "preempted": (1, 3, [_placed(1), _started(0), _preempt, _exited(0, 143)]),
    "interrupted": (1, 3, [_placed(1), _started(0), _exited(0, 1)]),
}

# The record that takes each edge from the phase ``TO`` brings the job to.
EDGES: dict[tuple[Phase, Trigger], Step] = {
    ("submitted", "accept"): lambda lb: lb.accept("j"),
    ("submitted", "reject"): _reject,
    ("queued", "admit"): lambda lb: lb.admit("j"),
    ("admitted", "withdraw"): lambda lb: lb.withdraw("j"),
    ("admitted", "place"): lambda lb: lb.place(placement("j", worker(0, NODE, whole(0)))),
    ("placed", "start"): _started(0),
    ("starting", "start"): _started(1),  # the second of three: still starting
    ("starting", "run"): _started(1, 2),  # the last of the gang: it runs
    ("placed", "preempt"): _preempt,
    ("starting", "preempt"): _preempt,
    ("running", "preempt"): _preempt,
    ("checkpointing", "stop"): _exited(0, 143),
    ("preempted", "requeue"): lambda lb: lb.requeue("j", 0),
    ("placed", "interrupt"): _lost,
    ("starting", "interrupt"): _lost,
    ("running", "interrupt"): _lost,
    ("checkpointing", "interrupt"): _lost,
    ("interrupted", "requeue"): lambda lb: lb.requeue("j", 0),
    ("running", "succeed"): _exited(0, 0),
    ("starting", "fail"): _exited(0, 1),  # no restarts left
    ("running", "fail"): _exited(0, 1),
    **{(p, "cancel"): _cancel for p in PHASES if p not in FINAL},
}


def _walk(phase: Phase) -> tuple[LogBuilder, Phase]:
    replicas, restarts, steps = TO[phase]
    lb = _log(replicas, restarts)
    for step in steps:
        lb = step(lb)
    state = lb.fold()
    assert not state.rejections, [r.message for r in state.rejections]
    return lb, state.jobs["j"].phase


@pytest.mark.parametrize("phase", list(TO))
def test_each_phase_is_reached_by_its_log(phase: Phase) -> None:
    assert _walk(phase)[1] == phase


def test_every_edge_of_the_table_is_driven() -> None:
    assert set(EDGES) == set(TRANSITIONS), (
        f"in the table, no record drives: {sorted(set(TRANSITIONS) - set(EDGES))}; "
        f"driven, not in the table: {sorted(set(EDGES) - set(TRANSITIONS))}"
    )


class _Recorded(dict[Phase, tuple[Phase, int]]):
    """One trigger's row of the fold's moves, noting every (phase, trigger) the fold looks up."""

    def __init__(self, trigger: Trigger, row: dict[Phase, tuple[Phase, int]], taken: list[object]) -> None:
        super().__init__(row)
        self.trigger, self.taken = trigger, taken

    def __getitem__(self, phase: Phase) -> tuple[Phase, int]:
        found = super().__getitem__(phase)
        self.taken.append((phase, self.trigger))
        return found

    def get(self, phase: Phase, default: object = None) -> object:  # type: ignore[override]
        if phase in self:
            self.taken.append((phase, self.trigger))
        return super().get(phase, default)


@pytest.mark.parametrize("edge", list(EDGES), ids=lambda e: f"{e[0]}-{e[1]}")
def test_the_record_takes_the_edge(edge: tuple[Phase, Trigger], monkeypatch: pytest.MonkeyPatch) -> None:
    lb, _ = _walk(edge[0])
    state = lb.fold()
    seq = lb.last_seq + 1
    taken: list[object] = []
    recording = {t: _Recorded(t, row, taken) for t, row in fold_moves.MOVES.items()}
    monkeypatch.setattr(fold_moves, "MOVES", recording)
    fold(EDGES[edge](lb).records[seq - 1 :], state)
    assert [r for r in state.rejections if r.seq >= seq] == []
    assert edge in taken  # a record may move a job twice (a gang's last start: start, then run)
    assert state.jobs["j"].phase == TRANSITIONS[taken[-1]]
