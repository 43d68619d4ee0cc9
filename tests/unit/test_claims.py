"""GPU, CPU and memory arithmetic of placements, without the fold around it: the size of a claim,
the shape a worker's claims must have, and that taking then releasing a placement gives back
exactly the state it started from."""

from __future__ import annotations

import msgspec
import pytest

from corral.events.decisions import GpuClaim, Placement
from corral.events.jobs import Resources
from corral.projections import claims
from corral.projections.state import JobState, State
from tests.builders import (
    Cluster,
    LogBuilder,
    SpecLike,
    job,
    mig_slot,
    placement,
    share,
    spec_of,
    whole,
    worker,
)

N0, N1, M0 = "node-00", "node-01", "mig-00"


def cluster_state() -> State:
    """Two 8×H100 nodes and one 8×H100 node in MIG mode."""
    return LogBuilder().nodes(Cluster(2)).nodes(Cluster(1, "h100-8x-mig", prefix="mig")).fold()


def job_state(spec: SpecLike, job_id: str = "j1") -> JobState:
    return JobState(job_id, "alice", spec_of(spec), 1, 0.0)


def copy(state: State) -> State:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)


@pytest.mark.parametrize(
    ("model", "claim", "milli"),
    [
        ("H100-80GB", GpuClaim(0), 1000),
        ("H100-80GB", GpuClaim(0, milli=250), 250),
        ("H100-80GB", mig_slot(0, "7g.80gb", 0), 1000),
        ("H100-80GB", mig_slot(0, "4g.40gb", 0), 500),
        ("H100-80GB", mig_slot(0, "3g.40gb", 4), 500),
        ("H100-80GB", mig_slot(0, "1g.20gb", 6), 250),
        ("H100-80GB", mig_slot(0, "1g.10gb", 3), 125),
        ("H100-80GB", mig_slot(0, "1g.10gb+me", 3), 125),
        ("A100-40GB", mig_slot(0, "1g.5gb", 3), 125),
        ("H100-80GB", mig_slot(0, "1g.5gb", 3), 0),
        ("T4", mig_slot(0, "1g.10gb", 0), 0),
    ],
    ids=[
        "whole",
        "quarter",
        "7g",
        "4g",
        "3g",
        "1g-2-slices",
        "1g",
        "1g+me",
        "a100-40-1g",
        "wrong-model",
        "no-mig",
    ],
)
def test_claim_size_in_milli_gpu(model: str, claim: GpuClaim, milli: int) -> None:
    assert claims.claim_milli(model, claim) == milli


@pytest.mark.parametrize(
    ("res", "gpus", "ok"),
    [
        (Resources(gpus=2), (whole(0), whole(1)), True),
        (Resources(gpus=2), (whole(0),), False),
        (Resources(gpus=2), (whole(0), whole(0)), False),
        (Resources(gpus=2), (whole(0), share(1, 500)), False),
        (Resources(gpus=0), (), True),
        (Resources(gpus=0), (whole(0),), False),
        (Resources(gpus=1, gpu_milli=300), (share(0, 300),), True),
        (Resources(gpus=1, gpu_milli=300), (share(0, 400),), False),
        (Resources(gpus=1, gpu_milli=300), (share(0, 150), share(1, 150)), False),
        (Resources(gpus=1, gpu_milli=300), (mig_slot(0, "1g.10gb", 0),), False),
        (Resources(gpus=1, mig="3g.40gb"), (mig_slot(0, "3g.40gb", 4),), True),
        (Resources(gpus=1, mig="3g.40gb"), (mig_slot(0, "1g.10gb", 4),), False),
        (Resources(gpus=1, mig="3g.40gb"), (whole(0),), False),
        (Resources(gpus=1, mig="3g.40gb"), (mig_slot(0, "3g.40gb", 0), mig_slot(1, "3g.40gb", 0)), False),
        (Resources(gpus=1), (GpuClaim(0, milli=999),), False),
    ],
    ids=[
        "two-whole",
        "one-short",
        "same-gpu-twice",
        "share-for-whole",
        "cpu-only",
        "gpu-for-cpu-only",
        "share",
        "share-wrong-size",
        "share-split",
        "mig-for-share",
        "mig",
        "mig-wrong-profile",
        "whole-for-mig",
        "two-mig-for-one",
        "999-for-whole",
    ],
)
def test_worker_shape(res: Resources, gpus: tuple[GpuClaim, ...], ok: bool) -> None:
    if ok:
        claims.check_worker_shape(res, gpus)
    else:
        with pytest.raises(claims.ClaimError) as exc:
            claims.check_worker_shape(res, gpus)
        assert exc.value.reason.code == "shape"


ROUND_TRIPS: list[tuple[str, SpecLike, Placement]] = [
    (
        "whole-gpus",
        job().gpus(4).cpu(16_000).memory(1 << 16),
        placement("j1", worker(0, N0, *map(whole, (0, 1, 2, 3)))),
    ),
    (
        "gang-across-nodes",
        job().gpus(8).replicas(2),
        placement("j1", worker(0, N0, *map(whole, range(8))), worker(1, N1, *map(whole, range(8)))),
    ),
    ("share", job().milli(250), placement("j1", worker(0, N0, share(3, 250)))),
    (
        "gang-sharing-one-gpu",
        job().milli(500).replicas(2),
        placement("j1", worker(0, N0, share(3, 500)), worker(1, N0, share(3, 500))),
    ),
    ("mig", job().mig("3g.40gb"), placement("j1", worker(0, M0, mig_slot(2, "3g.40gb", 4)))),
    (
        "mig-gang-on-one-gpu",
        job().mig("1g.10gb").replicas(3),
        placement("j1", *(worker(r, M0, mig_slot(0, "1g.10gb", r)) for r in range(3))),
    ),
]


@pytest.mark.parametrize(("spec", "p"), [r[1:] for r in ROUND_TRIPS], ids=[r[0] for r in ROUND_TRIPS])
def test_check_take_release_gives_back_exactly_what_it_took(spec: SpecLike, p: Placement) -> None:
    state = cluster_state()
    j = job_state(spec)
    before = copy(state)
    claims.check(state, j, p)
    assert state == before  # checking changes nothing
    claims.take(state, j, p)
    assert j.held == p and state != before
    for w in p.workers:
        node = state.nodes[w.node]
        assert node.cpu_used > 0 and node.memory_used > 0
        for c in w.gpus:
            g = node.gpus[c.gpu]
            assert g.holders.get("j1", 0) > 0 and g.used_milli == sum(g.holders.values()) <= 1000
    full = [
        c for w in p.workers for c in w.gpus if c.mig or state.nodes[w.node].gpus[c.gpu].free_milli < c.milli
    ]
    if full:  # the same claims again, for another job, no longer fit
        with pytest.raises(claims.ClaimError):
            claims.check(state, job_state(spec, "j2"), msgspec.structs.replace(p, job_id="j2"))
    claims.release(state, j)
    assert j.held is None and state == before


def test_release_of_nothing_is_nothing() -> None:
    state = cluster_state()
    before = copy(state)
    claims.release(state, job_state(job()))
    assert state == before


def test_release_tolerates_a_node_that_left_or_shrank() -> None:
    state = cluster_state()
    j = job_state(job().gpus(2).replicas(2))
    p = placement("j1", worker(0, N0, whole(6), whole(7)), worker(1, N1, whole(0), whole(1)))
    claims.take(state, j, p)
    del state.nodes[N1]
    state.nodes[N0].gpus = state.nodes[N0].gpus[:7]
    claims.release(state, j)
    assert j.held is None and state.nodes[N0].cpu_used == 0 and state.nodes[N0].gpus[6].holders == {}


def test_gang_cpu_is_summed_per_node() -> None:
    state = cluster_state()
    j = job_state(job().gpus(1).cpu(112_000).replicas(3))
    spread = placement("j1", worker(0, N0, whole(0)), worker(1, N0, whole(1)), worker(2, N1, whole(0)))
    claims.check(state, j, spread)
    packed = placement("j1", *(worker(r, N0, whole(r)) for r in range(3)))
    with pytest.raises(claims.ClaimError) as exc:
        claims.check(state, j, packed)
    assert exc.value.reason.code == "cpu"


@pytest.mark.parametrize(
    ("first", "second", "code"),
    [
        (share(0, 600), share(0, 500), "busy"),
        (share(0, 500), whole(0), "busy"),
        (whole(0), share(0, 1), "busy"),
        (mig_slot(0, "3g.40gb", 0), mig_slot(0, "2g.20gb", 2), "mig"),
    ],
    ids=["shares-over-1000", "whole-on-shared", "share-on-whole", "mig-overlap"],
)
def test_second_claim_on_a_busy_gpu_is_refused(first: GpuClaim, second: GpuClaim, code: str) -> None:
    state = cluster_state()
    node = M0 if first.mig else N0

    def spec_for(c: GpuClaim) -> SpecLike:
        if c.mig is not None:
            return job().mig(c.mig.profile)
        return job().milli(c.milli) if c.milli < 1000 else job().gpus(1)

    a = job_state(spec_for(first), "a")
    claims.take(state, a, placement("a", worker(0, node, first)))
    with pytest.raises(claims.ClaimError) as exc:
        claims.check(state, job_state(spec_for(second), "b"), placement("b", worker(0, node, second)))
    assert exc.value.reason.code == code


def _most_workers(state: State, node: str, most: int) -> None:
    n = state.nodes[node]
    n.inventory = msgspec.structs.replace(n.inventory, max_workers=most)


def test_a_node_runs_at_most_its_max_workers_of_any_jobs() -> None:
    # Workers of no GPU that ask a milli-CPU each: CPU and memory alone would put 1,000 on a node.
    state = cluster_state()
    _most_workers(state, N0, 3)
    slivers = job().gpus(0).cpu(1).memory(1)
    gang = job_state(slivers.replicas(4))
    with pytest.raises(claims.ClaimError) as exc:
        claims.check(state, gang, placement("j1", *(worker(r, N0) for r in range(4))))
    assert exc.value.reason.code == "workers"
    three = job_state(slivers.replicas(3))
    claims.place(state, three, placement("j1", *(worker(r, N0) for r in range(3))))
    assert state.nodes[N0].workers == 3
    with pytest.raises(claims.ClaimError) as exc:
        claims.check(state, job_state(slivers, "j2"), placement("j2", worker(0, N0)))
    assert exc.value.reason.code == "workers"
    claims.check(state, job_state(slivers, "j2"), placement("j2", worker(0, N1)))  # another node has room
    claims.release_rank(state, three, 2)
    assert state.nodes[N0].workers == 2
    claims.place(state, job_state(slivers, "j2"), placement("j2", worker(0, N0)))
    claims.release(state, three)
    assert state.nodes[N0].workers == 1
