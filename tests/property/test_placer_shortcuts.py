"""The placer's shortcuts decide exactly as the long way round, over random clusters and jobs.

- ``Chain.diagnose`` keeps each node's reason per shape within a cycle and re-asks only the
  nodes taken from or given back to since; ``Chain.diagnose_walk`` asks every node afresh. A
  whole cycle decides the same events either way, and after any sequence of takes and
  give-backs on a snapshot the two answers are equal.
- A rack's or block's room for a one-model whole-GPU gang is read from the whole-GPU index's
  buckets; the general count visits the candidates one by one. Both find the same members, in
  the same order, and the same room.

Clusters and jobs are those of ``test_placer_properties`` (every node profile, unhealthy GPUs,
cordoned nodes; every shape and topology intent), with more jobs than the cluster holds, so
that many wait and are diagnosed between placements.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.events.jobs import JobSpec
from corral.projections.placement import gang, stack
from corral.projections.placement.framework import Chain, Request
from corral.projections.placement.plugins.packing import fragmentation_of
from corral.projections.placement.snapshot import Snapshot
from corral.projections.state import JobState
from corral.services.placer.decide import decide
from tests.builders import LogBuilder
from tests.property.test_placer_properties import admit, job_specs, scenarios

Scenario = tuple[LogBuilder, list[tuple[JobSpec, int]], list[tuple[JobSpec, int]]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.tuples(job_specs(), st.integers(1, 5)), min_size=2, max_size=6))
def test_a_cycle_decides_as_if_every_diagnosis_walked_every_node(
    scenario: Scenario, more: list[tuple[tuple[JobSpec, int], int]]
) -> None:
    log, first, _ = scenario
    # Jobs of one shape several times over, so that several wait and are diagnosed with
    # placements of other shapes between them.
    admit(log, "a", first + [spec for spec, times in more for _ in range(times)])
    state = log.fold()
    kept = decide(state, 2000.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Chain, "diagnose", Chain.diagnose_walk)
        walked = decide(state, 2000.0)
    assert kept == walked


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(job_specs(), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_diagnose_after_takes_and_give_backs_is_the_walk(
    scenario: Scenario, specs: list[tuple[JobSpec, int]], rng: random.Random
) -> None:
    log, _, _ = scenario
    state = log.fold()
    snap = Snapshot(state)
    chain = stack.build(stack.PlacerConfig(), fragmentation_of(state))
    placed = []
    for i, (spec, _) in enumerate(specs):
        req = Request.of(_job(f"j{i}", spec))
        assert chain.diagnose(snap, req) == chain.diagnose_walk(snap, req)
        found = gang.place(chain, snap, req, {"rack": "rack", "block": "block"})
        if not isinstance(found, tuple):
            placed.append((found, req))
        if placed and rng.random() < 0.3:
            p, r = placed.pop(rng.randrange(len(placed)))
            snap.release(p, r.res)
        for _, r in placed:
            assert chain.diagnose(snap, r) == chain.diagnose_walk(snap, r)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(job_specs(), min_size=1, max_size=8))
def test_room_from_the_buckets_is_the_candidates_count(
    scenario: Scenario, specs: list[tuple[JobSpec, int]]
) -> None:
    log, _, _ = scenario
    state = log.fold()
    snap = Snapshot(state)
    chain = stack.build(stack.PlacerConfig(), fragmentation_of(state))
    for i, (spec, _) in enumerate(specs):
        req = Request.of(_job(f"j{i}", spec))
        models = [m for m in snap.models() if req.need.model_ok(m)]
        if req.need.kind == "whole" and len(models) == 1:
            for label in ("rack", "profile", "no-such-label"):
                domain_of = snap.domains(label)
                assert gang._room_by_buckets(snap, req, models[0], domain_of) == gang._room(
                    snap, req, models, domain_of
                )
        gang.place(chain, snap, req, {"rack": "rack", "block": "block"})  # takes what it places


def _job(job_id: str, spec: JobSpec) -> JobState:
    return JobState(id=job_id, tenant="t", spec=spec, submitted_seq=1, submitted_at=0.0, phase="admitted")
