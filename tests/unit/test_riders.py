"""Jobs that ask for no GPU hold no quota: what they take of a node's CPU and memory is the GPU
work's, and any queue's job that holds or claims quota may have them stopped for it
(``preemption.rides``). A tenant whose queue has no quota at all filled both nodes' CPUs with
one such job, and every GPU of the cluster stayed idle while an urgent GPU job waited."""

from __future__ import annotations

import pytest

from corral.events import subjects as subj
from corral.events.decisions import PreemptionRequested, Victim
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import PreemptionPolicy
from corral.projections.fold import apply_event
from corral.services.admission.validate import validate
from corral.services.preemptor.decide import PreemptorConfig, decide
from corral.services.preemptor.victims import COHORT, Pool, Simulation, blocked_targets, candidates
from tests.builders import TRAIN
from tests.unit.test_preemptor import N0, World, gpus, whole

ALL_CPUS = 224_000  # an h100-8x node's


def rider(queue: str = "team-b", **kw: object) -> JobSpec:
    return JobSpec(queue=queue, resources=Resources(gpus=0, cpu_milli=ALL_CPUS), command=TRAIN, **kw)  # type: ignore[arg-type]


def _world() -> World:
    """team-b has no quota and runs a job of no GPU that takes every CPU of the node; team-a's
    job of one GPU is admitted and finds no CPU beside the eight free GPUs."""
    w = World().queue("team-a", nominal=8).queue("team-b", nominal=0)
    w.run("ride", rider(), (N0, ()), priority=100)
    w.waiting("gpu-job", gpus(1))
    return w


def test_a_gpu_job_stops_another_queues_job_that_asks_for_no_gpu() -> None:
    w = _world()
    (ev,) = [e for e in w.cycle(decide) if isinstance(e, PreemptionRequested)]
    assert (ev.beneficiary, [v.job_id for v in ev.victims]) == ("gpu-job", ["ride"])
    assert w.state.jobs["ride"].phase in ("checkpointing", "stopping")


def _proposal(w: World, beneficiary: str, victim: str) -> PreemptionRequested:
    return PreemptionRequested(
        based_on=w.seq,
        now=w.time,
        beneficiary=beneficiary,
        victims=(Victim(victim, w.state.jobs[victim].attempt),),
        deadline=w.time + 30,
    )


def test_a_class_that_caps_preemptions_does_not_make_a_job_that_asks_for_no_gpu_unstoppable() -> None:
    # Capped at none, the job of no GPU kept every CPU of the node for as long as it ran: a
    # tenant could fill the cluster's CPUs with such jobs and nobody could stop them. The cap
    # bounds the work a GPU job loses; one of no GPU holds no quota and makes room in the end.
    w = World().queue("team-a", nominal=8).queue("team-b", nominal=0)
    w.priority_class("kept", 0, max_preemptions=0)
    w.run("ride", rider(priority_class="kept"), (N0, ()))
    w.waiting("gpu-job", gpus(1))
    (ev,) = [e for e in w.cycle(decide) if isinstance(e, PreemptionRequested)]
    assert [v.job_id for v in ev.victims] == ["ride"]
    assert w.state.jobs["ride"].phase in ("checkpointing", "stopping"), w.state.rejections


def test_a_job_that_asks_for_no_gpu_stops_no_other_queues_for_one_like_it() -> None:
    # Two queues' jobs of no GPU do not take each other's CPUs in turn: neither holds quota.
    w = World().queue("team-a", nominal=8).queue("team-b", nominal=0)
    w.run("ride", rider(), (N0, ()))
    w.waiting("other-ride", rider("team-a"))
    w.seq += 1
    before = w.state.rejected_total
    apply_event(w.state, w.seq, subj.decision("preemptor"), _proposal(w, "other-ride", "ride"), w.time)
    assert w.state.rejected_total == before + 1 and w.state.jobs["ride"].phase == "running"
    assert [e for e in w.cycle(decide) if isinstance(e, PreemptionRequested)] == []


def test_a_gpu_job_stops_its_own_queues_job_that_asks_for_no_gpu_too() -> None:
    # A queue may be shared by tenants: one's job of no GPU blocked another's GPU job of the
    # same queue for good, its priority higher.
    w = World().queue("team-a", nominal=8)
    w.run("ride", rider("team-a"), (N0, ()), priority=100)
    w.waiting("gpu-job", gpus(1))
    (ev,) = [e for e in w.cycle(decide) if isinstance(e, PreemptionRequested)]
    assert [v.job_id for v in ev.victims] == ["ride"]


def test_no_job_that_asks_for_no_gpu_is_stopped_for_one_blocked_by_quota() -> None:
    # Stopping it frees no quota: it is not offered, and the search stays as cheap as before.
    w = World().cohort("c").queue("team-a", nominal=8, cohort="c").queue("team-b", nominal=0, cohort="c")
    w.run("b-borrows", gpus(8, "team-b"), whole(N0, *range(8)))
    for i in range(20):
        w.run(
            f"ride-{i}",
            JobSpec(queue="team-b", resources=Resources(gpus=0, cpu_milli=1000), command=TRAIN),
            (N0, ()),
        )
    w.submit("a-job", gpus(8))
    sim = Simulation(w.state, PreemptorConfig().placer, w.time)
    (target,) = blocked_targets(w.state, sim.ledger, w.state.jobs["a-job"])
    offered = candidates(
        target,
        Pool(w.state, sim.ledger, w.time),
        set(),
        sim.ledger,
        PreemptionPolicy(),
        mode=COHORT,
        shrink=False,
    )
    assert [u.job.id for u in offered] == ["b-borrows"]
    stops = [v.job_id for e in w.cycle(decide) if isinstance(e, PreemptionRequested) for v in e.victims]
    assert stops == ["b-borrows"]


def test_the_fold_lets_a_gpu_job_stop_it_whatever_its_priority_and_queue() -> None:
    w = _world()
    w.emit(subj.decision("preemptor"), _proposal(w, "gpu-job", "ride"))
    assert w.state.jobs["ride"].preempted_for == "gpu-job"


@pytest.mark.parametrize("kw", [{"preemptible": False}], ids=["preemptible false"])
def test_a_job_that_asks_for_no_gpu_and_may_not_be_preempted_is_rejected(kw: dict[str, object]) -> None:
    w = World().queue("team-b", nominal=0)
    w.submit("fixed", rider(**kw))
    why = validate(w.state, w.state.jobs["fixed"])
    assert why is not None and "must be one that may be preempted" in why.message
    w.submit("ok", rider())
    assert validate(w.state, w.state.jobs["ok"]) is None


def test_a_job_that_asks_for_a_gpu_is_not_a_rider() -> None:
    # team-b's GPU job within its nominal is no rider: team-a's urgent job stops its own
    # lower-priority job, not team-b's.
    w = World().queue("team-a", nominal=2).queue("team-b", nominal=7)
    w.run("b-gpu", gpus(7, "team-b"), whole(N0, *range(7)))
    w.run("a-gpu", gpus(1, "team-a"), whole(N0, 7))
    w.waiting("a-more", gpus(1, "team-a"), priority=100)
    stops = [v.job_id for e in w.cycle(decide) if isinstance(e, PreemptionRequested) for v in e.victims]
    assert stops == ["a-gpu"]
