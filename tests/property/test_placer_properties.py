"""Safety properties of the placer, over random clusters and random admitted jobs.

Clusters mix the simulated node profiles (NVSwitch H100s, NVLink-paired A100s, PCIe A100s, T4s,
H100s in MIG mode), with unhealthy GPUs and cordoned nodes; jobs mix whole-GPU gangs, shared
fractions, MIG slices and CPU-only workers, with model constraints, node selectors and every
topology intent. Two cycles run, the first one's placements folded before the second, so later
placements must respect GPUs already held. For every cycle:

- every proposed placement folds without a void (the fold's own check agrees);
- no GPU is ever over capacity: whole GPUs have one holder, fractions add up to at most 1000
  milli, MIG instances sit on valid, non-overlapping slices;
- a gang is placed whole: exactly the admitted number of workers, ranks 0..n-1, each with the
  shape it asked for;
- no unhealthy GPU, cordoned or unready node, foreign GPU model or unmatched label is used;
- the same state and input give the same events.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from corral.events import subjects
from corral.events.decisions import GpuClaim, JobsPlaced, Placement, WorkerSlot
from corral.events.jobs import Admission, JobsAdmitted, JobSpec, Resources, Topology
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.projections import claims, indexes, mig, quota
from corral.projections.fold import apply_event
from corral.projections.state import WHOLE, JobState, State
from corral.services.agent.inventory import PROFILES
from corral.services.placer.decide import decide
from tests.builders import TRAIN, Cluster, LogBuilder

QUEUE = QueueSpec("team-a", quotas={quota.ANY: Quota(1_000_000)})
MIG_PROFILES = ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
MODELS = ["H100-80GB", "A100-80GB", "A100-40GB", "T4"]


@st.composite
def resources(draw: st.DrawFn) -> Resources:
    kind = draw(st.sampled_from(["whole", "whole", "share", "mig", "cpu"]))
    models = draw(st.sampled_from([(), (), (), ("H100-80GB",), ("A100-80GB", "T4"), ("A100-40GB",)]))
    cpu = draw(st.sampled_from([500, 2000, 8000, 32_000]))
    mem = draw(st.sampled_from([1024, 16_384, 131_072]))
    if kind == "whole":
        gpus = draw(st.sampled_from([1, 1, 2, 4, 8]))
        return Resources(gpus=gpus, cpu_milli=cpu, memory_mib=mem, gpu_models=models)
    if kind == "share":
        return Resources(
            gpus=1, gpu_milli=draw(st.integers(50, 950)), cpu_milli=cpu, memory_mib=mem, gpu_models=models
        )
    if kind == "mig":
        return Resources(gpus=1, mig=draw(st.sampled_from(MIG_PROFILES)), cpu_milli=cpu, memory_mib=mem)
    return Resources(gpus=0, cpu_milli=cpu, memory_mib=mem)


@st.composite
def job_specs(draw: st.DrawFn) -> tuple[JobSpec, int]:
    replicas = draw(st.integers(1, 4))
    pack = draw(st.sampled_from(["none", "nvlink", "node", "rack", "block", "spread"]))
    selector = draw(st.sampled_from([{}, {}, {}, {"rack": "rack-0"}, {"profile": "h100-8x"}]))
    spec = JobSpec(
        queue="team-a",
        replicas=replicas,
        resources=draw(resources()),
        topology=Topology(pack, draw(st.booleans())),  # type: ignore[arg-type]
        node_selector=selector,
        preemptible=draw(st.booleans()),
        runtime_estimate_s=draw(st.none() | st.sampled_from([60.0, 3600.0])),
        command=TRAIN,
    )
    return spec, replicas


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[LogBuilder, list[tuple[JobSpec, int]], list[tuple[JobSpec, int]]]:
    log = LogBuilder().admin("queue", ApplyQueue(queue=QUEUE))
    profiles = draw(st.lists(st.sampled_from(sorted(PROFILES)), min_size=1, max_size=5))
    for i, profile in enumerate(profiles):
        for name, inv in Cluster(1, profile, prefix=f"n{i}").nodes:
            log.node(name, msgspec.structs.replace(inv, labels={**inv.labels, "rack": f"rack-{i % 2}"}))
            for g in draw(st.lists(st.integers(0, len(inv.gpus) - 1), max_size=1)):
                log.gpu_health(name, g, healthy=False)
            if draw(st.integers(0, 5)) == 0:
                log.cordon(name)
    first = draw(st.lists(job_specs(), min_size=1, max_size=5))
    second = draw(st.lists(job_specs(), min_size=0, max_size=4))
    return log, first, second


def admit(log: LogBuilder, prefix: str, jobs: list[tuple[JobSpec, int]]) -> None:
    for i, (spec, replicas) in enumerate(jobs):
        job_id = f"{prefix}{i}"
        log.submit("alice", job_id, spec).accept(job_id)
        gpus = quota.admission_gpus(quota.ANY, quota.worker_milli(spec.resources) * replicas)
        body = JobsAdmitted(
            based_on=log.last_seq, now=1000.0, admissions=(Admission(job_id, 0, replicas, gpus),)
        )
        log.event(subjects.decision("admission"), body)


def check_cycle(state: State, now: float) -> None:
    before = msgspec.convert(msgspec.to_builtins(state), State)
    events = decide(state, now)
    assert decide(before, now) == events, "same state, same events"
    placements = [p for e in events if isinstance(e, JobsPlaced) for p in e.placements]
    for p in placements:
        check_placement(state, p)
    voids = state.void_total
    seq = state.seq
    for e in events:
        seq += 1
        apply_event(state, seq, subjects.decision("placer"), e, now)
    assert state.void_total == voids, state.rejections[-1:]
    assert state.faults == 0
    for p in placements:
        assert state.jobs[p.job_id].phase == "placed"
    check_capacity(state)


def check_placement(state: State, p: Placement) -> None:
    job = state.jobs[p.job_id]
    assert job.admission is not None
    assert sorted(w.rank for w in p.workers) == list(range(job.admission.replicas)), "the whole gang"
    res = job.spec.resources
    for w in p.workers:
        claims.check_worker_shape(res, w.gpus)
        node = state.nodes[w.node]
        assert node.schedulable
        assert all(node.inventory.labels.get(k) == v for k, v in job.spec.node_selector.items())
        for c in w.gpus:
            gpu = node.gpus[c.gpu]
            assert gpu.healthy, f"unhealthy GPU {c.gpu} of {w.node}"
            assert not res.gpu_models or gpu.info.model in res.gpu_models
    if job.spec.topology.required and job.spec.topology.pack in ("nvlink", "node"):
        assert len({w.node for w in p.workers}) == 1
    if job.spec.topology.required and job.spec.topology.pack == "spread":
        assert len({w.node for w in p.workers}) == len(p.workers)


def check_capacity(state: State) -> None:
    for node in state.nodes.values():
        assert node.cpu_used <= node.inventory.cpu_milli and node.memory_used <= node.inventory.memory_mib
        for g in node.gpus:
            assert 0 <= g.used_milli <= WHOLE
            assert sum(g.holders.values()) == g.used_milli
            if g.info.mig:
                used = 0
                for start, inst in g.mig.items():
                    p = mig.profile(g.info.model, inst.profile)
                    assert p is not None and start in p.starts
                    m = mig.mask(p, start)
                    assert not used & m, "overlapping MIG instances"
                    used |= m
                assert used == g.mig_used
                assert sum(1 for i in g.mig.values() if i.profile.endswith("+me")) <= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_placements_are_safe_whole_and_deterministic(
    scenario: tuple[LogBuilder, list[tuple[JobSpec, int]], list[tuple[JobSpec, int]]],
) -> None:
    log, first, second = scenario
    admit(log, "a", first)
    state = log.fold()
    check_cycle(state, 2000.0)
    # A second cycle: new jobs must fit around what the first one placed.
    more = LogBuilder(start_seq=state.seq + 1, start_time=state.time + 1)
    admit(more, "b", second)
    more.fold(state)
    check_cycle(state, 3000.0)


# -- a place held for a job back from a planned shutdown ------------------------------------------


@st.composite
def held_places(draw: st.DrawFn) -> tuple[State, Placement, str | None]:
    """Up to three 8-GPU nodes with some GPUs busy; a job ``back`` admitted again with its place
    kept (free GPUs, one worker per rank, any topology intent); higher-priority jobs admitted
    beside it; and, ``spoiled``, what turned one of its workers away since (``None``: nothing)."""
    state = LogBuilder().nodes(Cluster(draw(st.integers(1, 3)))).fold()
    free: dict[str, list[int]] = {}
    for name, node in state.nodes.items():
        busy = draw(st.sets(st.integers(0, 7), max_size=6))
        for i in busy:
            node.gpus[i].used_milli, node.gpus[i].holders = WHOLE, {"other": WHOLE}
        free[name] = [i for i in range(8) if i not in busy]
    per = draw(st.sampled_from([1, 2, 4]))
    # Where it ran, the placer put it as its intent asks (one NVSwitch island per node here).
    pack = draw(st.sampled_from(["none", "nvlink", "node", "spread"]))
    required = draw(st.booleans())
    workers: list[WorkerSlot] = []
    for rank in range(draw(st.integers(1, 3))):
        roomy = [n for n, gpus in free.items() if len(gpus) >= per]
        if required and workers and pack in ("nvlink", "node"):
            roomy = [n for n in roomy if n == workers[0].node]
        elif required and pack == "spread":
            roomy = [n for n in roomy if all(w.node != n for w in workers)]
        if not roomy:
            break
        name = draw(st.sampled_from(roomy))
        gpus = draw(st.permutations(free[name]))[:per]
        free[name] = [g for g in free[name] if g not in gpus]
        workers.append(WorkerSlot(rank, name, tuple(GpuClaim(g) for g in sorted(gpus))))
    assume(workers)
    spec = JobSpec(
        queue="team-a",
        replicas=len(workers),
        resources=Resources(gpus=per, cpu_milli=2000, memory_mib=16_384),
        topology=Topology(pack, required),  # type: ignore[arg-type]
        command=TRAIN,
    )
    place = Placement("back", 0, tuple(workers))
    jobs = [("back", spec, 0)]
    for i in range(draw(st.integers(0, 3))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        rival = JobSpec(queue="team-a", resources=Resources(gpus=gpus), command=TRAIN)
        jobs.append((f"r{i}", rival, draw(st.integers(1, 100))))
    for seq, (job_id, s, priority) in enumerate(jobs):
        j = JobState(
            id=job_id,
            tenant="t",
            spec=s,
            submitted_seq=seq,
            submitted_at=0.0,
            phase="admitted",
            priority=priority,
        )
        j.admission = Admission(job_id, 0, s.replicas)
        if job_id == "back":
            j.kept_place = place
        indexes.add(state, j)
    spoiled = draw(st.sampled_from([None, "sick", "cordoned"]))
    if spoiled is not None:
        w = draw(st.sampled_from(workers))
        node = state.nodes[w.node]
        if spoiled == "sick":
            g = node.gpus[w.gpus[0].gpu]
            g.healthy, g.signal = False, "xid:79"
        else:
            node.cordoned = True
    return state, place, spoiled


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(held_places())
def test_a_held_place_wholly_free_and_passing_the_chain_is_the_one_taken(
    scenario: tuple[State, Placement, str | None],
) -> None:
    state, place, spoiled = scenario
    events = decide(state, 2000.0)
    placed = {p.job_id: p for e in events if isinstance(e, JobsPlaced) for p in e.placements}
    if spoiled is None:
        assert "back" in placed and placed["back"].workers == place.workers
    for p in placed.values():
        check_placement(state, p)
    check_cycle(state, 2000.0)
