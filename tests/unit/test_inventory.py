"""Whether any node could ever host a job (``projections.placement.inventory``): one case per
reason, on a small mixed cluster, and which nodes make up the inventory."""

from __future__ import annotations

import pytest

from corral.events.jobs import JobSpec
from corral.events.queues import CordonNode
from corral.projections import indexes
from corral.projections.placement.inventory import CODE, MIN_SPECS, Inventory, never_fits
from corral.projections.state import JobState, State
from corral.services.agent.inventory import h100_8x_nvswitch, t4_2x
from tests.builders import Cluster, JobBuilder, LogBuilder, job

# node-00 h100-8x (8 H100-80GB, one NVLink island, 224 CPUs, 2 TiB), node-01 a100-8x (8
# A100-80GB in NVLink pairs, 128 CPUs), node-02 a100-4x-pcie (4 A100-40GB, PCIe), node-03 t4-2x
# (2 T4), all in rack-0; node-04 h100-8x-mig (8 H100-80GB in MIG mode) in rack-1.
MIXED = Cluster(5, "mixed")


def _job(spec: JobSpec | JobBuilder, job_id: str = "j") -> JobState:
    spec = spec.build() if isinstance(spec, JobBuilder) else spec
    return JobState(id=job_id, tenant="alice", spec=spec, submitted_seq=1, submitted_at=0.0)


def _mixed() -> State:
    return LogBuilder().nodes(MIXED).fold()


CASES: list[tuple[str, JobBuilder, str | None]] = [
    # hostable: what some node (or the cluster) has
    ("one-h100-node", job().gpus(8), None),
    ("mig-slice", job().mig("1g.10gb"), None),
    ("cpu-only", job().gpus(0).cpu(200_000), None),
    ("two-nodes-anywhere", job().gpus(8).replicas(2), None),
    ("one-rack", job().gpus(8).replicas(2).pack("rack", required=True), None),
    ("nvlink-preferred", job().gpus(8).replicas(2).pack("nvlink"), None),
    ("elastic-at-its-minimum", job().gpus(8).replicas(4, minimum=2), None),
    # one worker fits on no node
    ("gpus-per-worker", job().gpus(16), "needs 16 GPUs per worker; the largest node has 8"),
    (
        "gpu-model",
        job().models("B200"),
        "no node has GPU model B200 (models: H100-80GB, A100-80GB, A100-40GB, T4)",
    ),
    ("gpus-of-model", job().gpus(8).models("T4"), "needs 8 T4 GPUs per worker; the largest node has 2"),
    (
        "gpu-memory",
        job().gpu_memory(100_000),
        "needs GPUs of at least 100000 MiB; the largest GPU has 81920 MiB",
    ),
    (
        "mig-profile",
        job().mig("1g.5gb").models("A100-40GB"),
        "no node has A100-40GB GPUs that offer MIG profile 1g.5gb (none is in MIG mode)",
    ),
    (
        "mig-mode",
        job().select(profile="h100-8x-mig"),
        "every GPU on a node matching its node_selector is in MIG mode, which serves MIG instances only",
    ),
    ("cpu", job().cpu(300_000), "needs 300 CPUs per worker; the largest node with suitable GPUs has 224"),
    ("cpu-of-cpu-only", job().gpus(0).cpu(300_000), "needs 300 CPUs per worker; the largest node has 224"),
    (
        "memory",
        job().memory(4 * 1024 * 1024),
        "needs 4194304 MiB of memory per worker; the largest node with suitable GPUs has 2097152 MiB",
    ),
    (
        "selector-key",
        job().select(pool="b200"),
        "no node matches node_selector pool=b200 (no node has a pool label)",
    ),
    (
        "selector-value",
        job().select(rack="rack-9"),
        "no node matches node_selector rack=rack-9 (nodes have rack: rack-0, rack-1)",
    ),
    (
        "model-within-selector",
        job().models("T4").select(rack="rack-1"),
        "no node matching its node_selector has GPU model T4 (models: H100-80GB)",
    ),
    # one worker fits, the gang does not, where its topology asks
    (
        "nvlink-island",
        job().gpus(4).replicas(4).pack("nvlink", required=True),
        "needs 4 × 4 = 16 GPUs in one NVLink island; the largest has 8",
    ),
    (
        "nvlink-pairs",
        job().gpus(4).models("A100-80GB").pack("nvlink", required=True),
        "needs 4 GPUs in one NVLink island; the largest has 2",
    ),
    (
        "nvlink-on-pcie",
        job().models("A100-40GB", "T4").replicas(2).pack("nvlink", required=True),
        "in one NVLink island; no node that could host one has NVLink",
    ),
    (
        "one-node",
        job().gpus(8).replicas(2).pack("node", required=True),
        "needs 2 workers of 8 whole GPUs, 1000 milli-CPU, 1024 MiB each on one node; "
        "the most one node holds is 1",
    ),
    (
        "one-rack-too-small",
        job().gpus(8).replicas(3).pack("rack", required=True),
        "each in one rack (rack label); the most one rack holds is 2",
    ),
    (
        "spread",
        job().gpus(8).replicas(3).pack("spread", required=True),
        "each on distinct nodes; only 2 nodes can host one",
    ),
    ("whole-cluster", job().gpus(8).replicas(3), "each; all nodes together hold at most 2"),
    (
        "elastic-minimum-too-big",
        job().gpus(8).replicas(4, minimum=3),
        "needs at least 3 workers of 8 whole GPUs",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_never_fits(spec: JobBuilder, expected: str | None) -> None:
    why = never_fits(_mixed(), _job(spec))
    if expected is None:
        assert why is None
    else:
        assert why is not None, "hostable, it says"
        assert why.code == CODE and not why.preemption_helps
        assert expected in why.message


def test_one_inventory_answers_every_job_as_a_fresh_one_would() -> None:
    """The verdicts an Inventory keeps are the ones a fresh check gives, in any order."""
    state = _mixed()
    inv = Inventory(state)
    jobs = [_job(spec, name) for name, spec, _ in CASES]
    shared = [inv.never_fits(j) for j in jobs]
    assert shared == [never_fits(state, j) for j in reversed(jobs)][::-1]
    assert shared == [inv.never_fits(j) for j in jobs]


def test_with_no_node_registered_nothing_is_refused() -> None:
    """A cluster still starting has no inventory to judge by."""
    assert never_fits(State(), _job(job().gpus(64).models("B200"))) is None
    assert Inventory(State()).empty


def test_a_lost_node_has_left_the_inventory() -> None:
    lb = LogBuilder().node("big", h100_8x_nvswitch("big")).node("small", t4_2x("small"))
    wide = _job(job().gpus(8))
    assert never_fits(lb.fold(), wide) is None
    lb.condition("big", "lost")
    why = never_fits(lb.fold(), wide)
    assert why is not None and "needs 8 GPUs per worker; the largest node has 2" in why.message
    lb.condition("big", "ready")  # back again
    assert never_fits(lb.fold(), wide) is None


def test_every_node_lost_is_no_inventory_either() -> None:
    """The whole cluster gone at once is an outage, not a job too big for it."""
    lb = LogBuilder().node("big", h100_8x_nvswitch("big")).condition("big", "lost")
    assert never_fits(lb.fold(), _job(job().gpus(16))) is None


@pytest.mark.parametrize(
    "trouble",
    [
        lambda lb: lb.admin("cordon", CordonNode(node="big", cordoned=True, drain=True)),
        lambda lb: lb.condition("big", "suspect"),
        lambda lb: [lb.gpu_health("big", g, healthy=False) for g in range(8)],
    ],
    ids=["cordoned-and-draining", "suspect", "every-gpu-unhealthy"],
)
def test_what_comes_back_stays_in_the_inventory(trouble) -> None:  # type: ignore[no-untyped-def]
    lb = LogBuilder().node("big", h100_8x_nvswitch("big")).node("small", t4_2x("small"))
    trouble(lb)
    state = lb.fold()
    assert not state.rejections, [r.message for r in state.rejections]
    assert never_fits(state, _job(job().gpus(8))) is None


def test_a_node_registering_again_with_fewer_gpus_is_judged_anew() -> None:
    """The kept idle copy follows the inventory: same node name, other GPUs."""
    lb = LogBuilder().node("n", h100_8x_nvswitch("n"))
    wide = _job(job().gpus(8))
    assert never_fits(lb.fold(), wide) is None
    inv = h100_8x_nvswitch("n")
    lb.node("n", type(inv)(inv.cpu_milli, inv.memory_mib, inv.gpus[:4]))
    why = never_fits(lb.fold(), wide)
    assert why is not None and "needs 8 GPUs per worker; the largest node has 4" in why.message


def test_the_queued_jobs_are_judged_shape_by_shape_as_job_by_job() -> None:
    """``unhosted_queued`` reads the fold's jobs per host shape: it finds what a job-by-job walk
    of the queued jobs finds, with the same reasons, for jobs of every case twice over."""
    log = LogBuilder().nodes(MIXED).queue("team-a")
    for name, spec, _ in CASES:
        for copy in ("a", "b"):
            log.submit("alice", f"{name}-{copy}", spec).accept(f"{name}-{copy}")
    state = log.fold()
    queued = [j for j in state.jobs.values() if j.phase == "queued"]
    assert len(queued) == 2 * len(CASES)
    by_shape = {j.id: why for j, why in Inventory(state).unhosted_queued(state)}
    by_job = {j.id: why for j in queued if (why := never_fits(state, j)) is not None}
    assert by_shape == by_job
    assert {i.rsplit("-", 1)[0] for i in by_shape} == {name for name, _, want in CASES if want is not None}


def test_the_specs_it_remembers_are_as_many_as_the_jobs_not_finished_not_every_job_judged() -> None:
    """Every submission is judged once (admission's validation); a spec judged is remembered,
    and kept alive, so that its job is answered by a look-up each cycle after. Over a long run
    of jobs that come and go under one inventory, what it remembers stays about twice the jobs
    not finished: it holds no spec of every job ever submitted. The answers stay the same."""
    state = _mixed()
    live = [_job(job().gpus(1), f"live-{i}") for i in range(10)]
    for j in live:
        state.jobs[j.id] = j
    indexes.rebuild(state)
    remembered = []
    for i in range(3 * MIN_SPECS):
        inventory = Inventory(state)  # one per cycle, as admission builds it
        too_big = i % 2 == 1
        verdict = inventory.never_fits(_job(job().gpus(16 if too_big else 1), f"gone-{i}"))
        assert (verdict is not None) == too_big
        assert inventory.unhosted(live) == []  # the live ones, asked again each cycle
        remembered.append(len(inventory._built().specs))
    assert max(remembered) <= 2 * len(live) + MIN_SPECS
    assert max(remembered) >= MIN_SPECS - 1  # it did remember, up to its bound


def test_the_idle_copy_kept_between_cycles_keeps_its_answers_bounded() -> None:
    # Admission judges every new job's shape on an idle copy of the inventory, kept for as long
    # as the nodes stay the same (months): each judgement's answers, keyed by versions of its
    # nodes no later one asks about, were kept for good, some 3.6 KB a shape.
    from corral.projections.placement import inventory as inv_mod
    from corral.projections.placement.framework import MEMO_MOST

    state = LogBuilder().nodes(Cluster(4)).fold()
    n = 3 * inv_mod.MAX_TOUCHED
    for i in range(n):
        spec = job().gpus(1).memory(1024 + i).build()  # a shape of its own each
        j = JobState(id=f"j{i}", tenant="a", spec=spec, submitted_seq=i + 1, submitted_at=0.0)
        assert Inventory(state).never_fits(j) is None
    kept = inv_mod._kept.built
    assert kept is not None
    idle = kept[2]
    assert len(idle.verdicts) == n  # what it was asked stays answered
    assert len(idle.snap.touched) < inv_mod.MAX_TOUCHED + 16
    assert len(idle.snap.picks) < 8 * inv_mod.MAX_TOUCHED and len(idle.chain._static_memo) <= MEMO_MOST


@pytest.mark.parametrize(
    ("spec", "most"),
    [
        (job().gpus(8).replicas(4, minimum=1), 2),  # two 8-GPU nodes hold two such workers
        (job().gpus(4).replicas(8, minimum=2), 4),
        (job().gpus(8).replicas(2, minimum=1), 2),  # all it asks
        (job().gpus(4).replicas(4, minimum=1).pack("node", required=True), 2),  # on one node
        (job().gpus(8).replicas(3), 3),  # not elastic: its own count, never_fits judges it
        (job().gpus(16).replicas(2, minimum=1), 1),  # not even one: its least; never_fits says why
    ],
)
def test_the_most_workers_the_cluster_could_host_of_an_elastic_job(spec: JobBuilder, most: int) -> None:
    state = LogBuilder().nodes(Cluster(2)).fold()
    assert Inventory(state).most_workers(_job(spec)) == most


def test_an_elastic_job_is_admitted_at_no_more_workers_than_the_cluster_could_ever_place() -> None:
    # 1..2 workers of 8 GPUs on one 8-GPU node, with quota for 16: it was admitted at 2, never
    # placed, withdrawn at the placement timeout and admitted at 2 again, for ever.
    from corral.events.jobs import JobsAdmitted
    from corral.services.admission.decide import decide

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    log.submit("alice", "e", job().gpus(8).replicas(2, minimum=1)).accept("e")
    out = decide(log.fold(), 1_000.0)
    (admitted,) = [a for ev in out if isinstance(ev, JobsAdmitted) for a in ev.admissions]
    assert (admitted.job_id, admitted.replicas) == ("e", 1)


def test_an_elastic_job_of_no_gpu_is_admitted_at_no_more_workers_than_the_cluster_could_place() -> None:
    from corral.events.jobs import JobsAdmitted
    from corral.services.admission.decide import decide

    state = LogBuilder().nodes(Cluster(1)).fold()
    cores = state.nodes["node-00"].inventory.cpu_milli // 1000
    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    log.submit("alice", "e", job().gpus(0).cpu(1000).replicas(cores + 76, minimum=1)).accept("e")
    out = decide(log.fold(), 1_000.0)
    (admitted,) = [a for ev in out if isinstance(ev, JobsAdmitted) for a in ev.admissions]
    assert (admitted.job_id, admitted.replicas) == ("e", cores)
