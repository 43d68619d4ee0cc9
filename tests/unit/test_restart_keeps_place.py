"""A corral stopped and started again on purpose reorders no work.

``corral up`` stopping shuts every node down (``NodeShutdown.registers_again``): the jobs there
are interrupted and requeued, uncharged. When corral comes back, a job that was running keeps its
place: admission admits it before anyone else in the cycle that requeues it, and the placer holds
what of its old place is free and places it first, so that the job whose reservation waited for
those GPUs (or one that waited for its quota) does not take them. A job its node's loss, or a
shutdown after which no agent registers again, interrupted keeps nothing.

Each case is one node of 8 GPUs, ``run`` on all of them, ``next`` admitted and holding the
placer's reservation on them, at the point of the restart where the case says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from corral.events.base import Event
from corral.events.decisions import JobsPlaced, Placement
from corral.events.jobs import JobRequeued, JobsAdmitted
from corral.events.nodes import NodeInventory
from corral.projections import queueing
from corral.projections.state import State
from corral.services.admission import decide as admission
from corral.services.placer import decide as placer
from corral.services.preemptor import decide as preemptor
from tests.builders import Cluster, LogBuilder, home_subject, job, on, queue_spec

N0 = "node-00"
EIGHT = job().gpus(8).estimate(3600.0)
FOUR = job().gpus(4).estimate(3600.0)


def _append(log: LogBuilder, events: list[Event]) -> LogBuilder:
    for ev in events:
        log.event(home_subject(ev), ev)
    return log


def _before(nominal: int = 1024, next_priority: int = 0, next_admitted: bool = True) -> LogBuilder:
    """``run`` runs on the whole node; ``next``, submitted after it, waits: admitted behind the
    placer's reservation (or, ``next_admitted=False``, queued for the quota ``run`` holds)."""
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec(nominal=nominal))
    log.submit("alice", "run", EIGHT).accept("run").admit("run").place(on(N0, *range(8), job_id="run"))
    log.started(N0, "run").checkpoint(N0, "run", 100)
    log.submit("bob", "next", EIGHT).accept("next", priority=next_priority)
    if next_admitted:
        log.admit("next")
        _append(log, placer.decide(log.fold(), log.time))
    return log


def _stopped(log: LogBuilder, registers_again: bool = True) -> LogBuilder:
    """``corral up`` stops: the agent shuts its node down and stops the worker."""
    return log.shutdown(N0, "corral up stopped", registers_again).exited(N0, "run", code=143, stopped=True)


def _halves() -> LogBuilder:
    """``run`` runs on GPUs 0-3, ``beside`` on 4-7; ``corral up`` stops, and both stop."""
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec())
    for owner, job_id, gpus in (("alice", "run", range(4)), ("bob", "beside", range(4, 8))):
        log.submit(owner, job_id, FOUR).accept(job_id).admit(job_id).place(on(N0, *gpus, job_id=job_id))
        log.started(N0, job_id)
    log.shutdown(N0, "corral up stopped", True)
    return log.exited(N0, "run", code=143, stopped=True).exited(N0, "beside", code=143, stopped=True)


def _on_two(gpus: tuple[int, int] = (2, 3)) -> LogBuilder:
    """``run`` (2 GPUs) runs on ``gpus`` of the node, the rest idle; ``corral up`` stops."""
    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec())
    log.submit("alice", "run", job().gpus(2).estimate(3600.0)).accept("run").admit("run")
    log.place(on(N0, *gpus, job_id="run")).started(N0, "run")
    return log.shutdown(N0, "corral up stopped", True).exited(N0, "run", code=143, stopped=True)


def _back(log: LogBuilder, swapped: tuple[int, int] | None = None) -> LogBuilder:
    """The agent is back and registers its node again (NVML numbering two of its GPUs the
    other's way round, ``swapped``)."""
    return log.node(N0, _renumbered(swapped) if swapped else Cluster(1).nodes[0][1])


def _renumbered(swapped: tuple[int, int]) -> NodeInventory:
    inv = Cluster(1).nodes[0][1]
    a, b = swapped
    gpus = list(inv.gpus)
    gpus[a], gpus[b] = (msgspec.structs.replace(gpus[b], index=a), msgspec.structs.replace(gpus[a], index=b))
    return msgspec.structs.replace(inv, gpus=tuple(gpus))


def _admission_cycle(log: LogBuilder) -> LogBuilder:
    return _append(log, admission.decide(log.fold(), log.time))


def _placements(state: State) -> list[Placement]:
    return [p for ev in placer.decide(state, state.time) if isinstance(ev, JobsPlaced) for p in ev.placements]


def _placed(state: State) -> list[str]:
    return [p.job_id for p in _placements(state)]


def _uuids(state: State) -> dict[str, list[str]]:
    """The GPUs (by UUID) the placer's next cycle places each job on."""
    gpus = {name: node.gpus for name, node in state.nodes.items()}
    return {
        p.job_id: sorted(gpus[w.node][c.gpu].info.uuid for w in p.workers for c in w.gpus)
        for p in _placements(state)
    }


@dataclass
class Restart:
    id: str
    story: Callable[[], LogBuilder]
    placed: list[str]  # what the placer's next cycle places
    on: dict[str, list[str]] = field(default_factory=dict)  # some of them, on these GPUs (UUIDs)


RESTARTS = [
    Restart(
        "requeued-and-admitted-then-the-node-back: the running job is placed, not the holder",
        lambda: _back(_admission_cycle(_stopped(_before()))),
        ["run"],
    ),
    Restart(
        "the-node-back-before-admission-requeues: nobody takes its place meanwhile",
        lambda: _back(_stopped(_before())),
        [],
    ),
    Restart(
        "the-node-back-then-requeued-and-admitted: the running job is placed",
        lambda: _admission_cycle(_back(_stopped(_before()))),
        ["run"],
    ),
    Restart(
        "a-holder-of-a-higher-priority-waits-too",
        lambda: _back(_admission_cycle(_stopped(_before(next_priority=100)))),
        ["run"],
    ),
    Restart(
        "back-and-waiting-for-quota-the-admin-took-away: its GPUs do not stand idle for it",
        lambda: _back(_admission_cycle(_stopped(_before()).queue(queue_spec(nominal=0)))),
        ["next"],
    ),
    Restart(
        "a-shutdown-after-which-no-agent-registers-again-keeps-no-place",
        lambda: _back(_admission_cycle(_stopped(_before(), registers_again=False))),
        ["next"],
    ),
    Restart(
        "back-with-two-gpus-renumbered: each job is placed on the GPUs it ran on, by UUID",
        lambda: _back(_admission_cycle(_halves()), swapped=(3, 4)),
        ["run", "beside"],
        {
            "run": [f"GPU-{N0}-{i:02d}" for i in range(4)],
            "beside": [f"GPU-{N0}-{i:02d}" for i in range(4, 8)],
        },
    ),
    Restart(
        "back-on-a-node-otherwise-idle: on the GPUs it ran on, not the first two free",
        lambda: _back(_admission_cycle(_on_two())),
        ["run"],
        {"run": [f"GPU-{N0}-02", f"GPU-{N0}-03"]},
    ),
]


@pytest.mark.parametrize("case", RESTARTS, ids=[c.id.split(":")[0] for c in RESTARTS])
def test_a_restart_gives_the_running_job_its_place_back(case: Restart) -> None:
    state = case.story().fold()
    assert _placed(state) == case.placed
    uuids = _uuids(state)
    assert {j: uuids[j] for j in case.on} == case.on


def test_the_holder_keeps_its_reservation_behind_the_job_back_in_place() -> None:
    before = _before().fold().jobs["next"]
    assert (before.phase, before.reasons[0].code) == ("admitted", queueing.RESERVED)
    log = _back(_admission_cycle(_stopped(_before())))
    _append(log, placer.decide(log.fold(), log.time))
    state = log.fold()
    assert (state.jobs["run"].phase, state.jobs["run"].attempt) == ("placed", 1)
    assert state.jobs["next"].phase == "admitted"
    assert state.jobs["next"].reasons[0].code == queueing.RESERVED
    assert state.jobs["run"].kept_place is None  # placed again: it keeps nothing more


def test_admission_admits_the_job_back_before_one_that_waited_for_its_quota() -> None:
    # ``next`` (a higher priority, in the same queue of 8 GPUs) waited for the quota ``run``
    # held; the restart gives that quota back, and ``run`` takes it again.
    log = _stopped(_before(nominal=8, next_priority=100, next_admitted=False))
    events = admission.decide(log.fold(), log.time)
    assert [e.job_id for e in events if isinstance(e, JobRequeued)] == ["run"]
    [admitted] = [e for e in events if isinstance(e, JobsAdmitted)]
    assert [a.job_id for a in admitted.admissions] == ["run"]


def test_a_lost_node_keeps_no_place() -> None:
    log = _before().condition(N0, "lost").exited(N0, "run", code=143, stopped=True)
    state = log.fold()
    assert state.jobs["run"].phase == "interrupted" and state.jobs["run"].kept_place is None


def test_the_preemptor_simulates_the_job_back_first() -> None:
    # Both admitted, untried by the placer: the job back in its place goes first, as the
    # placer places it, so no stop is sought for the GPUs it is about to take.
    state = _back(_admission_cycle(_stopped(_before(next_priority=100)))).fold()
    turns = preemptor._Turns(state, state.time, by_form=False)
    assert [j.id for j in iter(turns.next, None)][:2] == ["run", "next"]


def test_a_worker_whose_gpu_left_keeps_no_place() -> None:
    # GPU 5 fell off the bus: NVML numbers 6 and 7 as 5 and 6. ``beside``'s worker had it, and
    # has no place left to keep; ``run``'s GPUs kept their indexes, and so does its place.
    inv = Cluster(1).nodes[0][1]
    rest = [g for g in inv.gpus if g.index != 5]
    gpus = tuple(msgspec.structs.replace(g, index=i) for i, g in enumerate(rest))
    state = _admission_cycle(_halves()).node(N0, msgspec.structs.replace(inv, gpus=gpus)).fold()
    assert state.jobs["run"].kept_place == on(N0, 0, 1, 2, 3, job_id="run")
    kept = state.jobs["beside"].kept_place
    assert kept is not None and kept.workers == ()


def _back_and_named() -> LogBuilder:
    """``run`` is back and admitted, its place (GPUs 2-3) free; ``low``, placed on GPUs 4-7 since
    the node came back, is checkpointing for ``run``: a preemption for it is under way."""
    log = _admission_cycle(_back(_on_two()))
    log.submit("bob", "low", job().gpus(4).estimate(3600.0)).accept("low", priority=-10).admit("low")
    log.place(on(N0, 4, 5, 6, 7, job_id="low")).started(N0, "low")
    return log.preempt("run", "low")


def test_a_job_back_in_place_and_named_by_a_stop_is_placed_on_its_place() -> None:
    # Both its kept place and the GPUs its victim frees were held for it: the kept place is
    # given back to it at its turn, not left out of the cycle for good.
    state = _back_and_named().fold()
    assert state.jobs["low"].phase == "checkpointing" and state.jobs["low"].preempted_for == "run"
    assert state.jobs["run"].phase == "admitted" and queueing.keeps_place(state.jobs["run"])
    assert _uuids(state) == {"run": [f"GPU-{N0}-02", f"GPU-{N0}-03"]}
