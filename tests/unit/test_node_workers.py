"""A node runs at most ``NodeInventory.max_workers`` workers at once, as a kubelet runs at most
``--max-pods``: the placer places no more there, and the fold voids a placement that would."""

from __future__ import annotations

import msgspec

from corral.events import subjects
from corral.events.decisions import JobsPlaced, JobsUnschedulable, Placement, WorkerSlot
from corral.events.jobs import JobSpec, Resources
from corral.projections.fold import apply_event
from corral.projections.placement.inventory import Inventory
from corral.projections.state import State
from corral.services.placer.decide import decide
from tests.builders import Cluster, LogBuilder


def _node(most: int) -> LogBuilder:
    name, inventory = Cluster(1).nodes[0]
    return LogBuilder().queue("team-a").node(name, msgspec.structs.replace(inventory, max_workers=most))


def _cycle(state: State) -> tuple[list[Placement], dict[str, str]]:
    placed: list[Placement] = []
    why: dict[str, str] = {}
    seq = state.seq
    for ev in decide(state, state.time + 1):
        seq += 1
        apply_event(state, seq, subjects.decision("placer"), ev, state.time + 1)
        if isinstance(ev, JobsPlaced):
            placed.extend(ev.placements)
        elif isinstance(ev, JobsUnschedulable):
            why.update({u.job_id: " ".join(r.code for r in u.reasons) for u in ev.jobs})
    assert state.void_total == 0
    return placed, why


def test_the_placer_places_no_more_workers_on_a_node_than_it_runs() -> None:
    log = _node(2)
    sliver = JobSpec(queue="team-a", resources=Resources(gpus=0, cpu_milli=1, memory_mib=1))
    for j in ("a", "b", "c"):
        log.submit("alice", j, sliver).accept(j).admit(j)
    placed, why = _cycle(log.fold())
    assert sorted(p.job_id for p in placed) == ["a", "b"]
    assert "workers" in why["c"]


def test_a_gang_of_slivers_is_not_packed_past_the_bound() -> None:
    # 1,000 workers of a milli-CPU fit one node's CPU and memory; it runs 4 at once.
    log = _node(4)
    gang = JobSpec(queue="team-a", resources=Resources(gpus=0, cpu_milli=1, memory_mib=1), replicas=5)
    log.submit("alice", "g", gang).accept("g").admit("g", replicas=5)
    state = log.fold()
    placed, why = _cycle(state)
    assert placed == [] and "g" in why and state.nodes["node-00"].workers == 0
    five = Placement("g", 0, tuple(WorkerSlot(r, "node-00", ()) for r in range(5)))
    apply_event(
        state,
        state.seq + 1,
        subjects.decision("placer"),
        JobsPlaced(based_on=0, now=0.0, placements=(five,)),
        0,
    )
    assert state.void_total == 1 and state.jobs["g"].held is None


def test_a_gang_no_node_could_ever_run_that_many_workers_of_never_fits() -> None:
    gang = JobSpec(queue="team-a", resources=Resources(gpus=0, cpu_milli=1, memory_mib=1), replicas=5)
    assert not Inventory(_node(4).fold()).hosts_spec(gang, "")  # refused at submission
    assert Inventory(_node(5).fold()).hosts_spec(gang, "")
