"""The preemptor judging a backlog form by form (``PreemptorConfig.by_form``: the rest of a form
it found hopeless, or that quota does not block, is passed over unread) proposes exactly what it
proposes reading every queued job in turn: on random clusters whose queues (of every strategy
and preemption policy) run work of drawn priorities and hold deep backlogs of a few forms, with
drawn runtime estimates (which a hold reads job by job), jobs that may not be preempted (nor
borrow) among forms that may, for any bound on the beneficiaries of a
cycle, and again with the first cycle's preemptions under way."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from corral.events import routing
from corral.events import subjects as subj
from corral.events.jobs import JobAccepted, JobSpec, Resources, SubmitJob, Topology
from corral.events.queues import ApplyPriorityClass, ApplyQueue, QueueSpec, Quota
from corral.projections.quota import ANY, Ledger
from corral.services.preemptor.decide import PreemptorConfig, beneficiaries, decide, plan
from tests.builders import TRAIN
from tests.property.test_preemptor_properties import CLASSES, World, _start, org_world, policies

QUEUES = ("team-a", "team-b", "team-c")  # a and b share cohort org; c is alone
STRATEGIES = ("best-effort-fifo", "strict-fifo", "shortest-first")

forms = st.tuples(
    st.sampled_from(QUEUES),
    st.sampled_from([1, 2, 4, 8]),  # GPUs per worker
    st.sampled_from([1, 1, 2]),  # replicas
    st.booleans(),  # elastic (min 1)
    st.sampled_from(["none", "nvlink"]),
    st.sampled_from([True, True, False]),  # may be preempted (else may not borrow)
)


@st.composite
def backlogs(draw: st.DrawFn) -> World:
    w = org_world(draw(st.integers(1, 2)))
    for q in QUEUES:
        qspec = QueueSpec(
            name=q,
            cohort="org" if q != "team-c" else None,
            quotas={ANY: Quota(draw(st.integers(0, 16)))},
            preemption=draw(policies),
            strategy=draw(st.sampled_from(STRATEGIES)),
        )
        w.emit(subj.admin("queue"), ApplyQueue(queue=qspec), subj.ADMIN)
    ledger = Ledger.from_state(w.state)
    classes = sorted(CLASSES)
    estimates = st.sampled_from([None, 30.0, 600.0, 5000.0])
    # Running work first (what fits starts; the rest waits), then the backlog, of a few forms.
    running = draw(st.lists(st.tuples(forms, st.sampled_from(classes), estimates), min_size=1, max_size=10))
    backlog = draw(st.lists(forms, min_size=1, max_size=4))
    waiting = draw(
        st.lists(
            st.tuples(st.sampled_from(backlog), st.sampled_from(classes), estimates), min_size=1, max_size=40
        )
    )
    # Some of the backlog admission has not judged yet: queued, though their quota may be free.
    unseen = draw(st.sets(st.integers(len(running), len(running) + len(waiting))))
    for i, ((q, per, n, elastic, pack, preemptible), pc, estimate) in enumerate([*running, *waiting]):
        spec = JobSpec(
            queue=q,
            priority_class=pc,
            replicas=n,
            min_replicas=1 if elastic and n > 1 else None,
            resources=Resources(gpus=per),
            topology=Topology(pack=pack),  # type: ignore[arg-type]
            runtime_estimate_s=estimate,
            preemptible=preemptible,
            command=TRAIN,
        )
        if i in unseen:
            w.emit(subj.request("t", "submit"), SubmitJob(request_id=f"j{i:02d}", job=spec), "t")
            w.emit(subj.job(f"j{i:02d}"), JobAccepted(job_id=f"j{i:02d}", priority=CLASSES[pc].value))
            continue
        _start(w, draw, ledger, f"j{i:02d}", spec, draw(st.floats(0, 300)), CLASSES[pc].value)
    w.time += draw(st.floats(0, 600))
    return w


@settings(max_examples=200, deadline=None)
@given(backlogs(), st.sampled_from([1, 2, 4, 64]))
def test_judging_the_backlog_by_form_proposes_what_judging_each_job_does(w: World, most: int) -> None:
    by_form = PreemptorConfig(max_beneficiaries=most)
    by_job = PreemptorConfig(max_beneficiaries=most, by_form=False)
    plans = plan(w.state, w.time, by_form)
    event(f"{min(len(plans), 3)} proposals")
    assert plans == plan(w.state, w.time, by_job)
    events = decide(w.state, w.time, by_form)
    assert events == decide(w.state, w.time, by_job)
    for e in events:  # the next cycle, with these under way
        w.emit(routing.subject_of(e), e)
    assert plan(w.state, w.time + 1, by_form) == plan(w.state, w.time + 1, by_job)


def test_the_turns_job_by_job_are_every_queued_job_in_order() -> None:
    w = World()
    for pc in CLASSES.values():
        w.emit(subj.admin("pc"), ApplyPriorityClass(priority_class=pc), subj.ADMIN)
    queue = QueueSpec(name="team-a", quotas={ANY: Quota(0)})
    w.emit(subj.admin("queue"), ApplyQueue(queue=queue), subj.ADMIN)
    ledger = Ledger.from_state(w.state)
    for i, pc in enumerate(["low", "high", "low", "mid"]):
        spec = JobSpec(queue="team-a", priority_class=pc, resources=Resources(gpus=1 + i % 2), command=TRAIN)
        _start(w, _never, ledger, f"j{i}", spec, 1.0, CLASSES[pc].value)
    assert [j.id for j in beneficiaries(w.state, w.time)] == ["j1", "j3", "j0", "j2"]


def _never(strategy: object) -> bool:
    raise AssertionError("a job with no quota is never admitted, so nothing is drawn")
