"""Preemption for jobs of several GPU models, over drawn worlds: the cluster has nodes of two
models, queues have quota per model, and jobs name one model or both in either order.

- the preemptor decides the same again and on a copy;
- the fold takes every record it proposes (the model each names is one the beneficiary counts
  against, judged there);
- nobody is stopped for a queued job that admission could admit on one of its models as things
  are (Kueue's flavor assigner takes a flavor that fits before preempting on another);
- a beneficiary whose stops are under way is charged on the model they are for, and a second
  cycle does not serve it again.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events import subjects as subj
from corral.events.decisions import (
    JobsPlaced,
    Placement,
    PreemptionRequested,
    ShrinkRequested,
)
from corral.events.jobs import JobAccepted, JobsAdmitted, JobSpec, Resources, SubmitJob
from corral.events.nodes import NodeRegistered, WorkerStarted
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, PreemptionPolicy, QueueSpec, Quota
from corral.projections import quota
from corral.projections.fold import apply_event
from corral.projections.preemption import demand, planning_ledger
from corral.projections.quota import Ledger
from corral.services.agent.inventory import cluster
from corral.services.preemptor.decide import PreemptorConfig, decide
from tests.builders import TRAIN
from tests.property.test_preemptor_properties import World, _first_fit, policies

H100, A100 = "H100-80GB", "A100-80GB"
MODEL_LISTS = [(H100,), (A100,), (H100, A100), (A100, H100)]
QUEUES = ("team-a", "team-b")


@st.composite
def model_worlds(draw: st.DrawFn) -> World:
    w = World()
    for name, inv in cluster(draw(st.integers(2, 4)), "mixed"):
        w.emit(subj.node(name), NodeRegistered(node=name, inventory=inv))
    w.emit(subj.admin("cohort"), ApplyCohort(cohort=CohortSpec("org")), subj.ADMIN)
    for q in QUEUES:
        quotas = {m: Quota(draw(st.integers(0, 8))) for m in (H100, A100)}
        policy: PreemptionPolicy = draw(policies)
        spec = QueueSpec(name=q, cohort="org", quotas=quotas, preemption=policy)
        w.emit(subj.admin("queue"), ApplyQueue(queue=spec), subj.ADMIN)
    jobs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(QUEUES),
                st.sampled_from(MODEL_LISTS),
                st.sampled_from([1, 2, 4]),  # GPUs per worker
                st.integers(1, 2),  # replicas
                st.integers(0, 10),  # priority
                st.booleans(),  # elastic
            ),
            min_size=4,
            max_size=12,
        )
    )
    for i, (q, models, per, n, prio, elastic) in enumerate(jobs):
        jid = f"j{i:02d}"
        spec = JobSpec(
            queue=q,
            replicas=n,
            min_replicas=1 if elastic else None,
            resources=Resources(gpus=per, gpu_models=models),
            command=TRAIN,
        )
        w.emit(subj.request("t", "submit"), SubmitJob(request_id=jid, job=spec), "t")
        w.emit(subj.job(jid), JobAccepted(job_id=jid, priority=prio))
        job = w.state.jobs[jid]
        ledger = Ledger.from_state(w.state)
        found = ledger.key_for(q, job)
        if found is None:
            continue
        adm = quota.admission(w.state.queues[q], job, key=found[0])
        if ledger.check(job, adm) is not None:
            continue  # it waits
        slots = _first_fit(w.state, adm.replicas, per, found[0])
        if slots is None:
            continue
        w.emit(subj.decision("admission"), JobsAdmitted(based_on=w.seq, now=w.time, admissions=(adm,)))
        w.emit(
            subj.decision("placer"),
            JobsPlaced(based_on=w.seq, now=w.time, placements=(Placement(jid, 0, slots),)),
        )
        for s in slots:
            w.emit(subj.node(s.node), WorkerStarted(node=s.node, job_id=jid, attempt=0, rank=s.rank))
    w.time += 3600.0  # past every guard
    return w


@settings(max_examples=300, deadline=None)
@given(model_worlds())
def test_preemption_for_jobs_of_several_models(w: World) -> None:
    config = PreemptorConfig()
    events = decide(w.state, w.time, config)
    assert decide(w.state, w.time, config) == events
    assert decide(copy.deepcopy(w.state), w.time, config) == events
    ledger = Ledger.from_state(w.state)
    for e in events:
        assert isinstance(e, (PreemptionRequested, ShrinkRequested))
        b = w.state.jobs[e.beneficiary]
        if b.phase != "queued":
            continue
        spec = b.spec
        per_worker = quota.worker_demands(w.state.queues[spec.queue], spec.resources)
        needs = [(k, each * quota.min_replicas(spec)) for k, each in per_worker]
        if e.beneficiary == events[0].beneficiary:
            # Not one admission could admit on a model as things are (a later beneficiary may be
            # one that fit the room an earlier one's plan takes).
            assert not any(ledger.fits(spec.queue, k, n, ledger.may_borrow(b)) for k, n in needs)
        assert e.key in {k for k, _ in needs} if len(needs) > 1 else e.key == ""
    served = set()
    for e in events:  # the fold takes every one (``World.emit`` asserts it)
        w.emit(subj.decision("preemptor"), e)
        served.add(e.beneficiary)
    room = planning_ledger(w.state)
    for b_id in served:
        b = w.state.jobs[b_id]
        if b.phase == "queued":
            found = demand(w.state, room, b)
            assert found is not None and (not b.reclaim_key or found[0] == b.reclaim_key)
    again = decide(w.state, w.time + 1, config)
    for e in again:
        assert isinstance(e, (PreemptionRequested, ShrinkRequested))
        b = w.state.jobs[e.beneficiary]
        under_way = any(
            v in w.state.jobs
            and w.state.jobs[v].held is not None
            and (w.state.jobs[v].phase == "checkpointing" or bool(w.state.jobs[v].leaving))
            for v in b.victims
        )
        assert not (e.beneficiary in served and under_way)
    # The state folds on: no record of either cycle was refused.
    before = w.state.rejected_total
    for e in again:
        w.seq += 1
        apply_event(w.state, w.seq, subj.decision("preemptor"), e, w.time + 1)
    assert w.state.rejected_total == before, w.state.rejections[-1:]
