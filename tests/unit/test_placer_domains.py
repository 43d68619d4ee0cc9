"""Where a gang's topology keeps it, through the real placer and the fold: the ranks an elastic
job grows by stay in the island, node, rack or block its running workers hold when its topology
is required (KAI-Scheduler's topology plugin, ``job_filtering_test.go``, "mixed task statuses
with required constraint - choose zone with existing pods"; Kueue's "elastic workload scale up:
delta-only placement preserves previous assignment"); and a rack asked for with a node selector
is found among racks of other pools however many come first (Kueue's ``tas_cache_test.go``,
"only nodes with matching labels are considered; matching node is found"), in its own block's
rack of that name (Kueue's TAS concepts: rack labels are unique within a block only)."""

from __future__ import annotations

from corral.events import subjects
from corral.events.decisions import GpuClaim, Placement, WorkerSlot
from corral.events.jobs import JobSpec, Resources, Topology
from corral.events.nodes import GpuInfo, NodeInventory
from corral.projections.fold import apply_event
from corral.projections.state import State
from corral.services.placer.decide import decide
from tests.builders import LogBuilder


def inv(gpus: int, islands: list[int] | None = None, labels: dict[str, str] | None = None) -> NodeInventory:
    isl = islands if islands is not None else [0] * gpus
    infos = tuple(
        GpuInfo(index=i, uuid=f"GPU-{i}-{id(isl)}", model="H100-80GB", memory_mib=81_559, island=isl[i])
        for i in range(gpus)
    )
    return NodeInventory(cpu_milli=64_000, memory_mib=512_000, gpus=infos, labels=labels or {})


def spec(replicas: int = 1, pack: str = "none", required: bool = False, **kw: object) -> JobSpec:
    topology = Topology(pack=pack, required=required)  # type: ignore[arg-type]
    return JobSpec(queue="team-a", resources=Resources(gpus=1), replicas=replicas, topology=topology, **kw)  # type: ignore[arg-type]


def running(log: LogBuilder, job_id: str, s: JobSpec, node: str, *gpus: int) -> None:
    log.submit("alice", job_id, s).accept(job_id).admit(job_id, replicas=1 if s.min_replicas else s.replicas)
    if not s.min_replicas and s.replicas != len(gpus):  # a plain job of several GPUs, one worker
        raise AssertionError("one worker per GPU in these cases")
    workers = tuple(WorkerSlot(r, node, (GpuClaim(g),)) for r, g in enumerate(gpus))
    log.place(Placement(job_id, 0, workers))
    for r in range(len(gpus)):
        log.started(node, job_id, rank=r)


def cycle(log: LogBuilder) -> State:
    state = log.fold()
    seq = state.seq
    for ev in decide(state, 5000.0):
        seq += 1
        apply_event(state, seq, subjects.decision("placer"), ev, state.time + 1)
    assert state.void_total == 0
    return state


def grown_on(state: State, job_id: str) -> list[tuple[str, int]]:
    p = state.jobs[job_id].placement
    assert p is not None
    return [(w.node, w.gpus[0].gpu) for w in p.workers]


def test_a_grown_gang_stays_in_the_block_its_workers_run_in() -> None:
    log = LogBuilder().queue("team-a")
    log.node("node1", inv(2, labels={"block": "z1"})).node("node2", inv(3, labels={"block": "z2"}))
    running(log, "j", spec(3, "block", True, min_replicas=1), "node2", 0)
    log.grow("j", 3)
    got = grown_on(cycle(log), "j")
    assert len(got) == 3 and {n for n, _ in got} == {"node2"}, got  # node1 is the tighter fit


def test_a_grown_gang_stays_on_the_node_its_workers_run_on() -> None:
    log = LogBuilder().queue("team-a").node("nodeA", inv(8)).node("nodeB", inv(8))
    running(log, "filler", spec(7), "nodeB", *range(7))
    running(log, "j", spec(2, "node", True, min_replicas=1), "nodeA", 0)
    log.grow("j", 2)
    got = grown_on(cycle(log), "j")
    assert len(got) == 2 and {n for n, _ in got} == {"nodeA"}, got


def test_a_grown_gang_stays_in_the_nvlink_island_its_workers_use() -> None:
    log = LogBuilder().queue("team-a").node("n", inv(8, islands=[0, 0, 0, 0, 1, 1, 1, 1]))
    running(log, "filler", spec(3), "n", 4, 5, 6)
    running(log, "j", spec(2, "nvlink", True, min_replicas=1), "n", 0)
    log.grow("j", 2)
    got = grown_on(cycle(log), "j")
    assert len(got) == 2 and all(g < 4 for _, g in got), got  # island 1's last GPU is tighter


def test_a_grown_gang_that_must_spread_goes_to_nodes_its_workers_are_not_on() -> None:
    # The added ranks were kept apart from each other only: with the other nodes full, the
    # placer put rank 1 beside rank 0 on nodeA.
    log = LogBuilder().queue("team-a").node("nodeA", inv(8)).node("nodeB", inv(8)).node("nodeC", inv(8))
    running(log, "filler", spec(8), "nodeB", *range(8))
    running(log, "j", spec(3, "spread", True, min_replicas=1), "nodeA", 0)
    log.grow("j", 2)
    assert [n for n, _ in grown_on(cycle(log), "j")] == ["nodeA", "nodeC"]
    full = LogBuilder().queue("team-a").node("nodeA", inv(8)).node("nodeB", inv(8))
    running(full, "filler", spec(8), "nodeB", *range(8))
    running(full, "j", spec(2, "spread", True, min_replicas=1), "nodeA", 0)
    full.grow("j", 2)
    assert [n for n, _ in grown_on(cycle(full), "j")] == ["nodeA"]  # no node for rank 1: it waits
    loose = LogBuilder().queue("team-a").node("nodeA", inv(8)).node("nodeB", inv(8))
    running(loose, "filler", spec(8), "nodeB", *range(8))
    running(loose, "j", spec(2, "spread", False, min_replicas=1), "nodeA", 0)
    loose.grow("j", 2)
    assert [n for n, _ in grown_on(cycle(loose), "j")] == ["nodeA", "nodeA"]  # spread as far as it can


def test_a_required_rack_with_a_node_selector_is_found_behind_many_of_other_pools() -> None:
    # Forty racks hold a node of each pool; counted whole they look roomy enough, and past 32
    # of them the one rack with room in pool a was never tried: the gang stayed unplaced (and
    # admission rejected it as never fitting, on an idle cluster).
    log = LogBuilder().queue("team-a")
    for i in range(40):
        log.node(f"r{i:02d}-a", inv(1, labels={"rack": f"r{i:02d}", "pool": "a"}))
        log.node(f"r{i:02d}-b", inv(1, labels={"rack": f"r{i:02d}", "pool": "b"}))
    log.node("zz-a1", inv(2, labels={"rack": "zz", "pool": "a"})).node(
        "zz-a2", inv(2, labels={"rack": "zz", "pool": "a"})
    )
    log.submit("alice", "j", spec(2, "rack", True, node_selector={"pool": "a"})).accept("j").admit(
        "j", replicas=2
    )
    got = grown_on(cycle(log), "j")
    assert {n.split("-")[0] for n, _ in got} == {"zz"}, got


def test_a_grown_gang_stays_in_its_own_blocks_rack_of_that_name() -> None:
    # Racks are named within their block (Kueue's TAS: "there could be two nodes with the same
    # 'rack' label, but in different 'blocks'"). Kept to the label "rack=r1" alone, the added
    # ranks went to rack r1 of block b2, roomier per node and the tighter rack.
    log = LogBuilder().queue("team-a")
    log.node("a1", inv(1, labels={"block": "b1", "rack": "r1"}))
    log.node("a2", inv(4, labels={"block": "b1", "rack": "r1"}))
    log.node("a3", inv(4, labels={"block": "b1", "rack": "r1"}))
    log.node("c1", inv(6, labels={"block": "b2", "rack": "r1"}))
    running(log, "j", spec(3, "rack", True, min_replicas=1), "a1", 0)
    log.grow("j", 3)
    got = grown_on(cycle(log), "j")
    assert len(got) == 3 and {n for n, _ in got} <= {"a1", "a2", "a3"}, got
