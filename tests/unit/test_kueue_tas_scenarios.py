"""Kueue's Topology-Aware Scheduling (TAS), as corral's validation and placer answer it.

The cases follow Kueue (github.com/kubernetes-sigs/kueue): ``TestFindTopologyAssignment`` in
``pkg/cache/tas_cache_test.go`` (as of commit 02eb5698), the TAS concepts page
(``site/content/en/docs/concepts/topology_aware_scheduling.md``: "Capacity calculation", "User-facing
APIs") and KEP-2724 (``keps/2724-topology-aware-scheduling/README.md``: "Computing the assignment"
and its BestFit example). Each case carries Kueue's name, which its test id spells, and where it
comes from (``Case.source``).

Translation.

- Levels. Kueue's ``cloud.com/topology-block`` > ``cloud.com/topology-rack`` >
  ``kubernetes.io/hostname`` are corral's ``block`` > ``rack`` > node labels and levels (corral has
  one more below, the NVLink island, which these nodes, one NVSwitch each, do not split). A
  domain is named by its path: Kueue's rack ``r1`` of block ``b1`` and its rack ``r1`` of block
  ``b2`` are two racks, and so they are to corral.
- Requests. ``podset-required-topology: <level>`` is ``Topology(pack=<level>, required=True)``,
  ``podset-preferred-topology`` the same with ``required=False``, ``podset-unconstrained-topology``
  (and no annotation, which Kueue reads as unconstrained) is ``pack="none"``.
- Capacity. Kueue's test pods ask for one CPU each and its nodes allocate a few CPUs: a pod is a
  worker of one whole GPU and a node of N CPUs a node of N H100 GPUs (CPU and memory to spare),
  so a node holds as many workers as Kueue's holds pods.
- Outcomes. A Kueue assignment is the workers each node gets; a ``wantReason`` is a gang that is
  not placed. Where the idle cluster could never hold it, corral rejects it at submission
  (``services/admission/validate.py``, the placer's own search over an idle copy of the nodes)
  where Kueue leaves it pending: DESIGN §6, admission. Where it could, the gang waits admitted,
  unplaced, with a reason that names the domain it asked for.

Where corral answers otherwise on purpose, the case expects corral's answer and ``why`` says why
(DESIGN §6, placer, says the same):

- Unconstrained. A corral job that asks for no topology asks for none: its workers go where FGD's
  fragmentation score puts them (DESIGN §6, placer), not where Kueue's LeastFreeCapacity profile
  (the hosts with least free first) does. Kueue's default, BestFit, agrees with it here.
- Within the domain asked for. Kueue descends the tree: the fewest racks of the block, then the
  fewest nodes. corral puts a gang on the fewest nodes of the domain it asked for (ranks on one
  node talk over NVLink, not the network), whatever racks they are in.
- Preferred, past the widest domain. Kueue spreads a PodSet that fits no block over the roomiest
  blocks, the last one the tightest that takes the rest; corral places it as a job without
  topology (above), which may pick another last block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from corral.events import subjects
from corral.events.decisions import GpuClaim, JobsPlaced, JobsUnschedulable, Placement, WorkerSlot
from corral.events.jobs import JobSpec, Resources, Topology, TopologyPack
from corral.events.nodes import GpuInfo, NodeInventory
from corral.projections.fold import apply_event
from corral.projections.placement.inventory import Inventory
from corral.projections.state import JobState
from corral.services.admission.validate import validate
from corral.services.placer.decide import decide
from tests.builders import TRAIN, LogBuilder

TAS = "pkg/cache/tas_cache_test.go"
DOCS = "site/content/en/docs/concepts/topology_aware_scheduling.md"
KEP = "keps/2724-topology-aware-scheduling/README.md"


def _path(name: str) -> tuple[str, str]:
    """Kueue names its test nodes by their path, ``b1-r2-x3``: the block and rack."""
    block, rack, _ = name.split("-")
    return block, rack


# Kueue's trees, as node -> GPUs (pods it holds); the block and rack come from the name (Kueue's
# x5 of the first is "b2-r2-x5", labelled rack r1: here it is named by its labels).
#      b1                   b2
#   /      \             /      \
#  r1       r2          r1       r2
#  |      /  |  \       |         |
#  x1    x2  x3  x4     x5       x6
DEFAULT = {"b1-r1-x1": 1, "b1-r2-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1, "b2-r1-x5": 1, "b2-r2-x6": 2}
#       b1           b2
#       |             |
#       r1           r1
#     /  |  \       /  \
#   x1  x2  x3     x4  x5
SCATTERED = {"b1-r1-x1": 4, "b1-r1-x2": 1, "b1-r1-x3": 1, "b2-r1-x4": 2, "b2-r1-x5": 1}
#           b1                    b2
#       /        \             /      \
#      r1         r2          r1       r2
#     /  \      /   \        /   \    /   \
#    x1   x2   x3    x4     x5   x6  x7    x8
BINARY = {f"b{1 + i // 4}-r{1 + i // 2 % 2}-x{i + 1}": 1 for i in range(8)}


@dataclass(frozen=True)
class Case:
    name: str  # Kueue's
    source: str
    nodes: Mapping[str, int]
    count: int
    pack: TopologyPack = "none"
    required: bool = False
    gpus: int = 1  # per worker: Kueue's pod's CPUs
    min_count: int | None = None  # an elastic gang's least
    # Each node's workers, "waits: <words of the reason>" or "rejected: <words of the reason>".
    want: Mapping[str, int] | str = field(default_factory=dict)
    busy: Mapping[str, int] = field(default_factory=dict)  # GPUs of a node another job holds
    cordoned: tuple[str, ...] = ()
    unhealthy: tuple[str, ...] = ()  # nodes whose GPU 0 the health monitor marked unhealthy
    why: str = ""  # where corral answers otherwise on purpose


CASES = [
    # -- required: one domain or nothing -----------------------------------------------------------
    Case(
        "rack required; multiple Pods fit in a rack; BestFit",
        TAS,
        DEFAULT,
        3,
        "rack",
        True,
        want={"b1-r2-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1},
    ),
    Case(
        "rack required; multiple Pods fit in some racks; BestFit",
        TAS,
        DEFAULT,
        2,
        "rack",
        True,
        want={"b2-r2-x6": 2},  # b1's r2 holds three: b2's r2 is the tighter fit
    ),
    Case(
        "rack required; too many pods to fit in any rack; BestFit",
        TAS,
        DEFAULT,
        4,
        "rack",
        True,
        want="rejected: the most one rack holds is 3",
        why="Kueue leaves it pending; no rack of the idle cluster holds it, so corral rejects it",
    ),
    Case(
        "rack required; a rack that could hold it is busy: the gang waits, in no two racks",
        DOCS + " (User-facing APIs: required)",
        DEFAULT,
        3,
        "rack",
        True,
        busy={"b1-r2-x3": 1},
        want="waits: no room for all 3 workers",
    ),
    Case(
        "block required; 4 pods fit into one host each; BestFit",
        TAS,
        BINARY,
        4,
        "block",
        True,
        want={"b1-r1-x1": 1, "b1-r1-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1},
    ),
    Case(
        "block required; Pods fit in a block spread across two racks; BestFit",
        TAS,
        DEFAULT,
        4,
        "block",
        True,
        want={"b1-r1-x1": 1, "b1-r2-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1},
    ),
    Case(
        "block required; too many Pods to fit requested; BestFit",
        TAS,
        DEFAULT,
        5,
        "block",
        True,
        want="rejected: the most one block holds is 4",
        why="Kueue leaves it pending; no block of the idle cluster holds it, so corral rejects it",
    ),
    Case(
        "block required; single Pod which cannot be split; BestFit",
        TAS,
        DEFAULT,
        1,
        "block",
        True,
        gpus=4,
        want="rejected: needs 4 GPUs per worker; the largest node has 2",
        why="Kueue leaves it pending; no node of the idle cluster holds the worker, so corral rejects it",
    ),
    Case(
        "minimize the number of used racks before optimizing the number of nodes; BestFit",
        TAS,
        {"b1-r1-x1": 2, "b1-r2-x2": 2, "b1-r3-x3": 1, "b1-r3-x4": 1, "b1-r3-x5": 1, "b1-r3-x6": 1},
        4,
        "block",
        True,
        want={"b1-r1-x1": 2, "b1-r2-x2": 2},
        why="Kueue takes rack r3's four nodes; corral the fewest nodes of the block (NVLink within)",
    ),
    Case(
        "choose the node that can accommodate all Pods",
        TAS,
        {"b1-r1-x1": 2, "b1-r1-x2": 1, "b1-r1-x3": 1},
        2,
        "block",
        True,
        want={"b1-r1-x1": 2},
    ),
    Case(
        "minimize resource fragmentation; LeastFreeCapacityFit",
        TAS,
        {"b1-r1-x1": 2, "b1-r1-x2": 1, "b1-r1-x3": 1},
        2,
        "block",
        True,
        want={"b1-r1-x1": 2},
        why="Kueue's LeastFreeCapacity profile takes x3 and x2; corral answers as its default, BestFit "
        '("choose the node that can accommodate all Pods"): one node, closer ranks',
    ),
    Case(
        "BestFit example: the last node is the one the rest fills, not the next roomiest",
        KEP + " (Computing the assignment, Example)",
        {"b1-r1-x1": 3, "b1-r1-x2": 3, "b1-r1-x3": 2, "b1-r1-x4": 1},
        7,
        "rack",
        True,
        want={"b1-r1-x1": 3, "b1-r1-x2": 3, "b1-r1-x4": 1},
    ),
    Case(
        "host required; the tightest host that holds the whole gang",
        KEP + " (Computing the assignment: BestFit's last domain)",
        {"b1-r1-x1": 4, "b1-r1-x2": 2, "b1-r2-x3": 3},
        2,
        "node",
        True,
        want={"b1-r1-x2": 2},
    ),
    # -- preferred: the level asked for, else the next one up --------------------------------------
    Case(
        "rack preferred; but only block can accommodate the workload; BestFit",
        TAS,
        DEFAULT,
        4,
        "rack",
        False,
        want={"b1-r1-x1": 1, "b1-r2-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1},
    ),
    Case(
        "rack preferred; a rack holds it: placed there, not spread",
        TAS + " (rack required; multiple Pods fit in a rack)",
        DEFAULT,
        3,
        "rack",
        False,
        want={"b1-r2-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1},
    ),
    Case(
        "rack preferred; but only multiple blocks can accommodate the workload; BestFit",
        TAS,
        DEFAULT,
        6,
        "rack",
        False,
        want={"b1-r1-x1": 1, "b1-r2-x2": 1, "b1-r2-x3": 1, "b1-r2-x4": 1, "b2-r2-x6": 2},
    ),
    Case(
        "block preferred; Pods fit in 2 blocks; BestFit",
        TAS,
        {"b1-r1-x1": 2, "b2-r1-x2": 1, "b3-r1-x3": 4},
        5,
        "block",
        False,
        want={"b3-r1-x3": 4, "b1-r1-x1": 1},
        why="Kueue's last block is b2, the one the rest fills; past the widest domain corral packs as "
        "for no topology (FGD), and b1 is where it scores best",
    ),
    # -- unconstrained -------------------------------------------------------------------------------
    Case(
        "unconstrained; 2 pods fit into hosts scattered across the whole datacenter even they "
        "could fit into single rack; LeastFreeCapacity",
        TAS,
        SCATTERED,
        2,
        want={"b1-r1-x1": 2},
        why="Kueue's LeastFreeCapacity fills the hosts with least free first; corral's packing is FGD's",
    ),
    Case(
        "no annotation; implied default to unconstrained; 6 pods fit into hosts scattered across "
        "the whole datacenter even they could fit into single rack; BestFit",
        TAS,
        SCATTERED,
        6,
        want={"b1-r1-x1": 4, "b2-r1-x4": 2},
    ),
    # -- what counts as capacity ---------------------------------------------------------------------
    Case(
        "only ready, schedulable nodes count: a cordoned node's rack is too small",
        DOCS + " (Capacity calculation)",
        DEFAULT,
        3,
        "rack",
        True,
        cordoned=("b1-r2-x3",),
        want="waits: no room for all 3 workers",
    ),
    Case(
        "only ready, schedulable nodes count: an unhealthy GPU's rack is too small",
        DOCS + " (Capacity calculation)",
        DEFAULT,
        2,
        "rack",
        True,
        unhealthy=("b2-r2-x6",),
        want={"b1-r2-x2": 1, "b1-r2-x3": 1},
    ),
    # -- workers of several GPUs ---------------------------------------------------------------------
    Case(
        "rack required; workers of 2 GPUs each go by whole workers a node holds",
        TAS + " (rack required; multiple Pods fit in some racks, pods of 2 CPUs)",
        {"b1-r1-x1": 3, "b1-r1-x2": 3, "b1-r2-x3": 4, "b2-r1-x4": 8},
        2,
        "rack",
        True,
        gpus=2,
        want={"b1-r2-x3": 2},  # b1's r1 has 6 GPUs but holds one worker per node
    ),
]


def _inventory(name: str, gpus: int) -> NodeInventory:
    block, rack = _path(name)
    infos = tuple(
        GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="H100-80GB", memory_mib=81_559, island=0)
        for i in range(gpus)
    )
    return NodeInventory(
        cpu_milli=64_000, memory_mib=512_000, gpus=infos, labels={"block": block, "rack": rack}
    )


def _spec(case: Case) -> JobSpec:
    return JobSpec(
        queue="team-a",
        resources=Resources(gpus=case.gpus),
        replicas=case.count,
        min_replicas=case.min_count,
        topology=Topology(case.pack, case.required),
        command=TRAIN,
    )


def _world(case: Case) -> LogBuilder:
    log = LogBuilder().queue("team-a")
    for name, gpus in case.nodes.items():
        log.node(name, _inventory(name, gpus))
    for n, (name, held) in enumerate(case.busy.items()):
        job_id = f"busy-{n}"
        busy = JobSpec(queue="team-a", resources=Resources(gpus=held), command=TRAIN)
        log.submit("alice", job_id, busy).accept(job_id).admit(job_id)
        log.place(Placement(job_id, 0, (WorkerSlot(0, name, tuple(GpuClaim(g) for g in range(held))),)))
        log.started(name, job_id)
    for name in case.cordoned:
        log.cordon(name)
    for name in case.unhealthy:
        log.gpu_health(name, 0, healthy=False)
    return log


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kueue_tas(case: Case) -> None:
    log = _world(case)
    spec = _spec(case)
    submitted = JobState(id="j", tenant="alice", spec=spec, submitted_seq=1, submitted_at=0.0)
    refused = validate(log.fold(), submitted)
    if isinstance(case.want, str) and case.want.startswith("rejected: "):
        assert refused is not None and case.want.removeprefix("rejected: ") in refused.message, refused
        return
    assert refused is None, refused
    log.submit("alice", "j", spec).accept("j").admit("j", replicas=case.count)
    state = log.fold()
    events = decide(state, 5000.0)
    placed = {p.job_id: p for e in events if isinstance(e, JobsPlaced) for p in e.placements}
    if isinstance(case.want, str):
        assert "j" not in placed, placed
        waiting = [u for e in events if isinstance(e, JobsUnschedulable) for u in e.jobs if u.job_id == "j"]
        reasons = [r for u in waiting for r in u.reasons]
        assert any(case.want.removeprefix("waits: ") in r.message for r in reasons), reasons
        if case.pack != "none":
            assert any(f"in one {case.pack}" in r.message for r in reasons), reasons
        return
    assert "j" in placed, events
    got = Counter(w.node for w in placed["j"].workers)
    assert dict(got) == dict(case.want)
    seq = state.seq
    for ev in events:  # the fold takes the placement as proposed
        seq += 1
        apply_event(state, seq, subjects.decision("placer"), ev, state.time + 1)
    assert state.void_total == 0 and state.jobs["j"].placement is not None


def test_racks_are_named_by_their_block_too() -> None:
    # Kueue's concepts page: "there could be two nodes with the same 'rack' label, but in different
    # 'blocks'". Rack r2 of b1 holds three workers and rack r2 of b2 two: read as one rack "r2" of
    # five, a gang of four asking for one rack was placed over two blocks.
    case = Case("", DOCS, DEFAULT, 4, "rack", True)
    log = _world(case)
    log.submit("alice", "j", _spec(case)).accept("j").admit("j", replicas=4)
    events = decide(log.fold(), 5000.0)
    assert not [p for e in events if isinstance(e, JobsPlaced) for p in e.placements]


def test_an_elastic_gang_is_admitted_at_the_most_one_rack_holds() -> None:
    # KEP-2724, "Support for Elastic Workloads": a gang that may run smaller is still kept in its
    # domain. Admission admits it at the most workers the idle cluster holds as its topology asks.
    case = Case("", KEP, DEFAULT, 5, "rack", True, min_count=2)
    state = _world(case).fold()
    job = JobState(id="j", tenant="alice", spec=_spec(case), submitted_seq=1, submitted_at=0.0)
    assert validate(state, job) is None
    assert Inventory(state).most_workers(job) == 3  # b1's r2, not b1's and b2's r2 read as one
