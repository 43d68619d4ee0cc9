"""Elastic resizing never breaks the books: any sequence of growths, growth placements, shrinks,
owner resizes, leaving and kept ranks exiting, whole preemptions and requeues keeps the quota a
queue holds equal to what its jobs hold, every GPU's holders equal to the claims of the
placements that hold it, no GPU over-committed, an elastic job within its min..max, and its
queue within its nominal quota plus what it may borrow from its cohort.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.projections import quota
from corral.projections.lifecycle import HOLDS_QUOTA
from corral.projections.state import WHOLE, State
from tests.builders import Cluster, LogBuilder, job, placement, queue_spec, whole, worker

N0 = "node-00"
LEAST, MOST = 1, 8
NOMINAL, BORROW = 3, 2  # team-a may hold 5 GPUs at most: 3 of its own, 2 borrowed from team-b

ops = st.lists(
    st.one_of(
        st.tuples(st.just("grow"), st.integers(1, MOST)),
        st.tuples(st.just("place-growth"), st.just(0)),
        st.tuples(st.just("start"), st.integers(0, MOST - 1)),
        st.tuples(st.just("shrink"), st.integers(0, MOST)),
        st.tuples(st.just("resize"), st.integers(1, MOST)),
        st.tuples(st.just("exit"), st.integers(0, MOST - 1)),
        st.tuples(st.just("preempt"), st.just(0)),
        st.tuples(st.just("requeue"), st.just(0)),
    ),
    max_size=24,
)


def check_books(state: State) -> None:
    assert state.faults == 0, [r for r in state.rejections if r.code == "fault"]
    held: dict[str, dict[str, int]] = {}
    for j in state.jobs.values():
        if j.phase in HOLDS_QUOTA:
            for key, milli in quota.holding(j):
                per = held.setdefault(j.spec.queue, {})
                per[key] = per.get(key, 0) + milli
    assert {q: {k: v for k, v in d.items() if v} for q, d in held.items()} == state.quota_held
    claimed: dict[tuple[str, int], dict[str, int]] = {}
    for j in state.jobs.values():
        if j.held is not None:
            for w in j.held.workers:
                for c in w.gpus:
                    per_gpu = claimed.setdefault((w.node, c.gpu), {})
                    per_gpu[j.id] = per_gpu.get(j.id, 0) + c.milli
    for name, node in state.nodes.items():
        for g in node.gpus:
            assert g.holders == claimed.get((name, g.info.index), {})
            assert g.used_milli == sum(g.holders.values()) <= WHOLE
    assert state.quota_held.get("team-a", {}).get(quota.ANY, 0) <= (NOMINAL + BORROW) * WHOLE
    e = state.jobs["e"]
    if e.admission is not None:
        assert LEAST <= e.admission.replicas <= MOST
    if e.held is not None and e.phase == "running":
        assert e.admission is not None and set(e.leaving) <= {w.rank for w in e.held.workers}
        kept = sorted(w.rank for w in e.held.workers if w.rank < e.admission.replicas)
        assert kept == list(range(len(kept)))


@settings(max_examples=150, deadline=None)
@given(start=st.integers(LEAST, NOMINAL + BORROW), steps=ops)
def test_elastic_resizing_keeps_quota_and_gpus_consistent(start: int, steps: list[tuple[str, int]]) -> None:
    log = LogBuilder().nodes(Cluster(1))
    log.queue(queue_spec("team-a", NOMINAL, cohort="org", borrowing_limit=BORROW))
    log.queue(queue_spec("team-b", 8, cohort="org"))
    log.submit("alice", "e", job().replicas(MOST, minimum=LEAST).checkpointable()).accept("e")
    log.admit("e", replicas=start).place(placement("e", *(worker(r, N0, whole(r)) for r in range(start))))
    for r in range(start):
        log.started(N0, "e", rank=r)
    log.submit("bob", "b", job("team-b").replicas(2)).accept("b", priority=10)
    state = log.fold()
    check_books(state)
    for op, n in steps:
        e = state.jobs["e"]
        if op == "grow":
            log.grow("e", n, attempt=e.attempt)
        elif op == "place-growth" and e.placement is not None and e.admission is not None:
            have = list(e.placement.workers)
            free = [g.info.index for g in state.nodes[N0].gpus if not g.holders]
            added = [worker(len(have) + i, N0, whole(g)) for i, g in enumerate(free)]
            log.place(placement("e", *have, *added[: e.admission.replicas - len(have)], attempt=e.attempt))
        elif op == "start":
            log.started(N0, "e", rank=n, attempt=e.attempt)
        elif op == "shrink":
            log.shrink("e", n, "b", attempt=e.attempt)
        elif op == "resize":
            log.request("alice", "resize", {"job_id": "e", "replicas": n})
        elif op == "exit":
            log.exited(N0, "e", rank=n, code=143, stopped=n in e.leaving, attempt=e.attempt)
        elif op == "preempt":
            log.preempt("b", "e", attempt=e.attempt)
        elif op == "requeue":
            log.requeue("e", e.attempt)
        state = log.fold()
        check_books(state)
    # Nothing is lost: the job is still known, in one phase, with no GPU held once nothing runs.
    e = state.jobs["e"]
    if not e.live:
        assert e.held is None
