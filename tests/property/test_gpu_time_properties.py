"""GPU time held per queue (``projections.gpu_time``), whatever the log:

- it is never negative, and what each queue holds now is exactly what its jobs' held GPUs count
  for, after every record, whoever wrote what;
- with an infinite half-life it is the GPU-seconds the queue's jobs held, integrated record by
  record from the GPUs each job holds in the state (not from the fold's own books);
- it does not depend on how the same decisions are batched into records: placements at one
  time in one batch or one record each, in any order, give the same GPU time and the same
  fair-share order.
"""

from __future__ import annotations

import math

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.workload import records, synthetic_log
from corral.events.decisions import Placement
from corral.events.log import Record
from corral.events.queues import FairShareSpec
from corral.projections import gpu_time, quota
from corral.projections.fold import apply
from corral.projections.state import State
from corral.services.admission.order import pending_order
from tests.builders import Cluster, LogBuilder, job, on
from tests.property.test_fold_properties import FAST, GANG_STORY, STORY, logs, stories


def check_gpu_time(state: State) -> None:
    """Nothing negative; each queue holds, per key, what its jobs' held GPUs count for; a job
    counts what quota charges for each worker it holds, on the key its GPUs were placed under."""
    holding: dict[tuple[str, str], int] = {}
    for j in state.jobs.values():
        if j.held is None:
            assert (j.held_milli, j.held_key) == (0, ""), j.id
            continue
        expected = quota.worker_milli(j.spec.resources, j.held_key) * len(j.held.workers) if j.held_key else 0
        assert j.held_milli == expected, (j.id, j.held_key, j.held_milli)
        if j.held_milli:
            k = (j.spec.queue, j.held_key)
            holding[k] = holding.get(k, 0) + j.held_milli
    for queue, per_key in state.gpu_time.items():
        for key, g in per_key.items():
            assert g.decayed >= 0.0 and g.holding >= 0, (queue, key, g)
            assert g.holding == holding.pop((queue, key), 0), (queue, key, g)
    assert not holding, holding


@FAST
@given(st.one_of(logs, st.permutations(STORY), st.permutations(GANG_STORY)))
def test_gpu_time_is_never_negative_and_counts_what_is_held(records_: list[Record]) -> None:
    state = State()
    for i, r in enumerate(records_):
        apply(state, msgspec.structs.replace(r, seq=i + 1))
        check_gpu_time(state)
    assert state.faults == 0


def _integrated(log: list[Record]) -> tuple[State, dict[tuple[str, str], float]]:
    """Fold ``log`` with an infinite half-life, and integrate over it, record by record, the
    milli-GPU each job's held workers count for: on the key of the admission it held when its
    GPUs were taken (a requeue clears it before they are given back), until its queue is
    deleted."""
    state = State(fair_share=FairShareSpec(half_life_s=math.inf))
    placed_on: dict[str, str] = {}  # job -> key its held GPUs were taken under
    rates: dict[tuple[str, str], int] = {}
    totals: dict[tuple[str, str], float] = {}
    last = None
    for r in log:
        if last is not None:
            assert r.time >= last
            for k, rate in rates.items():
                totals[k] = totals.get(k, 0.0) + rate * (r.time - last)
        last = r.time
        apply(state, r)
        # A deleted queue's GPU time goes with it: one made again under its name starts anew.
        for k in [k for k in totals if k[0] not in state.queues]:
            del totals[k]
        rates = {}
        for j in state.jobs.values():
            if j.held is None:
                placed_on.pop(j.id, None)
                continue
            if j.id not in placed_on:
                adm = j.admission
                placed_on[j.id] = next(iter(adm.gpus)) if adm is not None and len(adm.gpus) == 1 else ""
            key = placed_on[j.id]
            if key:
                k = (j.spec.queue, key)
                rates[k] = rates.get(k, 0) + quota.worker_milli(j.spec.resources, key) * len(j.held.workers)
    return state, totals


def _check_total(log: list[Record]) -> None:
    state, totals = _integrated(log)
    assert state.faults == 0
    end = log[-1].time
    found: dict[tuple[str, str], float] = {}
    for queue, per_key in state.gpu_time.items():
        for key, g in per_key.items():
            found[queue, key] = gpu_time.at(g, end, math.inf)
    for k in found.keys() | totals.keys():
        total = totals.get(k, 0.0)
        assert math.isclose(found.get(k, 0.0), total, rel_tol=1e-9, abs_tol=1e-6), (k, found.get(k), total)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_with_an_infinite_half_life_it_is_the_gpu_seconds_held_in_a_busy_log(seed: int) -> None:
    log = records(synthetic_log(2_000, seed=seed, nodes=6))
    _check_total(log)


@FAST
@given(stories())
def test_with_an_infinite_half_life_it_is_the_gpu_seconds_held_in_any_story(log: list[Record]) -> None:
    _check_total(log)


# -- batching ------------------------------------------------------------------------------------

TEAMS = ("team-a", "team-b")


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[str, str, int, float, float]]:
    """Up to six jobs (id, queue, GPUs, start, end) that fit one 8-GPU node together, starting
    and ending at a few shared times, so that several placements fall at one time."""
    out = []
    free = 8
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(1, 2))
        if gpus > free:
            break
        free -= gpus
        start = draw(st.sampled_from((100.0, 100.0, 700.0)))
        end = start + draw(st.sampled_from((600.0, 3600.0, 3600.0)))
        out.append((f"j{i}", draw(st.sampled_from(TEAMS)), gpus, start, end))
    return out


def _played(
    work: list[tuple[str, str, int, float, float]], batched: bool, order: list[int], half_life: float
) -> State:
    """Each job placed on its own GPUs at its start and exiting at its end. ``batched``: the
    placements of one time in one record, else one record each; ``order``: the order of the jobs
    within a time."""
    log = LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(1)).fair_share(half_life).queues(*TEAMS)
    gpus: dict[str, tuple[int, ...]] = {}
    first = 0
    for job_id, queue, n, _, _ in work:
        gpus[job_id] = tuple(range(first, first + n))
        first += n
        log.submit(queue, job_id, job(queue).gpus(n)).accept(job_id)
    log.admit(*(w[0] for w in work))
    ranked = [work[i] for i in order]
    for t in sorted({w[3] for w in work} | {w[4] for w in work}):
        log.at(t)
        for job_id, _, _, _, end in ranked:
            if end == t:
                log.exited("node-00", job_id)
        placing: list[Placement] = [on("node-00", *gpus[w[0]], job_id=w[0]) for w in ranked if w[3] == t]
        if batched and placing:
            log.place(*placing)
        else:
            for p in placing:
                log.place(p)
        for p in placing:
            log.started("node-00", p.job_id)
    log.at(8000.0)
    for queue in TEAMS:  # a job waiting in each queue, to be ordered by fair share
        log.submit(queue, f"next-{queue}", job(queue).gpus(1)).accept(f"next-{queue}")
    return log.fold()


@settings(max_examples=60, deadline=None)
@given(work=workloads(), data=st.data(), half_life=st.sampled_from((60.0, 3600.0, 86400.0)))
def test_gpu_time_does_not_depend_on_how_decisions_are_batched(
    work: list[tuple[str, str, int, float, float]], data: st.DataObject, half_life: float
) -> None:
    order = data.draw(st.permutations(range(len(work))))
    one = _played(work, batched=True, order=list(range(len(work))), half_life=half_life)
    other = _played(work, batched=False, order=list(order), half_life=half_life)
    assert one.rejected_total == other.rejected_total == 0, (one.rejections, other.rejections)
    assert one.gpu_time == other.gpu_time
    for now in (8000.0, 20_000.0):
        assert [j.id for j in pending_order(one, now)] == [j.id for j in pending_order(other, now)]
