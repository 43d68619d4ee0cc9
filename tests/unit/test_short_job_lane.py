"""The short-job lane (``FairShareSpec.short_job_gpu_s``): among queue heads that borrow equally
far, a job expected to need little GPU time goes before fair-share order; its owner's estimate
counts only as far as its class's history agrees (``projections.queueing.short``)."""

from __future__ import annotations

import msgspec
import pytest

from corral.events.jobs import CancelJob
from corral.events.queues import ApplyCohort, ApplyFairShare, CohortSpec, FairShareSpec, Quota
from corral.projections import runtimes
from corral.projections.queueing import short
from corral.projections.state import JobState, State
from corral.services.admission.decide import decide
from corral.services.admission.order import pending_order
from tests.builders import Cluster, JobBuilder, LogBuilder, on, queue_spec
from tests.builders import job as spec
from tests.unit.test_admission import H, admitted, job, ran, two_teams

HOUR = 3600.0


def with_estimate(
    j: JobState, owner: float | None, learned: float | None, overrun: float | None = None
) -> JobState:
    return msgspec.structs.replace(
        j, spec=msgspec.structs.replace(j.spec, runtime_estimate_s=owner), learned_s=learned, overrun=overrun
    )


@pytest.mark.parametrize(
    ("case", "gpus", "milli", "replicas", "owner", "learned", "overrun", "limit", "lane"),
    [
        ("no lane", 1, 1000, 1, 60.0, None, None, 0.0, False),
        ("no estimate at all", 1, 1000, 1, None, None, None, HOUR, False),
        ("short by its owner's word", 1, 1000, 1, 600.0, None, None, HOUR, True),
        ("exactly the limit", 4, 1000, 1, 900.0, None, None, HOUR, True),
        ("short, but on 8 GPUs", 8, 1000, 1, 600.0, None, None, HOUR, False),
        ("short, but a gang of 2", 1, 1000, 2, 1900.0, None, None, HOUR, False),
        ("half a GPU counts half", 1, 500, 1, 7000.0, None, None, HOUR, True),
        ("learned short, owner silent", 1, 1000, 1, None, 1800.0, None, HOUR, True),
        ("owner says short, its class ran long", 1, 1000, 1, 60.0, 7200.0, None, HOUR, False),
        ("owner more careful than history", 1, 1000, 1, 3000.0, 60.0, None, HOUR, True),
        # With the owner's record (runtimes.overrun): their word as far as it held.
        ("owner's word held, its class ran long", 1, 1000, 1, 600.0, 7200.0, 1.0, HOUR, True),
        ("owner ran 10 times past their word", 1, 1000, 1, 600.0, None, 10.0, HOUR, False),
        ("an overrun of 1.2 stretches 55 min past the hour", 1, 1000, 1, 3300.0, None, 1.2, HOUR, False),
        ("an overrun of 1.2 leaves 45 min in the lane", 1, 1000, 1, 2700.0, None, 1.2, HOUR, True),
        ("a careful owner's estimate is not shortened", 1, 1000, 1, 4000.0, None, 0.5, HOUR, False),
        ("learned short, owner silent, record no matter", 1, 1000, 1, None, 1800.0, 10.0, HOUR, True),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_who_takes_the_lane(
    case: str,
    gpus: int,
    milli: int,
    replicas: int,
    owner: float | None,
    learned: float | None,
    overrun: float | None,
    limit: float,
    lane: bool,
) -> None:
    s = two_teams()
    j = job("j").gpus(gpus, milli=milli).replicas(replicas).into(s)
    assert short(with_estimate(j, owner, learned, overrun), limit) is lane


def busy_cohort(lane: float) -> LogBuilder:
    """team-a and team-b (4 GPUs each) in cohort ml on one 8-GPU node; team-a ran 8 GPUs for
    10 hours, so team-b goes first by fair share. Both now hold their nominal and queue a job
    that must borrow: team-b's runs 10 hours, team-a's a quarter of an hour."""
    log = LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(2))
    log.admin(
        "fair-share", ApplyFairShare(fair_share=FairShareSpec(half_life_s=86400.0, short_job_gpu_s=lane))
    )
    log.admin("cohort", ApplyCohort(cohort=CohortSpec("ml", quotas={"*": Quota(4)})))
    log.queue(queue_spec("team-a", 4, cohort="ml")).queue(queue_spec("team-b", 4, cohort="ml"))
    ran(log, "a", "a-past", spec().gpus(8), 0.0, 10.0)
    now = 11 * HOUR
    log.at(now)
    for team, t in (("team-a", "a"), ("team-b", "b")):
        log.submit(t, f"{t}-run", spec(team).gpus(4).estimate(100 * HOUR)).accept(f"{t}-run").admit(
            f"{t}-run"
        )
    log.submit("b", "b-long", spec("team-b").gpus(4).estimate(10 * HOUR)).accept("b-long")
    log.submit("a", "a-short", spec().gpus(4).estimate(HOUR / 4)).accept("a-short")
    return log


@pytest.mark.parametrize(("lane", "first"), [(0.0, "b-long"), (HOUR, "a-short")])
def test_a_short_job_of_the_queue_that_ran_more_goes_first_in_the_lane(lane: float, first: str) -> None:
    """Both borrow the cohort's 4 GPUs, of which one job fits: without the lane team-b's job
    goes (team-a ran more); with a lane of one GPU-hour, team-a's 4 × 15 minutes goes."""
    state = busy_cohort(lane).fold()
    assert state.rejected_total == 0, state.rejections
    assert set(admitted(decide(state, 11 * HOUR))) == {first}


def test_the_lane_does_not_pass_a_job_within_its_nominal() -> None:
    """A long job of a queue within its nominal goes before a short job that borrows."""
    s = two_teams(a=Quota(8), b=Quota(8))
    s.fair_share = FairShareSpec(short_job_gpu_s=HOUR)
    job("a-run").gpus(8, H).running().into(s)
    with_est = job("a0").gpus(1, H).with_(seq=100).with_spec(runtime_estimate_s=60.0).into(s)
    long_b = (
        job("b0", "team-b").gpus(1, H).with_(tenant="b", seq=101).with_spec(runtime_estimate_s=100 * HOUR)
    )
    long_b.into(s)
    assert short(with_est, HOUR)
    assert [j.id for j in pending_order(s, 0.0)] == ["b0", "a0"]


@pytest.mark.parametrize("bad", [-1.0, -HOUR])
def test_the_fold_refuses_a_lane_that_is_no_amount_of_gpu_time(bad: float) -> None:
    log = LogBuilder().nodes(Cluster(1))
    log.admin("fair-share", ApplyFairShare(fair_share=FairShareSpec(short_job_gpu_s=bad)))
    state = log.fold()
    assert state.fair_share.short_job_gpu_s == 0.0
    assert state.rejections[-1].code == "malformed" and "short_job_gpu_s" in state.rejections[-1].message


def test_the_owner_s_estimate_still_stands_for_everything_else() -> None:
    """Learned beside the owner's estimate, the class's history decides only the lane: order,
    backfill and forecasts still read the owner's (``runtimes.of``)."""
    s = two_teams()
    j = with_estimate(job("j").gpus(1).into(s), 60.0, 7200.0)
    assert runtimes.of(j) == 60.0 and not short(j, HOUR)


def test_the_fold_checks_an_owner_s_estimates_against_their_record() -> None:
    """Alice's three estimated jobs ran as she said, Mallory's ten times longer. Their next
    estimated jobs carry that record from submission: Alice's 15 minutes take the lane over
    the class's longer history, Mallory's do not; a job with no estimate carries none."""
    log = LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(1))
    log.admin("fair-share", ApplyFairShare(fair_share=FairShareSpec(short_job_gpu_s=HOUR)))
    log.queue(queue_spec("team-a", 8))
    at = 0.0
    for tenant, ran_h in (("alice", 0.25), ("mallory", 2.5)):
        for i in range(runtimes.MIN_SAMPLES):
            ran(log, tenant, f"{tenant}-{i}", spec().gpus(1).estimate(HOUR / 4), at, ran_h)
            at += ran_h * HOUR
    for i in range(runtimes.MIN_SAMPLES):  # her class has run long since, without estimates
        ran(log, "alice", f"alice-long-{i}", spec().gpus(1), at, 10.0)
        at += 10 * HOUR
    log.at(at)
    for tenant in ("alice", "mallory"):
        log.submit(tenant, f"{tenant}-next", spec().gpus(1).estimate(HOUR / 4))
    log.submit("alice", "alice-silent", spec().gpus(1))
    state = log.fold()
    assert state.rejected_total == 0, state.rejections
    assert state.estimate_record["alice"] == [1.0] * runtimes.MIN_SAMPLES
    assert state.estimate_record["mallory"] == [10.0] * runtimes.MIN_SAMPLES
    alice, mallory, silent = (state.jobs[j] for j in ("alice-next", "mallory-next", "alice-silent"))
    assert (alice.overrun, mallory.overrun, silent.overrun) == (1.0, 10.0, None)
    assert alice.learned_s is not None and alice.learned_s > HOUR  # history alone would refuse her
    assert short(alice, HOUR) and not short(mallory, HOUR)


def test_a_tenant_s_record_is_bounded() -> None:
    state = State()
    for i in range(runtimes.RECORD + 5):
        runtimes.learn(state, JobState(f"j{i}", "t", spec().estimate(10.0).build(), 0, 0.0, ran_s=float(i)))
    assert len(state.estimate_record["t"]) == runtimes.RECORD
    assert runtimes.overrun(state, "t") == (runtimes.RECORD + 4) / 10.0
    for i in range(runtimes.MAX_CLASSES + 3):
        runtimes.learn(state, JobState(f"u{i}", f"u{i}", spec().estimate(10.0).build(), 0, 0.0, ran_s=1.0))
    assert len(state.estimate_record) == runtimes.MAX_CLASSES


def _ends(log: LogBuilder, job_id: str, spec_: JobBuilder, start: float, hours: float, end: str) -> None:
    """``job_id`` of mallory runs on node-00 from ``start`` for ``hours``, then ends as ``end``
    says: cancelled by her, or failed (its one worker exits 1, no restarts left)."""
    log.at(start).submit("mallory", job_id, spec_).accept(job_id).admit(job_id)
    log.place(on("node-00", 0, job_id=job_id)).started("node-00", job_id)
    log.at(start + hours * HOUR)
    if end == "cancel":
        log.request("mallory", "cancel", CancelJob(job_id=job_id))
        log.exited("node-00", job_id, code=143, stopped=True)  # its agent stopped the worker
    else:
        log.exited("node-00", job_id, code=1)


@pytest.mark.parametrize("end", ["cancel", "fail"])
def test_a_job_that_ends_unwell_past_its_estimate_goes_on_the_record(end: str) -> None:
    """Mallory calls her jobs 15 minutes, then stops each once it has run 2.5 hours (or lets it
    crash): her record shows the overrun as if they had succeeded, and her next 15 minutes do
    not take the lane. One that ends early says nothing of her word and is not counted."""
    log = LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(1))
    log.admin("fair-share", ApplyFairShare(fair_share=FairShareSpec(short_job_gpu_s=HOUR)))
    log.queue(queue_spec("team-a", 8)).retention(24 * HOUR)
    quarter = spec().gpus(1).estimate(HOUR / 4).restarts(0, "never")
    at = 0.0
    for i in range(runtimes.MIN_SAMPLES):
        _ends(log, f"m-{i}", quarter, at, 2.5, end)
        at += 2.5 * HOUR
    _ends(log, "m-early", quarter, at, 0.1, end)
    at += 0.1 * HOUR
    log.at(at).submit("mallory", "m-next", spec().gpus(1).estimate(HOUR / 4))
    state = log.fold()
    assert state.rejected_total == 0, state.rejections
    assert {state.jobs[f"m-{i}"].phase for i in range(runtimes.MIN_SAMPLES)} == {
        "cancelled" if end == "cancel" else "failed"
    }
    assert state.estimate_record["mallory"] == [10.0] * runtimes.MIN_SAMPLES
    nxt = state.jobs["m-next"]
    assert nxt.overrun == 10.0 and not short(nxt, HOUR)
