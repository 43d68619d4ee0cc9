"""Consolidation: an admitted job that waits only because the free GPUs are scattered over the
nodes gets room by moving preemptible work elsewhere (KAI's consolidation action). The
preemptor proposes a ``PreemptionRequested`` whose ``moves`` show the layout after it; the fold
checks that layout on the nodes as they stand (``moves.may_move``) and refuses any other.

The world: two 8-GPU nodes, queues ``a`` and ``b`` each within its nominal. On node-00, a1 holds
GPUs 0-3 and a2 GPUs 4-5; on node-01, a3 holds GPUs 0-5. Two GPUs are free on each node and b1,
admitted for 4 GPUs on one node, waits: no rule lets it stop queue a's work (a is within its
nominal), but a2 fits on node-01's free GPUs, and then b1 fits on node-00."""

from __future__ import annotations

import msgspec
import pytest

from corral.events import routing
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import GpuClaim, Placement, PreemptionRequested, Victim, WorkerSlot
from corral.events.jobs import AdmissionWithdrawn, JobSpec, Resources
from corral.events.nodes import NodeRegistered
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.projections import claims, moves
from corral.projections.fold import apply_event
from corral.projections.quota import ANY
from corral.projections.state import NodeState
from corral.services.admission.decide import decide as admission
from corral.services.agent.inventory import cluster
from corral.services.placer.decide import decide as placer
from corral.services.preemptor import consolidation
from corral.services.preemptor.decide import PreemptorConfig, decide, plan
from corral.services.preemptor.victims import Found, Pool, Simulation, admitted_target, commit
from tests.unit.test_preemptor import World

N0, N1 = "node-00", "node-01"
H100 = "H100-80GB"


def _spec(queue: str, gpus: int, **kw: object) -> JobSpec:
    return JobSpec(queue=queue, resources=Resources(gpus=gpus), **kw)  # type: ignore[arg-type]


def _gpus(*indexes: int) -> tuple[GpuClaim, ...]:
    return tuple(GpuClaim(i) for i in indexes)


def world(
    a2_priority: int = 0,
    a3_gpus: int = 6,
    a2: JobSpec | None = None,
    nominal: tuple[int, int] = (16, 16),
    cohort: bool = False,
    admitted: bool = True,
) -> World:
    """The module's world: queues ``a`` and ``b`` (their nominal quota, in one cohort or none);
    a1 and a2 (``a2``: its spec, a 2-GPU job of ``a`` by default) on node-00, a3 on node-01; b1
    admitted and waiting for room (``admitted`` False: only queued)."""
    w = World(nodes=2)
    if cohort:
        w.cohort("org")
    w.queue("a", nominal=nominal[0], cohort="org" if cohort else None)
    w.queue("b", nominal=nominal[1], cohort="org" if cohort else None)
    a2 = a2 or _spec("a", 2)
    w.run("a1", _spec("a", 4), (N0, _gpus(0, 1, 2, 3)))
    w.run("b2" if a2.queue == "b" else "a2", a2, (N0, _gpus(4, 5)), priority=a2_priority)
    w.run("a3", _spec("a", a3_gpus), (N1, _gpus(*range(a3_gpus))))
    if admitted:
        w.waiting("b1", _spec("b", 4))
    else:
        w.submit("b1", _spec("b", 4))
    return w.wait(600)  # past any guard


def _move(
    w: World, victims: tuple[str, ...], moves: tuple[Placement, ...], beneficiary: str = "b1"
) -> str | None:
    """Fold a consolidation; the fold's rejection message, or None if it took it."""
    vs = tuple(Victim(v, w.state.jobs[v].attempt) for v in victims)
    body = PreemptionRequested(
        based_on=w.seq, now=w.time, beneficiary=beneficiary, victims=vs, deadline=w.time + 30, moves=moves
    )
    before = w.state.rejected_total
    w.seq += 1
    w.time += 1.0
    apply_event(w.state, w.seq, subj.decision("preemptor"), body, w.time, None)
    return w.state.rejections[-1].message if w.state.rejected_total > before else None


def _at(w: World, job_id: str, node: str, *gpus: int) -> Placement:
    return Placement(job_id, w.state.jobs[job_id].attempt, (WorkerSlot(0, node, _gpus(*gpus)),))


def _emit_all(w: World, events: list[Event]) -> None:
    for e in events:
        w.emit(routing.subject_of(e), e)


def test_a_job_waiting_only_for_scattered_gpus_gets_room_by_moving_a_smaller_one() -> None:
    w = world()
    [p] = plan(w.state, w.time)
    assert [v.job_id for v in p.victims] == ["a2"]
    assert [m.job_id for m in p.moves] == ["b1", "a2"]
    assert p.moves[0] == p.placement and {s.node for s in p.placement.workers} == {N0}
    assert {s.node for s in p.moves[1].workers} == {N1}
    [event] = decide(w.state, w.time)
    assert isinstance(event, PreemptionRequested) and event.moves == p.moves
    w.emit(subj.decision("preemptor"), event)  # the fold takes it
    a2 = w.state.jobs["a2"]
    assert a2.phase == "checkpointing"
    assert a2.reasons[0].message == "moved to make room for b1"
    # The agents stop it; admission requeues and admits it again; the placer places both.
    w.stop("a2")
    for _ in range(3):
        _emit_all(w, admission(w.state, w.time))
        _emit_all(w, placer(w.state, w.time))
    b1, a2 = w.state.jobs["b1"], w.state.jobs["a2"]
    assert b1.phase == "placed" and b1.held is not None
    assert {s.node for s in b1.held.workers} == {N0}
    assert a2.phase == "placed" and a2.held is not None and {s.node for s in a2.held.workers} == {N1}
    assert a2.attempt == 1  # stopped and placed again: a restart from its checkpoint
    assert plan(w.state, w.time) == []


def test_without_its_moves_the_same_stop_is_refused() -> None:
    """Queue a is within its nominal: no preemption rule lets b1 stop a2. Only the move does."""
    w = world()
    why = _move(w, ("a2",), ())
    assert why is not None and "a2" in why


def test_the_fold_takes_the_layout_the_preemptor_would_name() -> None:
    w = world()
    assert _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7))) is None
    assert w.state.jobs["a2"].phase == "checkpointing"


def _at_b1(w: World) -> Placement:
    return _at(w, "b1", N0, 4, 5, 6, 7)


@pytest.mark.parametrize(
    ("case", "victims", "moves", "refusal"),
    [
        # a2 put on GPUs a3 holds
        ("onto held GPUs", ("a2",), lambda w: (_at_b1(w), _at(w, "a2", N1, 0, 1)), "do not fit"),
        # b1 put where a1 still runs
        (
            "beneficiary onto held GPUs",
            ("a2",),
            lambda w: (_at(w, "b1", N0, 0, 1, 2, 3), _at(w, "a2", N1, 6, 7)),
            "do not fit",
        ),
        # a victim without a new place
        ("victim left out", ("a2",), lambda w: (_at_b1(w),), "one for each victim"),
        # a layout that does not start with the beneficiary
        (
            "beneficiary not first",
            ("a2",),
            lambda w: (_at(w, "a2", N1, 6, 7), _at_b1(w)),
            "one for each victim",
        ),
        # a careless or hostile layout: a node nobody registered, a victim placed twice
        ("unknown node", ("a2",), lambda w: (_at_b1(w), _at(w, "a2", "node-99", 0, 1)), "do not fit"),
        (
            "victim twice",
            ("a2",),
            lambda w: (_at_b1(w), _at(w, "a2", N1, 6, 7), _at(w, "a2", N1, 6, 7)),
            "one for each victim",
        ),
        # the beneficiary's placement of another attempt than the one it waits at
        (
            "beneficiary's attempt",
            ("a2",),
            lambda w: (Placement("b1", 1, _at_b1(w).workers), _at(w, "a2", N1, 6, 7)),
            "one for each victim",
        ),
        # a2 back on its own GPUs
        (
            "moved to where it is",
            ("a2",),
            lambda w: (_at(w, "b1", N1, 6, 7, 0, 1), _at(w, "a2", N0, 4, 5)),
            "where it is",
        ),
    ],
)
def test_the_fold_refuses_a_layout_that_does_not_hold(
    case: str, victims: tuple[str, ...], moves: object, refusal: str
) -> None:
    w = world()
    why = _move(w, victims, moves(w))  # type: ignore[operator]
    assert why is not None and refusal in why, case
    assert w.state.jobs["a2"].phase == "running"


def test_a_higher_priority_job_is_not_moved_for_a_lower_one() -> None:
    w = world(a2_priority=10)
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "higher priority" in why
    assert plan(w.state, w.time) == []


def test_a_job_that_may_not_be_preempted_is_not_moved() -> None:
    w = world(a2=_spec("a", 2, preemptible=False))
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "may not be preempted" in why


def test_a_queued_job_gets_no_move() -> None:
    """A move gives nobody quota: a job that waits for quota is not what it is for."""
    w = world(admitted=False)
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "admission held" in why


def test_nothing_is_moved_where_the_moved_job_would_not_fit_elsewhere() -> None:
    w = world(a3_gpus=7)  # one GPU free on node-01: a2's two do not fit there
    assert plan(w.state, w.time) == []


def test_an_operator_may_turn_consolidation_off() -> None:
    w = world()
    assert plan(w.state, w.time, PreemptorConfig(max_moved=0)) == []
    assert plan(w.state, w.time, PreemptorConfig(max_moved=1)) != []


def test_a_job_that_borrows_does_not_move_a_lenders_work() -> None:
    """A lender's work within its nominal is not restarted for work the lenders may take back: b1
    holds 2 GPUs of its own nominal and borrows 2 of a's. Where its own queue's b2 stands in a2's place
    (b's nominal held by b2, all of b1 borrowed), b2 is moved for it."""
    w = world(nominal=(14, 2), cohort=True)
    assert plan(w.state, w.time) == []
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "borrows" in why
    # The same with b's own job where a2 was: b2 is moved.
    w = world(a2=_spec("b", 2), nominal=(14, 2), cohort=True)
    [p] = plan(w.state, w.time)
    assert [v.job_id for v in p.victims] == ["b2"]


def test_one_move_at_a_time() -> None:
    """Two jobs wait for room that moves would make: one move is proposed; the next waits until
    it is done (the moved job placed again and the room taken), so each is judged on the nodes
    as they will be: while b1 waits and a2 is admitted again, a2's new GPUs look free and are
    not."""
    w = World(nodes=3).queue("a", nominal=24).queue("b", nominal=16)
    w.run("a1", _spec("a", 4), (N0, _gpus(0, 1, 2, 3)))
    w.run("a2", _spec("a", 2), (N0, _gpus(4, 5)))
    w.run("a3", _spec("a", 6), (N1, _gpus(*range(6))))
    w.run("a4", _spec("a", 6), ("node-02", _gpus(*range(6))))
    w.waiting("b1", _spec("b", 4))
    w.waiting("b2", _spec("b", 4))
    w.wait(60)  # within the placement timeout: both keep their admission
    [p] = plan(w.state, w.time)
    assert p.beneficiary == "b1" and p.moves
    w.emit(subj.decision("preemptor"), decide(w.state, w.time)[0])
    assert plan(w.state, w.time + 1) == []  # a2 is still checkpointing
    w.stop("a2")
    _emit_all(w, admission(w.state, w.time))  # a2 requeued and admitted again; nobody placed yet
    assert w.state.jobs["a2"].phase == "admitted" and w.state.jobs["b1"].phase == "admitted"
    assert moves.move_under_way(w.state) == "the room made for b1 is not taken yet"
    # a4 to node-01's GPUs 6-7 (a2's new place) for b2 on node-02: refused while a2 is not placed.
    b2 = _at(w, "b2", "node-02", 4, 5, 6, 7)
    why = _move(w, ("a4",), (b2, _at(w, "a4", N1, 6, 7)), beneficiary="b2")
    assert why is not None and "under way" in why
    w.place("b1", (N0, _gpus(4, 5, 6, 7)))  # b1 takes its room; a2 is not placed yet
    assert moves.move_under_way(w.state) == "a2, stopped for b1, is not placed again yet"
    _emit_all(w, placer(w.state, w.time))  # a2 takes its new place
    assert w.state.jobs["a2"].held is not None
    assert moves.move_under_way(w.state) is None  # the next move may come


def test_a_move_needs_every_victim_where_the_beneficiary_goes() -> None:
    """A job on a node the beneficiary does not use makes it no room: the fold refuses to stop
    it, even when the layout fits."""
    w = world(a3_gpus=6)
    a3 = Placement("a3", 0, (WorkerSlot(0, N1, _gpus(1, 2, 3, 4, 5, 6)),))
    why = _move(w, ("a2", "a3"), (_at_b1(w), _at(w, "a2", N1, 0, 7), a3))
    assert why is not None and "no node b1 is placed on" in why


def test_the_moves_a_record_may_make_are_bounded() -> None:
    """Two 1-GPU jobs must move for b1's four GPUs on node-00: with at most one move, nothing."""
    w = World(nodes=2).queue("a", nominal=16).queue("b", nominal=16)
    w.run("a1", _spec("a", 4), (N0, _gpus(0, 1, 2, 3)))
    w.run(
        "a2",
        _spec("a", 1),
        (
            N0,
            _gpus(
                4,
            ),
        ),
    )
    w.run(
        "a5",
        _spec("a", 1),
        (
            N0,
            _gpus(
                5,
            ),
        ),
    )
    w.run("a3", _spec("a", 6), (N1, _gpus(*range(6))))
    w.waiting("b1", _spec("b", 4))
    w.wait(600)
    assert plan(w.state, w.time, PreemptorConfig(max_moved=1)) == []
    [p] = plan(w.state, w.time, PreemptorConfig(max_moved=2))
    assert sorted(v.job_id for v in p.victims) == ["a2", "a5"] and len(p.moves) == 3


def test_a_job_its_class_guards_is_not_moved() -> None:
    """The anti-thrash guards hold for moves as for any stop: a2 has run 10 minutes of the hour
    its class lets it run before anyone stops it."""
    w = World(nodes=2).queue("a", nominal=16).queue("b", nominal=16)
    w.priority_class("guarded", 0, min_runtime_s=3600.0)
    w.run("a1", _spec("a", 4), (N0, _gpus(0, 1, 2, 3)))
    w.run("a2", _spec("a", 2, priority_class="guarded"), (N0, _gpus(4, 5)))
    w.run("a3", _spec("a", 6), (N1, _gpus(*range(6))))
    w.waiting("b1", _spec("b", 4))
    w.wait(600)
    assert plan(w.state, w.time) == []
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "a2" in why


def test_two_jobs_do_not_take_from_each_other_twice_by_moves_either() -> None:
    """Once a2 was stopped for b1 (or b1 for a2), a2 is not moved for b1."""
    w = world()
    a2, b1 = w.state.jobs["a2"], w.state.jobs["b1"]
    a2.stopped_for = (("b1", b1.priority_seq, a2.priority_seq),)  # as a stop for b1 left it
    assert plan(w.state, w.time) == []
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "not again between the two" in why


def test_the_search_checks_the_moved_jobs_places_with_the_folds_arithmetic() -> None:
    """``Simulation.gate`` takes the moved jobs' new places too: one that collides with work
    that stays is refused before it is proposed."""
    w = world()
    sim = Simulation(w.state, PreemptorConfig().placer, w.time)
    target = admitted_target(sim.state, sim.ledger, w.state.jobs["b1"])
    a2 = w.state.jobs["a2"]
    mover = admitted_target(sim.state, sim.ledger, a2)
    fits = Found([a2], [], _at_b1(w), moves=[(mover, _at(w, "a2", N1, 6, 7))])
    collides = Found([a2], [], _at_b1(w), moves=[(mover, _at(w, "a2", N1, 0, 1))])
    assert sim.gate(target, collides) is not None
    assert sim.gate(target, fits) is None


def test_a_move_ends_the_cycle() -> None:
    """The moved job gave its quota back in the cycle's simulation and is to take it again: no
    later beneficiary is searched for on that cycle. c9 (queue c at its nominal) could stop c0,
    its own lower-priority job, without any move; it is served on the next cycle."""
    w = World(nodes=3).queue("a", nominal=24).queue("b", nominal=16).queue("c", nominal=2)
    w.run("a1", _spec("a", 4), (N0, _gpus(0, 1, 2, 3)))
    w.run("a2", _spec("a", 2), (N0, _gpus(4, 5)))
    w.run("a3", _spec("a", 6), (N1, _gpus(*range(6))))
    w.run("a4", _spec("a", 6), ("node-02", _gpus(*range(6))))
    w.run("c0", _spec("c", 2), ("node-02", _gpus(6, 7)), priority=-1)
    w.waiting("b1", _spec("b", 4))
    w.submit("c9", _spec("c", 2))
    w.wait(600)
    [p] = plan(w.state, w.time)
    assert p.beneficiary == "b1" and [v.job_id for v in p.victims] == ["a2"] and p.moves
    _emit_all(w, decide(w.state, w.time))
    [q] = plan(w.state, w.time)
    assert q.beneficiary == "c9" and [v.job_id for v in q.victims] == ["c0"] and not q.moves


def test_a_refused_gate_puts_every_moved_job_back() -> None:
    """``commit`` of a consolidation the fold's arithmetic refuses leaves the simulation as it
    was: the beneficiary unplaced, the victims back, and every moved job off its new place."""
    w = World(nodes=2).queue("a", nominal=16).queue("b", nominal=16)
    w.run("a1", _spec("a", 4), (N0, _gpus(0, 1, 2, 3)))
    w.run("a2", _spec("a", 1), (N0, _gpus(4)))
    w.run("a5", _spec("a", 1), (N0, _gpus(5)))
    w.run("a3", _spec("a", 6), (N1, _gpus(*range(6))))
    w.waiting("b1", _spec("b", 4))
    w.wait(600)
    sim = Simulation(w.state, PreemptorConfig().placer, w.time)
    pool = Pool(w.state, sim.ledger, w.time)
    target = admitted_target(sim.state, sim.ledger, w.state.jobs["b1"])

    def free() -> dict[tuple[str, str], int]:
        return {(n, m): sim.snap.free_whole_count(n, m) for n in (N0, N1) for m in sim.snap.models()}

    before = free()
    found = consolidation.find(sim, pool, target, 4)
    assert found is not None and sorted(j.id for j in found.whole) == ["a2", "a5"] and len(found.moves) == 2
    assert free() != before
    # GPUs 6 and 7 of node-01, where the moved jobs go, taken behind the search's back.
    taken = sim.scratch.nodes[N1] = msgspec.convert(msgspec.to_builtins(w.state.nodes[N1]), NodeState)
    for g in taken.gpus[6:]:
        g.holders, g.used_milli = {"x": 1000}, 1000
    assert commit(sim, target, found) is not None
    assert free() == before
    assert sim.taken == set()


def test_a_beneficiary_that_still_holds_gpus_gets_no_move() -> None:
    """A move gives room to a job that holds none: one still holding GPUs (of an attempt whose
    workers have not all exited, as the state is set here) is refused."""
    w = world()
    b1 = w.state.jobs["b1"]
    b1.held = Placement("b1", b1.attempt, (WorkerSlot(0, N1, _gpus(6)),))
    why = _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7)))
    assert why is not None and "does not wait for room" in why
    assert w.state.jobs["a2"].phase == "running"


def test_the_place_a_move_names_is_held_for_the_moved_job() -> None:
    """While a2 checkpoints and until it is placed again, node-01's GPUs 6-7 (where its move
    puts it) go to no one else: c1, admitted meanwhile for two GPUs, waits rather than take them
    and leave a2 nowhere to go."""
    w = world()
    _emit_all(w, decide(w.state, w.time))
    a2 = w.state.jobs["a2"]
    assert a2.phase == "checkpointing" and a2.moved_to == _at(w, "a2", N1, 6, 7)
    w.submit("c1", _spec("a", 2)).admit("c1")
    _emit_all(w, placer(w.state, w.time))
    assert w.state.jobs["c1"].phase == "admitted"  # b1's room on node-00, a2's on node-01
    w.stop("a2")
    for _ in range(3):
        _emit_all(w, admission(w.state, w.time))
        _emit_all(w, placer(w.state, w.time))
    a2, b1 = w.state.jobs["a2"], w.state.jobs["b1"]
    assert a2.phase == "placed" and a2.held == Placement("a2", 1, _at(w, "a2", N1, 6, 7).workers)
    assert a2.moved_to is None  # placed again: nothing is held for it any more
    assert b1.phase == "placed" and claims.nodes_of(b1.held) == {N0}
    assert w.state.jobs["c1"].phase == "admitted"


def test_a_moved_job_lands_on_the_gpus_its_move_named() -> None:
    """With node-01's GPUs 4-7 free, a move of a2 to 6-7 puts it on 6-7 (the layout the fold
    checked), not on 4-5, where the search would put a 2-GPU job on an idle island."""
    w = world(a3_gpus=4)
    assert _move(w, ("a2",), (_at_b1(w), _at(w, "a2", N1, 6, 7))) is None
    w.stop("a2")
    for _ in range(3):
        _emit_all(w, admission(w.state, w.time))
        _emit_all(w, placer(w.state, w.time))
    a2 = w.state.jobs["a2"]
    assert a2.phase == "placed" and a2.held == Placement("a2", 1, _at(w, "a2", N1, 6, 7).workers)


def test_a_moved_job_waiting_for_quota_holds_no_gpus() -> None:
    """Requeued and not admitted again (its quota taken meanwhile), a moved job waits for quota:
    the GPUs its move named are not held for it, and another job may be placed there."""
    w = world()
    _emit_all(w, decide(w.state, w.time))
    w.stop("a2").requeue("a2")
    assert w.state.jobs["a2"].phase == "queued" and w.state.jobs["a2"].moved_to is not None
    w.submit("c1", _spec("b", 2)).admit("c1")
    _emit_all(w, placer(w.state, w.time))
    c1 = w.state.jobs["c1"]
    assert c1.phase == "placed" and claims.nodes_of(c1.held) == {N1}


def test_a_moved_job_placed_nowhere_for_the_timeout_holds_its_place_no_longer() -> None:
    """Admitted again and then withdrawn (placed nowhere for the placement timeout), a moved job
    has its moved place held no longer, as a job back from a planned shutdown has its kept place
    held no longer: admitted once more, it is placed where there is room, and the GPUs its move
    named go to whoever fits there. Held again, they would stand idle behind a place the job
    could not take the first time."""
    w = world()
    _emit_all(w, decide(w.state, w.time))
    w.stop("a2").requeue("a2").admit("a2")
    a2 = w.state.jobs["a2"]
    assert a2.phase == "admitted" and a2.moved_to is not None
    timeout = Reason("placement-timeout", "placed nowhere for the timeout")
    _emit_all(w, [AdmissionWithdrawn(job_id="a2", attempt=a2.attempt, reason=timeout, admit_after=w.time)])
    a2 = w.state.jobs["a2"]
    assert a2.phase == "queued" and a2.moved_to is None
    assert "a2" not in w.state.places_held
    w.submit("c1", _spec("b", 2)).admit("c1")
    _emit_all(w, placer(w.state, w.time))
    c1 = w.state.jobs["c1"]
    assert c1.phase == "placed" and claims.nodes_of(c1.held) == {N1}


def test_no_gang_search_where_the_free_gpus_add_up_to_less_than_the_gang() -> None:
    """A move frees nothing: where all free GPU together is less than the gang asks, no
    consolidation is searched for (a gang of 1,024 slivers of a GPU on a full cluster cost
    seconds of searches a cycle). Where it adds up, the search runs."""
    w = World(nodes=2).queue("a", nominal=16).queue("b", nominal=16)
    w.run("a1", _spec("a", 8), (N0, _gpus(*range(8))))
    w.run("a2", _spec("a", 7), (N1, _gpus(*range(7))))
    slivers = JobSpec(queue="b", replicas=1024, resources=Resources(gpus=1, gpu_milli=1, cpu_milli=10))
    w.waiting("b1", slivers)
    w.wait(600)
    sim = Simulation(w.state, PreemptorConfig().placer, w.time)
    searched: list[object] = []
    place = sim.place
    sim.place = lambda t: searched.append(t) or place(t)  # type: ignore[method-assign]
    target = admitted_target(sim.state, sim.ledger, w.state.jobs["b1"])
    assert not consolidation.room_anywhere(sim, target)
    assert consolidation.find(sim, Pool(w.state, sim.ledger, w.time), target, 4) is None
    assert searched == []
    w2 = world()
    sim2 = Simulation(w2.state, PreemptorConfig().placer, w2.time)
    assert consolidation.room_anywhere(sim2, admitted_target(sim2.state, sim2.ledger, w2.state.jobs["b1"]))


def test_a_move_may_free_gpus_of_the_jobs_model_by_moving_work_onto_another_model() -> None:
    """v takes any model and holds 4 of the H100 node's GPUs; b needs the 8 H100 GPUs of one
    node, and the A100 node is empty: moving v there makes b room, though no H100 GPU is free
    enough. The room check counts the free GPUs of every model."""
    w = World(nodes=0)
    for name, inv in cluster(2, "mixed"):  # node-00 8 H100, node-01 8 A100
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    q = QueueSpec("a", quotas={H100: Quota(8), ANY: Quota(8)})
    w.emit(subj.admin("queue"), ApplyQueue(queue=q), subj.ADMIN)
    w.run("v", JobSpec(queue="a", resources=Resources(gpus=4)), (N0, _gpus(0, 1, 2, 3)))
    w.waiting("b", JobSpec(queue="a", resources=Resources(gpus=8, gpu_models=(H100,))))
    w.wait(600)
    [p] = plan(w.state, w.time)
    assert p.beneficiary == "b" and [v.job_id for v in p.victims] == ["v"]
    assert [(m.job_id, m.workers[0].node) for m in p.moves] == [("b", N0), ("v", N1)]
