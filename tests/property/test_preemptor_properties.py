"""Preemptor properties over random clusters, queues, priority classes and running work: a
preemption never stops a job of equal or higher priority in the beneficiary's queue, nor one that
may not be preempted, nor one of another queue unless that queue borrows in the beneficiary's
cohort tree (then by reclaim, borrowing over a lower priority, or fair sharing: Kueue's
strategies on ``projections.preemption.Shares``); the beneficiary always fits once its victims
are gone (so nothing is stopped for a job that would still not fit), and no two beneficiaries
are offered the same GPUs; the fold accepts every proposal; the same state gives the same
decision. Two cycles run, the second with the first one's preemptions under way. Then, on full
cohorts whose nominal quotas add up to the capacity, an urgent queued job: it gets one victim
exactly when one may be stopped for it (borrowers first), and once that victim stops, admission
admits it and the placer places it on the freed GPUs, with the quota the fold keeps agreeing
with the jobs throughout."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import msgspec
from hypothesis import event, given, settings
from hypothesis import strategies as st

from corral.events import routing
from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
    Unschedulable,
    Victim,
    WorkerSlot,
)
from corral.events.jobs import JobAccepted, JobsAdmitted, JobSpec, Resources, SubmitJob, Topology
from corral.events.nodes import NodeRegistered, WorkerExited, WorkerStarted
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections import claims, indexes, quota
from corral.projections.fold import apply_event
from corral.projections.placement.stack import PlacerConfig
from corral.projections.preemption import (
    Shares,
    below_nominal,
    fair_allows,
    least_given,
    planning_ledger,
    protected,
)
from corral.projections.quota import ANY, Ledger
from corral.projections.state import WHOLE, JobState, State
from corral.services.admission.decide import decide as admission
from corral.services.agent.inventory import cluster
from corral.services.placer.decide import decide as placer
from corral.services.preemptor.decide import PreemptorConfig, beneficiaries, decide, plan
from corral.services.preemptor.victims import (
    Simulation,
    admitted_target,
    charge_of,
    preemptible,
    queued_target,
)
from tests.builders import TRAIN

CLASSES = {
    "low": PriorityClassSpec("low", 0),
    "mid": PriorityClassSpec("mid", 5, min_runtime_s=120.0, max_preemptions_per_hour=2),
    "high": PriorityClassSpec("high", 10),
    "prod": PriorityClassSpec("prod", 20, preemptible=False),
}
QUEUES = ("team-a", "team-b", "team-c")  # a and b share cohort org; c is alone


class World:
    def __init__(self) -> None:
        self.state = State()
        self.seq = 0
        self.time = 1000.0

    def emit(self, subject: str, body: Event, tenant: str | None = None, dt: float = 1.0) -> None:
        before = self.state.rejected_total
        self.seq += 1
        self.time += dt
        apply_event(self.state, self.seq, subject, body, self.time, tenant)
        assert self.state.rejected_total == before, self.state.rejections[-1]


job_shapes = st.tuples(
    st.sampled_from(QUEUES),
    st.sampled_from(sorted(CLASSES)),
    st.sampled_from([1, 1, 2, 4, 8]),  # GPUs per worker
    st.integers(1, 4),  # replicas
    st.booleans(),  # preemptible in the spec
    st.booleans(),  # elastic (min 1)
    st.floats(0, 900),  # seconds before it is submitted
)

urgent_shapes = st.tuples(
    st.sampled_from(QUEUES),
    st.just("high"),
    st.sampled_from([4, 8]),
    st.just(1),
    st.just(True),
    st.just(False),
    st.just(0.0),
)


policies = st.builds(
    PreemptionPolicy,
    within_queue=st.sampled_from(["never", "lower-priority", "lower-or-newer-equal-priority"]),
    reclaim_within_cohort=st.sampled_from(["never", "lower-priority", "any"]),
    borrow_within_cohort=st.sampled_from(["never", "lower-priority"]),
    borrow_priority_threshold=st.sampled_from([None, 0, 5]),
    fair_sharing=st.sampled_from(
        [
            (),
            ("less-than-or-equal-to-final-share",),
            ("less-than-or-equal-to-final-share", "less-than-initial-share"),
        ]
    ),
)


def org_world(nodes: int) -> World:
    """``nodes`` 8-GPU H100 nodes, the priority classes and the cohort ``org``: where each
    drawn world starts."""
    w = World()
    for name, inv in cluster(nodes, "h100-8x"):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    for pc in CLASSES.values():
        w.emit(subj.admin("pc"), ApplyPriorityClass(priority_class=pc), subj.ADMIN)
    w.emit(subj.admin("cohort"), ApplyCohort(cohort=CohortSpec("org")), subj.ADMIN)
    return w


@st.composite
def worlds(draw: st.DrawFn) -> World:
    w = org_world(draw(st.integers(1, 2)))
    for q in QUEUES:
        cohort = "org" if q != "team-c" else None
        nominal = draw(st.integers(0, 24))
        qspec = QueueSpec(name=q, cohort=cohort, quotas={ANY: Quota(nominal)}, preemption=draw(policies))
        w.emit(subj.admin("queue"), ApplyQueue(queue=qspec), subj.ADMIN)
    ledger = Ledger.from_state(w.state)
    # Urgent work arriving last, on a cluster the rest has likely filled.
    shapes = draw(st.lists(job_shapes, min_size=6, max_size=16)) + draw(st.lists(urgent_shapes, max_size=2))
    for i, (q, pc, per, n, ok, elastic, dt) in enumerate(shapes):
        jid = f"j{i:02d}"
        spec = JobSpec(
            queue=q,
            priority_class=pc,
            replicas=n,
            min_replicas=1 if elastic else None,
            resources=Resources(gpus=per),
            preemptible=ok,
            grace_seconds=float(10 * (i % 4)),
            command=TRAIN,
        )
        _start(w, draw, ledger, jid, spec, dt, CLASSES[pc].value)
    w.time += draw(st.floats(0, 600))
    return w


def _start(w: World, draw: st.DrawFn, ledger: Ledger, jid: str, spec: JobSpec, dt: float, prio: int) -> None:
    """Submit ``jid``; admit and place it if quota (``ledger``) and GPUs allow, else it waits."""
    w.emit(subj.request("t", "submit"), SubmitJob(request_id=jid, job=spec), "t", dt)
    w.emit(subj.job(jid), JobAccepted(job_id=jid, priority=prio))
    job = w.state.jobs[jid]
    adm = quota.admission(w.state.queues[spec.queue], job)
    if ledger.check(job, adm) is not None:
        return  # waits in its queue: perhaps for quota others borrow
    ledger.hold_admission(job, adm)
    w.emit(subj.decision("admission"), JobsAdmitted(based_on=w.seq, now=w.time, admissions=(adm,)))
    slots = _first_fit(w.state, spec.replicas, spec.resources.gpus)
    if slots is None:
        helps = Reason("gpus", "no free GPUs", True)
        body = JobsUnschedulable(based_on=w.seq, now=w.time, jobs=(Unschedulable(jid, 0, (helps,)),))
        w.emit(subj.decision("placer"), body)
        return
    p = Placement(jid, 0, slots)
    w.emit(subj.decision("placer"), JobsPlaced(based_on=w.seq, now=w.time, placements=(p,)))
    if draw(st.booleans()):
        for s in slots:
            w.emit(subj.node(s.node), WorkerStarted(node=s.node, job_id=jid, attempt=0, rank=s.rank))


@st.composite
def lender_worlds(draw: st.DrawFn) -> World:
    """Two 8-GPU nodes; team-a (a drawn policy) lends to team-b, which runs borrowers of drawn
    priorities first, some elastic; then team-a's low-priority work; then team-a's urgent job (priority 10)
    of a size within team-a's nominal, which waits."""
    w = World()
    for name, inv in cluster(2, "h100-8x"):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    for pc in CLASSES.values():
        w.emit(subj.admin("pc"), ApplyPriorityClass(priority_class=pc), subj.ADMIN)
    w.emit(subj.admin("cohort"), ApplyCohort(cohort=CohortSpec("org")), subj.ADMIN)
    b_nominal = draw(st.integers(0, 8))
    for q, nominal, pol in (
        ("team-a", 16 - b_nominal, draw(policies)),
        ("team-b", b_nominal, PreemptionPolicy()),
    ):
        qspec = QueueSpec(name=q, cohort="org", quotas={ANY: Quota(nominal)}, preemption=pol)
        w.emit(subj.admin("queue"), ApplyQueue(queue=qspec), subj.ADMIN)
    ledger = Ledger.from_state(w.state)
    shapes = [
        ("team-b", pc, n, elastic)
        for pc, n, elastic in draw(
            st.lists(
                st.tuples(st.sampled_from(sorted(CLASSES)), st.sampled_from([1, 2, 4, 8]), st.booleans()),
                min_size=1,
                max_size=5,
            )
        )
    ]
    shapes += [("team-a", "low", n, False) for n in draw(st.lists(st.sampled_from([1, 2, 4]), max_size=4))]
    for i, (q, pc, n, elastic) in enumerate(shapes):
        # An elastic borrower: ``n`` one-GPU workers, at least one.
        spec = JobSpec(
            queue=q,
            priority_class=pc,
            replicas=n if elastic else 1,
            min_replicas=1 if elastic else None,
            resources=Resources(gpus=1 if elastic else n),
            command=TRAIN,
        )
        _start(w, draw, ledger, f"j{i:02d}", spec, 1.0, CLASSES[pc].value)
    w.time += 600.0  # past every class's guards
    spec = JobSpec(
        queue="team-a",
        priority_class="high",
        resources=Resources(gpus=draw(st.sampled_from([2, 4, 8]))),
        command=TRAIN,
    )
    _start(w, draw, ledger, "urgent", spec, 1.0, CLASSES["high"].value)
    return w


def _first_fit(
    state: State, replicas: int, per: int, model: str | None = None
) -> tuple[WorkerSlot, ...] | None:
    """Free GPUs for ``replicas`` workers of ``per`` GPUs each (of ``model``, if named), first fit."""
    taken: dict[str, set[int]] = {}
    slots = []
    for rank in range(replicas):
        for name, node in state.nodes.items():
            free = [
                g.info.index
                for g in node.gpus
                if not g.holders
                and (model is None or g.info.model == model)
                and g.info.index not in taken.get(name, set())
            ]
            if len(free) >= per:
                taken.setdefault(name, set()).update(free[:per])
                slots.append(WorkerSlot(rank, name, tuple(GpuClaim(g) for g in free[:per])))
                break
        else:
            return None
    return tuple(slots)


def check_cycle(state: State, now: float, config: PreemptorConfig) -> list[Event]:
    plans = plan(state, now, config)
    events = decide(state, now, config)
    # Deterministic: again, and on a copy.
    assert decide(state, now, config) == events
    assert decide(copy.deepcopy(state), now, config) == events
    preemptions = [e for e in events if isinstance(e, PreemptionRequested)]
    # A plan's whole stops, in one record or in two around another queue's shrinks.
    proposed: dict[str, list[Victim]] = {}
    for e in preemptions:
        proposed.setdefault(e.beneficiary, []).extend(e.victims)
    expected = [(p.beneficiary, set(p.victims)) for p in plans if p.victims]
    assert [(b, set(vs)) for b, vs in proposed.items()] == expected
    assert all(len(vs) == len(set(vs)) for vs in proposed.values())
    stopped: set[str] = set()
    # Quota as the fold reads it record by record: the stops under way done, then each plan's
    # victims gone and its queued beneficiary admitted.
    room = planning_ledger(state)
    for p in plans:
        before_record = copy.deepcopy(room)
        b = state.jobs[p.beneficiary]
        bq = b.spec.queue
        policy = state.queues[bq].preemption
        assert p.victims or p.shrinks
        lent = {
            v.job_id: room.used(state.jobs[v.job_id].spec.queue, ANY)
            > room.nominal(state.jobs[v.job_id].spec.queue, ANY)
            for v in p.victims
        }
        need = _need(state, b) if b.phase == "queued" else 0
        fair = _shares_fairly(state, room, now, p.victims, b, need)  # read before the record
        for v in p.victims:
            job = state.jobs[v.job_id]
            assert v.attempt == job.attempt and job.phase in ("placed", "starting", "running")
            assert preemptible(state, job)
            assert job.id not in stopped  # never a victim twice
            stopped.add(job.id)
            for key, milli in quota.holding(job):
                room.charge(job.spec.queue, key, -milli)
        for s in p.shrinks:
            elastic = state.jobs[s.job_id]
            assert elastic.admission is not None
            for key, milli in quota.holding(elastic):
                room.charge(
                    elastic.spec.queue,
                    key,
                    -milli * (elastic.admission.replicas - s.replicas) // elastic.admission.replicas,
                )
        reclaims = room.used(bq, ANY) + need <= room.nominal(bq, ANY)  # with every victim gone
        if p.moves:
            # A consolidation: an admitted beneficiary waiting for room, its victims of no higher
            # priority, each moved elsewhere; a borrower's only of its own or borrowing queues.
            assert b.phase == "admitted" and b.held is None and not p.shrinks
            assert [m.job_id for m in p.moves] == [b.id, *(m.job_id for m in p.moves[1:])]
            assert p.moves[0] == p.placement
            assert sorted(m.job_id for m in p.moves[1:]) == sorted(v.job_id for v in p.victims)
            borrows = before_record.used(bq, ANY) > before_record.nominal(bq, ANY)
            for v in p.victims:
                job = state.jobs[v.job_id]
                q = job.spec.queue
                assert job.priority <= b.priority
                assert not borrows or q == bq or before_record.used(q, ANY) > before_record.nominal(q, ANY)
            continue
        for v in p.victims:
            job = state.jobs[v.job_id]
            lower = job.priority < b.priority
            if job.spec.queue == bq:
                assert _within_allows(state, job, b)
                continue
            # Another queue of the beneficiary's cohort (flat here) that borrows: the policy lets
            # the beneficiary take back lent quota from it (its queue then within its nominal) or,
            # where it would borrow, borrow over it.
            assert room.root(job.spec.queue) == room.root(bq) and lent[v.job_id]
            reclaim = policy.reclaim_within_cohort
            threshold = policy.borrow_priority_threshold
            assert (
                (reclaims and (reclaim == "any" or (reclaim == "lower-priority" and lower)))
                or (
                    not reclaims
                    and policy.borrow_within_cohort == "lower-priority"
                    and lower
                    and (threshold is None or job.priority <= threshold)
                )
                or fair
            )
        if b.phase == "queued":
            # Queued beneficiaries fit their queue's quota once their victims give theirs back
            # (a shrink's share of it rounded down here), and the fold counts them as admitted
            # from then on, a shrink's beneficiary as much as a preemption's.
            assert p.shrinks or room.fits(bq, ANY, need)
            room.charge(bq, ANY, need)
        assert p.deadline == now + max(
            state.jobs[j].spec.grace_seconds
            for j in [v.job_id for v in p.victims] + [s.job_id for s in p.shrinks]
        )
    # The beneficiaries fit once their victims are gone, each on GPUs of its own.
    scratch = copy.deepcopy(state)
    for job in scratch.jobs.values():
        if job.phase in ("checkpointing", "preempted"):
            claims.release(scratch, job)
    for p in plans:
        for v in p.victims:
            claims.release(scratch, scratch.jobs[v.job_id])
        for s in p.shrinks:
            for rank in range(s.replicas, len(scratch.jobs[s.job_id].held.workers)):  # type: ignore[union-attr]
                claims.release_rank(scratch, scratch.jobs[s.job_id], rank)
        b = scratch.jobs[p.beneficiary]
        if b.admission is None:  # a queued job reclaiming quota, as admission will admit it
            b = msgspec.structs.replace(
                b, admission=quota.admission(state.queues[b.spec.queue], b, quota.min_replicas(b.spec))
            )
        claims.check(scratch, b, p.placement)
        claims.take(scratch, msgspec.structs.replace(b), p.placement)
        for m in p.moves[1:]:  # each moved job fits where it goes, somewhere it was not
            moved = msgspec.structs.replace(state.jobs[m.job_id], held=None)
            assert claims.claimed(m) != claims.claimed(state.jobs[m.job_id].held)
            claims.check(scratch, moved, m)
            claims.take(scratch, moved, m)
    # The fold accepts every proposal.
    folded = copy.deepcopy(state)
    before = folded.rejected_total
    for i, e in enumerate(events):
        apply_event(folded, folded.seq + 1, subj.decision("preemptor"), e, now + i)
    assert folded.rejected_total == before, folded.rejections[-1:]
    for e in preemptions:
        for v in e.victims:
            assert folded.jobs[v.job_id].phase in ("checkpointing", "preempted")
    return events


@settings(max_examples=150, deadline=None)
@given(st.one_of(worlds(), lender_worlds()))
def test_preemptions_are_safe_fitting_accepted_and_deterministic(w: World) -> None:
    config = PreemptorConfig()
    events = check_cycle(w.state, w.time, config)
    # The fold takes them; a second cycle sees them under way.
    for e in events:
        w.emit(subj.decision("preemptor"), e)
    again = check_cycle(w.state, w.time + 1, config)
    first = {e.beneficiary for e in events if isinstance(e, (PreemptionRequested, ShrinkRequested))}
    for e in again:
        # Another beneficiary may be served now: one that fit the free GPUs the first cycle's
        # beneficiary holds since (preemptions of higher priority were planned first).
        assert isinstance(e, (PreemptionRequested, ShrinkRequested))
        b = w.state.jobs[e.beneficiary]
        # A beneficiary whose victims are still stopping is not served twice.
        assert not (e.beneficiary in first and _under_way(w.state, b))


def _shares_fairly(
    state: State, room: Ledger, now: float, victims: Sequence[Victim], b: JobState, need: int
) -> bool:
    """Whether the beneficiary's queue's fair-sharing strategies let it take every other queue's
    victim of the record (Kueue's S2-a / S2-b on the shares of ``projections.preemption``), on
    ``room`` as it stands before the record (``need``: what the beneficiary takes there)."""
    policy = state.queues[b.spec.queue].preemption
    if not policy.fair_sharing:
        return False
    freed: dict[str, list[int]] = {}  # per queue, what each victim there frees
    for v in victims:
        job = state.jobs[v.job_id]
        for key, milli in quota.holding(job):
            if key == ANY:
                freed.setdefault(job.spec.queue, []).append(milli)
    shares = Shares(state, room, now)
    bq = b.spec.queue
    mine = shares.beneficiary(b, ANY, need, sum(freed.get(bq, ())))
    # Each victim against the other queue's share just before and just after it, in every order
    # the record's victims could be taken in (Kueue's S2-b and S2-a, victim by victim).
    return all(
        fair_allows(
            policy.fair_sharing,
            mine,
            shares.share(q, ANY, last - sum(gone)),
            shares.share(q, ANY, -sum(gone)),
        )
        for q, gone in freed.items()
        if q != bq
        for last in gone
    )


def _within_allows(state: State, job: JobState, b: JobState) -> bool:
    """Whether the beneficiary's queue's ``within_queue`` lets it stop ``job`` of its own queue:
    a lower priority, or under ``lower-or-newer-equal-priority`` an equal one submitted later."""
    within = state.queues[b.spec.queue].preemption.within_queue
    newer = job.priority == b.priority and job.submitted_seq > b.submitted_seq
    equal_allowed = within == "lower-or-newer-equal-priority" and newer
    return within != "never" and (job.priority < b.priority or equal_allowed)


def _need(state: State, job: JobState) -> int:
    """The milli-GPU a queued job would be admitted with, at its minimum replicas."""
    demands = quota.worker_demands(state.queues[job.spec.queue], job.spec.resources)
    return demands[0][1] * quota.min_replicas(job.spec) if demands else 0


def _under_way(state: State, b: JobState) -> bool:
    """Whether a job stopped or shrunk for ``b`` still holds GPUs on its way out."""
    return any(
        v in state.jobs
        and state.jobs[v].held is not None
        and (state.jobs[v].phase == "checkpointing" or bool(state.jobs[v].leaving))
        for v in b.victims
    )


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_elastic_shrinks_keep_the_same_guarantees(w: World) -> None:
    config = PreemptorConfig()
    plans = plan(w.state, w.time, config)
    assert plans == plan(copy.deepcopy(w.state), w.time, config)
    scratch = copy.deepcopy(w.state)
    for job in scratch.jobs.values():
        if job.phase in ("checkpointing", "preempted"):
            claims.release(scratch, job)
    for p in plans:
        b = w.state.jobs[p.beneficiary]
        for s in p.shrinks:
            job = w.state.jobs[s.job_id]
            assert job.spec.min_replicas is not None and job.spec.min_replicas <= s.replicas
            assert job.admission is not None and s.replicas < job.admission.replicas
            assert preemptible(w.state, job)
            assert job.spec.queue != b.spec.queue or _within_allows(w.state, job, b)
            kept = scratch.jobs[s.job_id]
            assert kept.held is not None
            claims.release(scratch, kept)
            remaining = tuple(wk for wk in job.held.workers if wk.rank < s.replicas)  # type: ignore[union-attr]
            claims.take(scratch, kept, Placement(job.id, job.attempt, remaining))
        for v in p.victims:
            claims.release(scratch, scratch.jobs[v.job_id])
        if b.admission is None:
            b = msgspec.structs.replace(
                b, admission=quota.admission(w.state.queues[b.spec.queue], b, quota.min_replicas(b.spec))
            )
        claims.check(scratch, b, p.placement)
        claims.take(scratch, msgspec.structs.replace(b), p.placement)
        for m in p.moves[1:]:  # each moved job fits where it goes, somewhere it was not
            moved = msgspec.structs.replace(w.state.jobs[m.job_id], held=None)
            assert claims.claimed(m) != claims.claimed(w.state.jobs[m.job_id].held)
            claims.check(scratch, moved, m)
            claims.take(scratch, moved, m)


@st.composite
def spread_worlds(draw: st.DrawFn) -> World:
    """Two or three 8-GPU nodes; team-a (a drawn nominal) and team-b (8) in no cohort, running
    small jobs of drawn classes, each on a drawn node where it fits, so that the lowest-priority
    ones are often on other nodes than the one an urgent job needs; then team-a's urgent job
    (4 or 8 GPUs on one node, priority 10), which waits for quota or GPUs."""
    w = World()
    for name, inv in cluster(draw(st.integers(2, 3)), "h100-8x"):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    for pc in CLASSES.values():
        w.emit(subj.admin("pc"), ApplyPriorityClass(priority_class=pc), subj.ADMIN)
    for q, nominal in (("team-a", draw(st.integers(8, 24))), ("team-b", 8)):
        w.emit(subj.admin("queue"), ApplyQueue(queue=QueueSpec(q, quotas={ANY: Quota(nominal)})), subj.ADMIN)
    ledger = Ledger.from_state(w.state)
    nodes = sorted(w.state.nodes)
    shapes = st.tuples(
        st.sampled_from(["team-a", "team-a", "team-b"]),
        st.sampled_from(["low", "low", "high", "prod"]),
        st.sampled_from([1, 1, 2, 4, 8]),
        st.sampled_from(nodes),
    )
    for i, (q, pc, n, node) in enumerate(draw(st.lists(shapes, min_size=4, max_size=12))):
        jid = f"j{i:02d}"
        spec = JobSpec(queue=q, priority_class=pc, resources=Resources(gpus=n), command=TRAIN)
        free = [g.info.index for g in w.state.nodes[node].gpus if not g.holders]
        w.emit(subj.request("t", "submit"), SubmitJob(request_id=jid, job=spec), "t", draw(st.floats(1, 60)))
        w.emit(subj.job(jid), JobAccepted(job_id=jid, priority=CLASSES[pc].value))
        job = w.state.jobs[jid]
        adm = quota.admission(w.state.queues[q], job)
        if len(free) < n or ledger.check(job, adm) is not None:
            continue  # waits in its queue
        ledger.hold_admission(job, adm)
        w.emit(subj.decision("admission"), JobsAdmitted(based_on=w.seq, now=w.time, admissions=(adm,)))
        p = Placement(jid, 0, (WorkerSlot(0, node, tuple(GpuClaim(g) for g in free[:n])),))
        w.emit(subj.decision("placer"), JobsPlaced(based_on=w.seq, now=w.time, placements=(p,)))
        w.emit(subj.node(node), WorkerStarted(node=node, job_id=jid, attempt=0, rank=0))
    w.time += 600.0
    spec = JobSpec(
        queue="team-a",
        priority_class="high",
        resources=Resources(gpus=draw(st.sampled_from([4, 8]))),
        topology=Topology("node", True),
        command=TRAIN,
    )
    _start(w, draw, ledger, "urgent", spec, 1.0, CLASSES["high"].value)
    return w


@settings(max_examples=100, deadline=None)
@given(st.one_of(spread_worlds(), worlds()), st.booleans())
def test_no_victim_is_stopped_that_the_beneficiary_fits_without(w: World, shrink: bool) -> None:
    # Minimal after fill-back: for the first beneficiary searched, with every other victim of
    # its proposal gone, keeping any one victim leaves it unable to fit (its queue's quota and
    # the placer's gang search), or leaves a victim the fold would not let it take.
    state, now = w.state, w.time
    if any(j.held is None and not j.reasons for j in indexes.jobs_in(state, "admitted")):
        return  # none here; such a job would keep its GPUs in the simulation first
    plans = plan(state, now, PreemptorConfig(max_beneficiaries=1, shrink=shrink))
    if not plans or plans[0].shrinks:
        return
    (p,) = plans
    b = state.jobs[p.beneficiary]
    policy = state.queues[b.spec.queue].preemption
    event(f"{len(p.victims)} victim(s)")
    stopped = {v.job_id for v in p.victims}
    if any(
        j.id not in stopped and j.spec.queue == b.spec.queue and j.priority < b.priority
        for j in indexes.jobs_in(state, "running")
    ):
        event("a lower-priority job of its queue kept running")
    for kept in p.victims:
        sim = Simulation(state, PlacerConfig())
        for v in p.victims:
            if v != kept:
                job = state.jobs[v.job_id]
                sim.release(job, *charge_of(sim.ledger, job), None)
        target = (
            admitted_target(sim.state, sim.ledger, b)
            if b.phase == "admitted"
            else queued_target(state, sim.ledger, b)
        )
        assert target is not None
        assert not (sim.fits(target) and sim.allowed(target, policy)), f"{kept.job_id} was not needed"


# -- an urgent job on a full cohort, from arrival to placement ------------------------------------------

URGENT = PriorityClassSpec("urgent", 1000)


@st.composite
def full_cohorts(draw: st.DrawFn) -> World:
    """A cohort whose queues' nominal quotas add up to its capacity, every node running one
    8-GPU job of some queue and class (so some queues borrow; one that may not be preempted
    only within its queue's nominal), and an urgent 8-GPU job queued in one of the queues:
    quota blocks it."""
    w = World()
    n = draw(st.integers(2, 4))
    for name, inv in cluster(n, "h100-8x"):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    for spec_ in (*CLASSES.values(), URGENT):
        w.emit(subj.admin("pc"), ApplyPriorityClass(priority_class=spec_), subj.ADMIN)
    w.emit(subj.admin("cohort"), ApplyCohort(cohort=CohortSpec("research")), subj.ADMIN)
    queues = QUEUES[: draw(st.integers(2, 3))]
    cuts = sorted(draw(st.lists(st.integers(0, 2 * n), min_size=len(queues) - 1, max_size=len(queues) - 1)))
    fixed_room: dict[str, int] = {}  # of its nominal, what jobs that may not be preempted may still hold
    for q, lo, hi in zip(queues, [0, *cuts], [*cuts, 2 * n], strict=True):
        qspec = QueueSpec(name=q, cohort="research", quotas={ANY: Quota(4 * (hi - lo))})
        w.emit(subj.admin("queue"), ApplyQueue(queue=qspec), subj.ADMIN)
        fixed_room[q] = 4 * (hi - lo)
    classes = sorted(c for c in CLASSES if c != "mid")  # no anti-thrash guards here
    for i, node in enumerate(sorted(w.state.nodes)):
        jid = f"j{i}"
        pc = draw(st.sampled_from(classes))
        q = draw(st.sampled_from(queues))
        if not CLASSES[pc].preemptible:
            if fixed_room[q] < 8:
                pc = "high"
            else:
                fixed_room[q] -= 8
        spec = JobSpec(queue=q, priority_class=pc, resources=Resources(gpus=8), command=TRAIN)
        w.emit(subj.request("t", "submit"), SubmitJob(request_id=jid, job=spec), "t", draw(st.floats(1, 600)))
        w.emit(subj.job(jid), JobAccepted(job_id=jid, priority=CLASSES[pc].value))
        adm = quota.admission(w.state.queues[spec.queue], w.state.jobs[jid])
        w.emit(subj.decision("admission"), JobsAdmitted(based_on=w.seq, now=w.time, admissions=(adm,)))
        p = Placement(jid, 0, (WorkerSlot(0, node, tuple(GpuClaim(g) for g in range(8))),))
        w.emit(subj.decision("placer"), JobsPlaced(based_on=w.seq, now=w.time, placements=(p,)))
        w.emit(subj.node(node), WorkerStarted(node=node, job_id=jid, attempt=0, rank=0))
    spec = JobSpec(
        queue=draw(st.sampled_from(queues)),
        priority_class="urgent",
        resources=Resources(gpus=8),
        command=TRAIN,
    )
    w.emit(
        subj.request("t", "submit"), SubmitJob(request_id="urgent", job=spec), "t", draw(st.floats(1, 600))
    )
    w.emit(subj.job("urgent"), JobAccepted(job_id="urgent", priority=URGENT.value))
    return w


def _cycle(w: World, decide_fn: Callable[[State, float], list[Event]]) -> list[Event]:
    events = decide_fn(w.state, w.time)
    for e in events:
        w.emit(routing.subject_of(e), e)
    _quota_agrees(w.state)
    return events


def _quota_agrees(state: State) -> None:
    """What the fold keeps per queue is what the jobs holding quota add up to."""
    kept, counted = Ledger.from_state(state), Ledger.from_jobs(state)
    for q in state.queues:
        assert kept.used(q, ANY) == counted.used(q, ANY)
        assert kept.used(q, ANY) <= kept.ceiling(q, ANY)
        # ... and of it, what jobs that may not be preempted hold, never above the nominal: what
        # a queue borrows, it can always be made to give back.
        assert kept.fixed(q, ANY) == counted.fixed(q, ANY) <= kept.nominal(q, ANY)


@settings(max_examples=100, deadline=None)
@given(full_cohorts(), st.booleans())
def test_an_urgent_job_on_a_full_cohort_gets_what_one_victim_frees(w: World, borrow: bool) -> None:
    config = PreemptorConfig()
    urgent = w.state.jobs["urgent"]
    q = urgent.spec.queue
    policy = PreemptionPolicy(borrow_within_cohort="lower-priority" if borrow else "never")
    qspec = msgspec.structs.replace(w.state.queues[q], preemption=policy)
    w.emit(subj.admin("queue"), ApplyQueue(queue=qspec), subj.ADMIN)
    state = w.state
    ledger = Ledger.from_state(state)
    reclaim = ledger.used(q, ANY) + 8 * WHOLE <= ledger.nominal(q, ANY)
    # Kueue's gate: asking more than its nominal, a job that may not borrow over others has
    # nobody stopped for it, its own queue's jobs included (one flat cohort: no cohort below
    # the root to fit in).
    may_preempt = borrow or reclaim or ledger.nominal(q, ANY) >= 8 * WHOLE

    def allowed(job: JobState) -> bool:
        if not preemptible(state, job) or not may_preempt:
            return False
        if job.spec.queue == q:
            return job.priority < urgent.priority
        borrows = ledger.used(job.spec.queue, ANY) > ledger.nominal(job.spec.queue, ANY)
        return borrows and (reclaim or (borrow and job.priority < urgent.priority))

    # Every node holds one 8-GPU job and no queue has a lending or borrowing limit: stopping any
    # one job frees a node and 8 GPUs of the cohort's quota, which is all the urgent job needs.
    options = [j for j in state.jobs.values() if j.phase == "running" and allowed(j)]
    events = check_cycle(state, w.time, config)
    mine = [e for e in events if isinstance(e, PreemptionRequested) and e.beneficiary == "urgent"]
    if not options:
        assert mine == []
        return
    (ev,) = mine
    (v,) = ev.victims  # the smallest set: one job
    victim = state.jobs[v.job_id]
    assert victim in options
    if any(j.spec.queue != q for j in options):
        assert victim.spec.queue != q  # borrowers first
    node = victim.held.workers[0].node  # type: ignore[union-attr]
    for e in events:
        w.emit(subj.decision("preemptor"), e)
    _quota_agrees(w.state)
    # The victim stops; admission admits the urgent job first, and only it: the quota the victim
    # gave back is the urgent job's, whatever the fair-share order says.
    w.emit(subj.node(node), WorkerExited(node=node, job_id=v.job_id, attempt=0, rank=0, code=0, stopped=True))
    admitted = [a.job_id for e in _cycle(w, admission) if isinstance(e, JobsAdmitted) for a in e.admissions]
    assert admitted == ["urgent"]
    assert w.state.jobs[v.job_id].phase == "queued" and w.state.jobs[v.job_id].attempt == 1
    # The placer puts it on the GPUs the victim freed.
    _cycle(w, placer)
    placed = w.state.jobs["urgent"]
    assert placed.phase == "placed" and placed.held is not None
    assert {wk.node for wk in placed.held.workers} == {node}
    # Nothing more is stopped for it, and every job is still there, once.
    later = check_cycle(w.state, w.time, config)
    assert not any(isinstance(e, PreemptionRequested) and e.beneficiary == "urgent" for e in later)
    assert sorted(w.state.jobs) == sorted(state.jobs)
    holders = [h for n in w.state.nodes.values() for g in n.gpus for h in g.holders]
    assert len(holders) == 8 * len(w.state.nodes)  # every GPU held once, by a job that holds it
    assert all(w.state.jobs[h].held is not None for h in holders)


@settings(max_examples=200, deadline=None)
@given(st.one_of(worlds(), lender_worlds()))
def test_a_job_within_its_nominal_never_waits_for_a_lower_priority_one(w: World) -> None:
    # The first job the preemptor searches for, if it is queued, its queue stays within its
    # nominal with it and quota blocks it: when stopping every lower-priority job its queue's
    # policy allows (its own queue's, and other queues' that hold what its side lent) would let
    # it fit, quota and GPUs, and leaves no other queue short of its nominal by a whole job
    # (``preemption.below_nominal``: its nominal stays guaranteed too), the preemptor proposes
    # a preemption for it.
    state, now = w.state, w.time
    first = beneficiaries(state, now)  # the preemptor's order: nobody is searched for before it
    if not first or first[0].phase != "queued":
        return
    h = first[0]
    q = h.spec.queue
    ledger = planning_ledger(state)
    need = _need(state, h)
    if need == 0 or ledger.used(q, ANY) + need > ledger.nominal(q, ANY) or ledger.fits(q, ANY, need):
        return
    policy = state.queues[q].preemption
    lenders = set(ledger.lenders_to(q, ANY))

    def allowed(job: JobState) -> bool:
        if job.phase not in ("placed", "starting", "running") or job.priority >= h.priority:
            return False
        if protected(state, job, now) is not None:
            return False
        if job.spec.queue == q:
            return policy.within_queue != "never"
        return job.spec.queue in lenders and policy.reclaim_within_cohort != "never"

    room = copy.deepcopy(ledger)
    scratch = copy.deepcopy(state)
    least: dict[str, int] = {}  # per other queue, the least one of its stopped jobs frees
    for v in [j for j in state.jobs.values() if allowed(j)]:
        for key, milli in quota.holding(v):
            room.charge(v.spec.queue, key, -milli)
            if v.spec.queue != q and key == ANY and v.admission is not None:
                n = v.admission.replicas  # a running elastic job's piece is one of its workers
                one = least_given(v, milli // n, n)
                least[v.spec.queue] = min(least.get(v.spec.queue, one), one)
        claims.release(scratch, scratch.jobs[v.id])
    per = h.spec.resources.gpus
    if not room.fits(q, ANY, need) or _first_fit(scratch, quota.min_replicas(h.spec), per) is None:
        return
    if any(below_nominal(room, other, ANY, one) for other, one in least.items()):
        event("only stopping work within another queue's nominal would let it in")
        return
    event("stopping lower-priority work would let it in")
    assert h.id in {p.beneficiary for p in plan(state, now, PreemptorConfig(max_beneficiaries=1))}
