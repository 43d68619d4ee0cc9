"""The fold keeps per-queue quota holdings incrementally; they must always equal the holdings
recomputed job by job from the same state (the definition), at every point of a busy log."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.workload import records, synthetic_log
from corral.projections import quota
from corral.projections.fold import apply
from corral.projections.state import State


def _held_by_jobs(state: State) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for job in state.jobs.values():
        if job.phase in quota.HOLDS_QUOTA:
            for key, milli in quota.holding(job):
                per_key = out.setdefault(job.spec.queue, {})
                per_key[key] = per_key.get(key, 0) + milli
    return {q: {k: v for k, v in keys.items() if v} for q, keys in out.items() if any(keys.values())}


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 3_000), min_size=1, max_size=5))
def test_incremental_holdings_equal_the_definition(seed: int, cuts: list[int]) -> None:
    log = records(synthetic_log(3_000, seed=seed, nodes=8))
    state = State()
    marks = set(cuts)
    for r in log:
        apply(state, r)
        if r.seq in marks:
            assert state.quota_held == _held_by_jobs(state)
    assert state.quota_held == _held_by_jobs(state)
    assert state.faults == 0
