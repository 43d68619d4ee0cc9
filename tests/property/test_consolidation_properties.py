"""Consolidation, over generated fragmented clusters: whatever moves the preemptor proposes, the
fold takes, and once the moved jobs have stopped, admission and the placer give the waiting job
its room and every moved job a place again. Nothing else is submitted meanwhile: what a move
promises is what corral would do if nothing else changed."""

from __future__ import annotations

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from corral.events import routing
from corral.events.decisions import GpuClaim, JobsPlaced, PreemptionRequested
from corral.events.jobs import JobSpec, Resources
from corral.services.admission.decide import decide as admission
from corral.services.placer.decide import decide as placer
from corral.services.preemptor.decide import decide as preemptor
from tests.builders import TRAIN
from tests.unit.test_preemptor import World

GPUS = 8  # per node of the h100-8x profile


@st.composite
def fragmented(draw: st.DrawFn) -> tuple[World, str]:
    """Two to four 8-GPU nodes, each with one to three GPUs free and the rest held by jobs of 1,
    2 or 4 GPUs of two queues (some of a higher priority, some that may not be preempted), then
    one admitted job, of one worker or two, asking more GPUs per worker than any node has free
    but no more than all of them have, which the placer finds no room for."""
    nodes = draw(st.integers(2, 4))
    w = World(nodes=nodes).queue("a", nominal=64).queue("b", nominal=64)
    free: dict[str, int] = {}
    n = 0
    for i in range(nodes):
        node = f"node-{i:02d}"
        free[node] = draw(st.integers(1, 3))
        used = 0
        while used < GPUS - free[node]:
            size = draw(st.sampled_from([s for s in (1, 2, 4) if used + s <= GPUS - free[node]]))
            spec = JobSpec(
                queue=draw(st.sampled_from(("a", "b"))),
                resources=Resources(gpus=size),
                preemptible=draw(st.booleans()) or draw(st.booleans()),
                command=TRAIN,
            )
            claims = tuple(GpuClaim(g) for g in range(used, used + size))
            w.run(f"r{n}", spec, (node, claims), priority=draw(st.sampled_from((0, 0, 5))))
            w.wait(60)
            used += size
            n += 1
    w.wait(600)  # past any guard
    most, total = max(free.values()), sum(free.values())
    replicas = draw(st.sampled_from((1, 1, 2)))
    per_worker = draw(st.integers(most + 1, max(most + 1, min(GPUS, total // replicas))))
    spec = JobSpec(
        queue=draw(st.sampled_from(("a", "b"))),
        replicas=replicas,
        resources=Resources(gpus=per_worker),
        command=TRAIN,
    )
    w.submit("waiting", spec, priority=1)
    for e in admission(w.state, w.time):
        w.emit(routing.subject_of(e), e)
    placed = placer(w.state, w.time)
    assume(not any(isinstance(e, JobsPlaced) for e in placed))  # it waits for room
    for e in placed:
        w.emit(routing.subject_of(e), e)
    return w, "waiting"


def _settle(w: World) -> None:
    """Moved jobs stop; admission and the placer decide until nothing moves (no preemptor:
    nothing else is to be stopped)."""
    for job_id, job in list(w.state.jobs.items()):
        if job.phase == "checkpointing":
            w.stop(job_id)
    for _ in range(10):
        events = [*admission(w.state, w.time), *placer(w.state, w.time)]
        for e in events:
            w.emit(routing.subject_of(e), e)
        if not events:
            return


@settings(max_examples=300, deadline=None)
@given(fragmented())
def test_a_move_is_taken_and_gives_every_job_a_place(world: tuple[World, str]) -> None:
    w, beneficiary = world
    events = preemptor(w.state, w.time)
    moves = [e for e in events if isinstance(e, PreemptionRequested) and e.moves]
    for e in events:
        w.emit(routing.subject_of(e), e)  # the fold refuses nothing
    event("moves" if moves else "no moves")
    if not moves:
        return
    [move] = moves
    assert move.beneficiary == beneficiary
    moved = [v.job_id for v in move.victims]
    for job_id in moved:
        job = w.state.jobs[job_id]
        assert job.phase == "checkpointing" and job.priority <= 1
    _settle(w)
    for job_id in (beneficiary, *moved):
        job = w.state.jobs[job_id]
        assert job.phase == "placed" and job.held is not None, (job_id, job.phase, job.reasons)
