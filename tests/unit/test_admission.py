"""Admission: request validation, fair-share order and whole admission cycles (``decide``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import pytest

from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.jobs import (
    Admission,
    JobAccepted,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    Mount,
    PendingReasonChanged,
    Resources,
)
from corral.events.queues import (
    ApplyCohort,
    CohortSpec,
    PreemptionPolicy,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections import indexes, quota
from corral.projections.fold import apply_event
from corral.projections.lifecycle import HOLDS_QUOTA, Phase
from corral.projections.quota import ANY, Ledger, gpus_text
from corral.projections.state import Checkpoint, JobState, State
from corral.services.admission import order
from corral.services.admission.decide import AdmissionConfig, decide
from corral.services.admission.order import pending_order
from corral.services.admission.validate import validate
from tests.builders import TRAIN, Cluster, JobBuilder, LogBuilder, move_to, on, queue_spec
from tests.builders import job as spec

H = "H100"


# -- builders --------------------------------------------------------------------------------------


@dataclass
class Job:
    """``job("a1").queue("team-a").gpus(8)``: a JobState in a State, built up readably."""

    id: str
    spec: JobSpec
    tenant: str = "a"
    phase: Phase = "queued"
    priority: int = 0
    seq: int = 0
    admitted: int | None = None  # replicas admitted (job holds quota)
    reasons: tuple[Reason, ...] = ()
    at: float = 0.0

    def queue(self, q: str) -> Job:
        return replace(self, spec=msgspec.structs.replace(self.spec, queue=q))

    def gpus(self, n: int, *models: str, milli: int = 1000) -> Job:
        res = msgspec.structs.replace(self.spec.resources, gpus=n, gpu_models=models, gpu_milli=milli)
        return replace(self, spec=msgspec.structs.replace(self.spec, resources=res))

    def replicas(self, n: int, lo: int | None = None) -> Job:
        return replace(self, spec=msgspec.structs.replace(self.spec, replicas=n, min_replicas=lo))

    def with_spec(self, **kw: Any) -> Job:
        return replace(self, spec=msgspec.structs.replace(self.spec, **kw))

    def with_(self, **kw: Any) -> Job:
        return replace(self, **kw)

    def running(self, replicas: int | None = None) -> Job:
        return replace(self, phase="running", admitted=self.spec.replicas if replicas is None else replicas)

    def into(self, s: State) -> JobState:
        seq = self.seq or len(s.jobs) + 1
        adm = None
        if self.admitted is not None:
            res = self.spec.resources
            key = res.gpu_models[0] if res.gpu_models else ANY
            adm = Admission(self.id, 0, self.admitted, {key: res.gpus * self.admitted})
        job = JobState(
            id=self.id,
            tenant=self.tenant,
            spec=self.spec,
            submitted_seq=seq,
            submitted_at=float(seq),
            phase=self.phase,
            priority=self.priority,
            admission=adm,
            reasons=self.reasons,
            phase_since=self.at,
        )
        indexes.add(s, job)
        if job.phase in HOLDS_QUOTA:
            quota.count_holding(s, job, 1)  # as the fold counts it when the job is admitted
        return job


def job(job_id: str, queue: str = "team-a") -> Job:
    return Job(job_id, JobSpec(queue=queue, resources=Resources(gpus=1), command=TRAIN))


A16, B8 = Quota(16), Quota(8)


def two_teams(a: Quota = A16, b: Quota = B8, key: str = H, strategy: str = "best-effort-fifo") -> State:
    """Organisation ``org`` → cohort ``ml`` → queues team-a (tenant a) and team-b (tenant b)."""
    s = State()
    s.cohorts["org"] = CohortSpec("org")
    s.cohorts["ml"] = CohortSpec("ml", parent="org")
    s.queues["team-a"] = QueueSpec("team-a", cohort="ml", quotas={key: a}, tenants=("a",), strategy=strategy)
    s.queues["team-b"] = QueueSpec("team-b", cohort="ml", quotas={key: b}, tenants=("b",))
    s.priority_classes["high"] = PriorityClassSpec("high", 100)
    s.priority_classes["low"] = PriorityClassSpec("low", -10)
    return s


def of(events: list[Event], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def admitted(events: list[Event]) -> dict[str, Admission]:
    return {a.job_id: a for e in of(events, JobsAdmitted) for a in e.admissions}


def reasons(events: list[Event]) -> dict[str, Reason]:
    return {e.job_id: e.reasons[0] for e in of(events, PendingReasonChanged)}


def fold_all(s: State, events: list[Event]) -> int:
    """Fold decide's output as the service would append it; returns the new rejections. An
    admission is also checked against quota at its position, as the fold is to check it."""
    before = s.rejected_total
    for e in events:
        if isinstance(e, JobsAdmitted):
            ledger = Ledger.from_state(s)
            for a in e.admissions:
                assert ledger.claim(s.jobs[a.job_id], a) is None, a
            subject = subj.decision("admission")
        else:
            subject = subj.job(e.job_id)  # type: ignore[attr-defined]
        apply_event(s, s.seq + 1, subject, e, s.time + 1.0)
    return s.rejected_total - before


# -- validate --------------------------------------------------------------------------------------


def _spec(**kw: Any) -> JobSpec:
    res = kw.pop("res", Resources(gpus=1, gpu_models=(H,)))
    return JobSpec(queue=kw.pop("queue", "team-a"), resources=res, **{"command": TRAIN, **kw})


VALID = [
    ("fits", _spec(), "a", None),
    ("unknown queue", _spec(queue="nope"), "a", "unknown-queue"),
    ("tenant not allowed by the queue", _spec(queue="team-b"), "a", "unknown-queue"),
    ("unknown priority class", _spec(priority_class="urgent"), "a", "unknown-priority-class"),
    ("normal is there unless defined", _spec(priority_class="normal"), "a", None),
    ("no replicas", _spec(replicas=0), "a", "invalid"),
    ("too many replicas", _spec(replicas=1025), "a", "invalid"),
    ("min above replicas", _spec(replicas=2, min_replicas=3), "a", "invalid"),
    ("too many GPUs per worker", _spec(res=Resources(gpus=65)), "a", "invalid"),
    ("zero milli-GPU", _spec(res=Resources(gpus=1, gpu_milli=0)), "a", "invalid"),
    ("a fraction of two GPUs", _spec(res=Resources(gpus=2, gpu_milli=500)), "a", "invalid"),
    ("MIG on two GPUs", _spec(res=Resources(gpus=2, mig="3g.40gb")), "a", "invalid"),
    ("unknown MIG profile", _spec(res=Resources(gpus=1, mig="9g.1tb", gpu_models=(H,))), "a", "invalid"),
    ("no CPU", _spec(res=Resources(gpus=1, cpu_milli=0, gpu_models=(H,))), "a", "invalid"),
    (
        "memory beyond bound",
        _spec(res=Resources(gpus=1, memory_mib=1 << 40, gpu_models=(H,))),
        "a",
        "invalid",
    ),
    ("env too large", _spec(env={f"K{i}": "v" * 100 for i in range(1000)}), "a", "invalid"),
    ("command too long", _spec(command=("x" * 70_000,)), "a", "invalid"),
    ("nothing to run", _spec(command=()), "a", "invalid"),
    ("an empty program", _spec(command=("", "train.py")), "a", "invalid"),
    (
        "an empty program, with an image",
        _spec(command=("",), image="nvcr.io/nvidia/pytorch:24.05-py3"),
        "a",
        "invalid",
    ),
    ("an empty argument after the program", _spec(command=("python", "")), "a", None),
    ("an image's own entrypoint", _spec(command=(), image="nvcr.io/nvidia/pytorch:24.05-py3"), "a", None),
    ("too many mounts", _spec(mounts=tuple(Mount(f"/s{i}", f"/t{i}") for i in range(65))), "a", "invalid"),
    ("negative grace", _spec(grace_seconds=-1.0), "a", "invalid"),
    (
        "gang bigger than any possible quota",
        _spec(replicas=4, res=Resources(gpus=8, gpu_models=(H,))),
        "a",
        "never-fits",
    ),
    (
        "elastic gang whose minimum fits",
        _spec(replicas=4, min_replicas=3, res=Resources(gpus=8, gpu_models=(H,))),
        "a",
        None,
    ),
    ("no quota for an unconstrained job", _spec(res=Resources(gpus=1)), "a", "no-quota"),
    ("no GPU needs no quota", _spec(res=Resources(gpus=0)), "a", None),
]


@pytest.mark.parametrize(("id", "spec", "tenant", "code"), VALID, ids=[v[0] for v in VALID])
def test_validate(id: str, spec: JobSpec, tenant: str, code: str | None) -> None:
    s = two_teams()  # team-a: 16 H100 + up to 8 borrowed = 24 at most
    j = JobState(id="j", tenant=tenant, spec=spec, submitted_seq=1, submitted_at=0.0, phase="submitted")
    why = validate(s, j)
    assert (why.code if why else None) == code, why


def test_rejections_say_what_to_do() -> None:
    s = two_teams()
    j = JobState(id="j", tenant="a", spec=_spec(queue="team-b"), submitted_seq=1, submitted_at=0.0)
    why = validate(s, j)
    assert why is not None and "queues open to a: team-a" in why.message
    big = _spec(replicas=4, res=Resources(gpus=8, gpu_models=(H,)))
    j = JobState(id="j", tenant="a", spec=big, submitted_seq=1, submitted_at=0.0)
    why = validate(s, j)
    assert why is not None
    assert why.message == (
        "4 workers need 32 H100 but queue team-a can hold at most 24 H100 (nominal 16 + what its "
        "cohort can lend); ask for at most 24 H100 in all, or use a queue with more quota"
    )
    one = _spec(res=Resources(gpus=32, gpu_models=(H,)))
    j = JobState(id="j", tenant="a", spec=one, submitted_seq=1, submitted_at=0.0)
    why = validate(s, j)
    assert why is not None and why.message.startswith("1 worker needs 32 H100 but"), why  # not "need"
    j = JobState(id="j", tenant="a", spec=_spec(res=Resources(gpus=1)), submitted_seq=1, submitted_at=0.0)
    why = validate(s, j)
    assert why is not None and "set gpu_models to one of H100" in why.message


def test_a_job_with_nothing_to_run_is_rejected_before_it_holds_anything() -> None:
    # Accepted, it was admitted and placed, and failed to start on every node, attempt after
    # attempt: no command to run, and no image whose entrypoint would run instead.
    s = two_teams()
    j = JobState(
        id="j", tenant="a", spec=_spec(command=()), submitted_seq=1, submitted_at=0.0, phase="submitted"
    )
    assert validate(s, j) == Reason(
        "invalid", "nothing to run: give a command, or an image whose entrypoint runs"
    )
    s.jobs["j"] = j
    indexes.add(s, j)
    s.seq = 1
    out = decide(s, 0.0)
    assert [(e.job_id, e.reason.code) for e in of(out, JobRejected)] == [("j", "invalid")]
    assert not of(out, JobsAdmitted)


def test_a_queue_without_tenants_admits_anyone() -> None:
    s = two_teams()
    s.queues["shared"] = QueueSpec("shared", quotas={ANY: Quota(4)})
    j = JobState(
        id="j",
        tenant="z",
        spec=_spec(queue="shared", res=Resources(gpus=1)),
        submitted_seq=1,
        submitted_at=0.0,
    )
    assert validate(s, j) is None


# -- fair-share order --------------------------------------------------------------------------------


def test_order_within_a_queue_is_priority_then_submission() -> None:
    s = two_teams()
    job("late-high").gpus(1, H).with_(priority=100, seq=5).into(s)
    job("early").gpus(1, H).with_(seq=2).into(s)
    job("late").gpus(1, H).with_(seq=3).into(s)
    job("early-low").gpus(1, H).with_(priority=-10, seq=1).into(s)
    assert [j.id for j in pending_order(s, 0.0)] == ["late-high", "early", "late", "early-low"]


def test_order_interleaves_queues_by_dominant_share() -> None:
    s = two_teams(a=Quota(8), b=Quota(8))
    for i in range(3):
        job(f"a{i}").gpus(4, H).into(s)
        job(f"b{i}", "team-b").gpus(4, H).with_(tenant="b").into(s)
    assert [j.id for j in pending_order(s, 0.0)] == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_the_queue_using_less_goes_first() -> None:
    s = two_teams(a=Quota(8), b=Quota(8))
    job("a-run").gpus(4, H).running().into(s)
    job("a0").gpus(1, H).with_(seq=100).into(s)
    job("b0", "team-b").gpus(1, H).with_(tenant="b", seq=101).into(s)
    assert [j.id for j in pending_order(s, 0.0)][:2] == ["b0", "a0"]


def test_weight_scales_the_share() -> None:
    s = two_teams(a=Quota(8), b=Quota(8))
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], weight=3.0)
    job("a-run").gpus(4, H).running().into(s)
    job("b-run", "team-b").gpus(2, H).running().into(s)
    job("a0").gpus(1, H).with_(seq=100).into(s)
    job("b0", "team-b").gpus(1, H).with_(tenant="b", seq=101).into(s)
    # a holds 4/16 with weight 3 (0.083), b 2/16 with weight 1 (0.125): a goes first.
    assert [j.id for j in pending_order(s, 0.0)][:2] == ["a0", "b0"]


def ran(
    log: LogBuilder, tenant: str, job_id: str, spec: JobBuilder, start: float, hours: float
) -> LogBuilder:
    """``job_id`` runs on node-00 from ``start`` for ``hours``, with no runtime estimate."""
    gpus = spec.build().resources.gpus
    log.at(start).submit(tenant, job_id, spec).accept(job_id).admit(job_id)
    log.place(on("node-00", *range(gpus), job_id=job_id)).started("node-00", job_id)
    return log.at(start + hours * 3600.0).exited("node-00", job_id)


def teams_log(half_life_s: float = 86400.0) -> LogBuilder:
    """team-a and team-b (8 GPUs each) on one 8-GPU node, the half-life set by the admin."""
    log = LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(1)).fair_share(half_life_s)
    return log.queue(queue_spec("team-a", 8)).queue(queue_spec("team-b", 8))


@pytest.mark.parametrize(
    ("id", "ended_ago", "first"),
    [("recent use goes last", 60.0, "b0"), ("long-ago use is forgotten", 30 * 86400.0, "a0")],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_past_usage_decays_with_the_half_life(id: str, ended_ago: float, first: str) -> None:
    # team-a held 8 GPUs for a day; team-b holds 1 now.
    log = ran(teams_log(86400.0), "a", "a-done", spec().gpus(8), 0.0, 24.0)
    now = 86400.0 + ended_ago
    log.at(now - 1.0).submit("b", "b-run", spec("team-b")).accept("b-run").admit("b-run")
    log.place(on("node-00", 0, job_id="b-run")).started("node-00", "b-run")
    log.submit("a", "a0", spec()).accept("a0").submit("b", "b0", spec("team-b")).accept("b0")
    state = log.fold()
    assert state.rejected_total == 0, state.rejections
    assert pending_order(state, now)[0].id == first


NOW = 22.0 * 3600.0  # when both teams queue a job


def test_a_team_without_estimates_that_ran_a_lot_goes_after_one_that_ran_little() -> None:
    """Neither team gives runtime estimates; what counts is the GPU time their jobs held. One
    8-GPU job of either team fits in their cohort's quota: the team that ran little gets it."""

    def cohort_log(history: bool) -> LogBuilder:
        log = LogBuilder(start_time=0.0, step=0.0).nodes(Cluster(1)).fair_share(86400.0)
        log.admin("cohort", ApplyCohort(cohort=CohortSpec("ml")))
        log.queue(queue_spec("team-a", 4, cohort="ml")).queue(queue_spec("team-b", 4, cohort="ml"))
        if history:
            ran(log, "a", "a-big", spec().gpus(8), 0.0, 10.0)  # team-a: 8 GPUs for 10 h, twice
            ran(log, "a", "a-again", spec().gpus(8), 10.0 * 3600.0, 10.0)
            ran(log, "b", "b-small", spec("team-b").gpus(1), 20.0 * 3600.0, 1.0)  # team-b: 1 GPU, 1 h
        # Then both queue an 8-GPU job, team-a's first.
        log.at(NOW).submit("a", "a0", spec().gpus(8)).accept("a0")
        return log.submit("b", "b0", spec("team-b").gpus(8)).accept("b0")

    # Without any history, team-a's job, submitted first, is admitted.
    assert set(admitted(decide(cohort_log(history=False).fold(), NOW))) == {"a0"}
    state = cohort_log(history=True).fold()
    assert state.rejected_total == 0, state.rejections
    assert all(j.spec.runtime_estimate_s is None for j in state.jobs.values())
    assert set(admitted(decide(state, NOW))) == {"b0"}


def test_jobs_within_nominal_go_before_borrowers() -> None:
    s = two_teams(a=Quota(8), b=Quota(8))
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], weight=100.0)
    job("a-run").gpus(8, H).running().into(s)
    job("a0").gpus(1, H).with_(seq=100).into(s)  # would borrow, though team-a's share is tiny
    job("b0", "team-b").gpus(1, H).with_(tenant="b", seq=101).into(s)
    assert [j.id for j in pending_order(s, 0.0)] == ["b0", "a0"]


@pytest.mark.parametrize(
    ("policy", "first"),
    [
        pytest.param(PreemptionPolicy(), "a0", id="it may stop the lower one: the higher priority first"),
        pytest.param(
            PreemptionPolicy(borrow_within_cohort="never"), "a0", id="never: by priority, as Kueue sorts them"
        ),
        pytest.param(
            PreemptionPolicy(borrow_priority_threshold=-1),
            "b0",
            id="the lower one is above its threshold: fair share decides",
        ),
    ],
)
def test_a_borrowers_priority_goes_first_up_to_its_queues_threshold(
    policy: PreemptionPolicy, first: str
) -> None:
    # Both heads borrow what team-c lends; team-a's has the higher priority, team-b holds less.
    s = two_teams(a=Quota(2), b=Quota(2))
    s.queues["team-c"] = QueueSpec("team-c", cohort="ml", quotas={H: Quota(8)}, tenants=("c",))
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], preemption=policy)
    job("a-run").gpus(2, H).running().into(s)
    job("a0").gpus(1, H).with_(priority=5, seq=100).into(s)
    job("b0", "team-b").gpus(3, H).with_(tenant="b", seq=101).into(s)
    assert [j.id for j in pending_order(s, 0.0)] == [first, ({"a0", "b0"} - {first}).pop()]


@pytest.mark.parametrize("policy", ["never", "lower-priority"])
def test_at_equal_priority_borrowers_go_by_share_whatever_their_queues_may_stop(policy: str) -> None:
    # team-a may stop no borrower; team-b holds more. Ranked after every queue that may stop
    # lower-priority borrowers, team-a's borrowers waited behind team-b's at equal priority for
    # as long as team-b had any, whatever the shares.
    s = two_teams(a=Quota(2), b=Quota(2))
    s.queues["team-c"] = QueueSpec("team-c", cohort="ml", quotas={H: Quota(8)}, tenants=("c",))
    s.queues["team-a"] = msgspec.structs.replace(
        s.queues["team-a"], preemption=PreemptionPolicy(borrow_within_cohort=policy)
    )
    job("b-run", "team-b").gpus(2, H).with_(tenant="b").running().into(s)
    job("b0", "team-b").gpus(3, H).with_(tenant="b", seq=100).into(s)
    job("a0").gpus(3, H).with_(seq=101).into(s)
    assert [j.id for j in pending_order(s, 0.0)] == ["a0", "b0"]


def test_order_does_not_depend_on_the_order_jobs_are_held_in() -> None:
    s = two_teams()
    rng = random.Random(1)
    for i in range(40):
        q = rng.choice(("team-a", "team-b"))
        j = job(f"j{i}", q).gpus(rng.choice((1, 2, 4)), H).with_(tenant=q[-1], priority=rng.choice((0, 100)))
        if rng.random() < 0.3:
            j = j.running()
        j.into(s)
    # The same jobs, in another order: in the State and so in the indexes rebuilt from it.
    shuffled = msgspec.structs.replace(s, jobs=dict(sorted(s.jobs.items(), key=lambda _: rng.random())))
    indexes.rebuild(shuffled)
    assert [j.id for j in pending_order(s, 5.0)] == [j.id for j in pending_order(shuffled, 5.0)]


# -- decide: one admission cycle ----------------------------------------------------------------------


def test_accepts_rejects_and_admits_in_one_cycle() -> None:
    s = two_teams()
    job("ok").gpus(8, H).with_(phase="submitted", seq=3).into(s)
    job("bad", "team-b").gpus(8, H).with_(phase="submitted", seq=4).into(s)  # tenant a, queue of b
    job("hi").gpus(8, H).with_spec(priority_class="high").with_(phase="submitted", seq=5).into(s)
    s.seq = 5
    out = decide(s, 10.0)
    assert of(out, JobAccepted) == [
        JobAccepted(job_id="ok", priority=0),
        JobAccepted(job_id="hi", priority=100),
    ]
    (rej,) = of(out, JobRejected)
    assert (rej.job_id, rej.request_seq, rej.reason.code) == ("bad", 4, "unknown-queue")
    (adm,) = of(out, JobsAdmitted)
    assert (adm.based_on, adm.now) == (5, 10.0)
    assert [a.job_id for a in adm.admissions] == ["hi", "ok"]
    assert fold_all(s, out) == 0
    assert s.jobs["ok"].phase == "admitted" and s.jobs["bad"].phase == "rejected"


def test_a_gang_is_admitted_whole_or_not_at_all() -> None:
    s = two_teams(a=Quota(16, borrowing_limit=0))
    job("run").gpus(8, H).with_spec(runtime_estimate_s=7200.0).running().into(s)
    job("gang").gpus(4, H).replicas(3).into(s)  # 12 > 8 left
    job("small").gpus(8, H).with_spec(runtime_estimate_s=3600.0).into(s)
    out = decide(s, 0.0)
    # Best effort: the next job goes when the head cannot (``small`` ends before ``run`` would
    # leave the gang room, so it cannot delay it).
    assert set(admitted(out)) == {"small"}
    assert reasons(out)["gang"].code == "quota"
    assert fold_all(s, out) == 0


def test_strict_fifo_head_blocks_its_queue() -> None:
    s = two_teams(a=Quota(16, borrowing_limit=0), strategy="strict-fifo")
    job("run").gpus(8, H).running().into(s)
    job("gang").gpus(4, H).replicas(3).into(s)
    job("small").gpus(8, H).into(s)
    out = decide(s, 0.0)
    assert admitted(out) == {}
    why = reasons(out)
    assert why["gang"].code == "quota"
    assert why["small"] == Reason(
        "fifo", "queue team-a is strict FIFO: waiting behind gang; position 2 of 2 in team-a"
    )


@pytest.mark.parametrize(
    ("id", "free", "lo", "want"),
    [
        ("all it asks", 8, 2, 8),
        ("what fits", 5, 2, 5),
        ("its minimum", 2, 2, 2),
        ("less than its minimum", 1, 2, None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_an_elastic_job_gets_the_largest_size_that_fits(
    id: str, free: int, lo: int, want: int | None
) -> None:
    s = two_teams(a=Quota(16, borrowing_limit=0))
    job("run").gpus(16 - free, H).running().into(s)
    job("elastic").gpus(1, H).replicas(8, lo).into(s)
    got = admitted(decide(s, 0.0)).get("elastic")
    assert (got.replicas if got else None) == want
    if got:
        assert got.gpus == {H: want}


def test_exactly_at_quota_admits_and_one_more_waits() -> None:
    s = two_teams(a=Quota(16, borrowing_limit=0))
    job("run").gpus(8, H).running().into(s)
    job("fits").gpus(8, H).into(s)
    job("waits").gpus(1, H).into(s)
    out = decide(s, 0.0)
    assert set(admitted(out)) == {"fits"}
    assert reasons(out)["waits"].message.startswith("needs 1 H100; queue team-a at its nominal 16/16 H100")


def test_borrowing_from_an_idle_team_and_the_reason_when_it_is_taken_back() -> None:
    s = two_teams(a=Quota(16), b=Quota(8))
    job("a-run").gpus(16, H).running().into(s)
    job("a-borrow").gpus(8, H).into(s)
    out = decide(s, 0.0)
    assert admitted(out)["a-borrow"].gpus == {H: 8}
    assert fold_all(s, out) == 0
    job("b0", "team-b").gpus(8, H).with_(tenant="b", seq=50).into(s)
    job("b1", "team-b").gpus(8, H).with_(tenant="b", seq=51).into(s)
    out = decide(s, 1.0)
    assert admitted(out) == {}
    why = reasons(out)["b0"]
    # team-a is closed to tenant b: its name is not b's to learn, what it borrows is.
    assert why == Reason(
        "quota",
        "needs 8 H100; queue team-b using 0 of its nominal 8 H100; 0 free to it now in cohort ml, 8 of its "
        "nominal in use by other queues; position 1 of 2 in team-b; would fit now if other queues' 8 "
        "borrowed H100 were reclaimed",
        True,
    )
    assert reasons(out)["b1"].message.startswith("needs 8 H100; queue team-b using 0 of its nominal 8")
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], tenants=("a", "b"))
    why = reasons(decide(s, 2.0))["b0"]
    assert why.message.endswith("would fit now if team-a's 8 borrowed H100 were reclaimed")


def test_lower_priority_jobs_of_the_same_queue_are_named_as_what_would_help() -> None:
    s = two_teams(a=Quota(8, borrowing_limit=0))
    job("low").gpus(8, H).with_(priority=-10).running().into(s)
    job("high").gpus(8, H).with_(priority=100).into(s)
    why = reasons(decide(s, 0.0))["high"]
    assert why.preemption_helps
    assert why.message.endswith("would fit now if lower-priority jobs of team-a gave back 8 H100")


@pytest.mark.parametrize(
    ("reclaim", "borrower_priority", "helps", "fair"),
    [
        ("any", 0, True, ()),
        ("never", 0, False, ()),
        ("lower-priority", 0, False, ()),
        ("lower-priority", -10, True, ()),
        ("never", 0, True, ("less-than-or-equal-to-final-share",)),  # fair sharing takes any priority
    ],
)
def test_a_reclaim_is_named_as_what_would_help_only_where_the_queue_may_reclaim(
    reclaim: str, borrower_priority: int, helps: bool, fair: tuple[str, ...]
) -> None:
    # The arithmetic alone said "would fit now if team-a's borrowed H100 were reclaimed
    # (preemption could help)" where team-b's policy let the preemptor stop none of them.
    s = two_teams(a=Quota(8), b=Quota(8))
    policy = PreemptionPolicy(reclaim_within_cohort=reclaim, fair_sharing=fair)  # type: ignore[arg-type]
    s.queues["team-b"] = msgspec.structs.replace(s.queues["team-b"], preemption=policy)
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], tenants=("a", "b"))
    job("a0").gpus(8, H).with_(priority=borrower_priority).running().into(s)
    job("a1").gpus(8, H).with_(priority=borrower_priority).running().into(s)
    job("b0", "team-b").gpus(8, H).with_(tenant="b", seq=50).into(s)
    why = reasons(decide(s, 0.0))["b0"]
    assert why.preemption_helps is helps, why
    assert why.message.endswith("would fit now if team-a's 8 borrowed H100 were reclaimed") is helps


def test_a_job_kept_out_by_another_queues_lending_hold_is_told_so() -> None:
    # team-b's first job is within its nominal and waits for what team-c borrows: team-b's
    # free share is kept from being lent. team-a's job that would borrow it heard "which fits
    # now; waiting behind jobs that do not", first in its queue, with nothing ahead of it.
    s = two_teams(a=Quota(8), b=Quota(8))
    s.queues["team-c"] = QueueSpec("team-c", cohort="ml", quotas={H: Quota(8)}, tenants=("c",))
    s.queues["team-b"] = msgspec.structs.replace(s.queues["team-b"], tenants=("a", "b"))
    job("a1").gpus(8, H).running().into(s)
    job("c1", "team-c").gpus(8, H).with_(tenant="c").running().into(s)
    job("c2", "team-c").gpus(4, H).with_(tenant="c").running().into(s)
    job("b1", "team-b").gpus(8, H).with_(tenant="b", seq=50).into(s)
    job("a2").gpus(4, H).with_(seq=51).into(s)
    out = decide(s, 0.0)
    assert admitted(out) == {}
    said = reasons(out)["a2"].message
    kept = "needs 4 H100; what it would borrow is kept for the first waiting jobs of team-b within"
    assert said.startswith(kept), said
    s.queues["team-b"] = msgspec.structs.replace(s.queues["team-b"], tenants=("b",))
    said = reasons(decide(s, 1.0))["a2"].message
    assert "kept for the first waiting jobs of other queues within" in said, said


def test_borrowers_whose_cap_on_preemptions_ran_out_are_not_named_as_what_would_help() -> None:
    s = two_teams(a=Quota(8), b=Quota(8))
    s.priority_classes["capped"] = PriorityClassSpec("capped", 0, max_preemptions=1)
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], tenants=("a", "b"))
    for j in ("a0", "a1"):
        job(j).gpus(8, H).with_spec(priority_class="capped").running().into(s).preemptions = 1
    job("b0", "team-b").gpus(8, H).with_(tenant="b", seq=50).into(s)
    why = reasons(decide(s, 0.0))["b0"]
    assert not why.preemption_helps and "would fit now" not in why.message, why


def test_own_queue_jobs_are_not_named_as_what_would_help_where_the_queue_stops_none() -> None:
    s = two_teams(a=Quota(8, borrowing_limit=0))
    never = PreemptionPolicy(within_queue="never")
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], preemption=never)
    job("low").gpus(8, H).with_(priority=-10).running().into(s)
    job("high").gpus(8, H).with_(priority=100).into(s)
    why = reasons(decide(s, 0.0))["high"]
    assert not why.preemption_helps and "would fit now" not in why.message, why


def test_own_queue_jobs_are_not_named_as_what_would_help_a_job_that_may_not_borrow_by_stopping() -> None:
    # Asking more than its nominal with borrow_within_cohort = "never", the job may have nobody
    # stopped for it (Kueue's flavor assigner), its own queue's jobs included.
    s = two_teams(a=Quota(8), b=Quota(8))
    never = PreemptionPolicy(borrow_within_cohort="never")
    s.queues["team-a"] = msgspec.structs.replace(s.queues["team-a"], preemption=never)
    job("low").gpus(8, H).with_(priority=-10).running().into(s)
    job("high").gpus(12, H).with_(priority=100, seq=50).into(s)
    why = reasons(decide(s, 0.0))["high"]
    assert not why.preemption_helps and "would fit now" not in why.message, why


def test_reasons_are_emitted_only_when_they_change() -> None:
    s = two_teams(a=Quota(8, borrowing_limit=0))
    job("run").gpus(8, H).running().into(s)
    job("w0").gpus(8, H).into(s)
    job("w1").gpus(8, H).into(s)
    out = decide(s, 0.0)
    assert set(reasons(out)) == {"w0", "w1"}
    assert fold_all(s, out) == 0
    assert decide(s, 1.0) == []
    move_to(s, "run", "succeeded")  # quota frees: w0 goes, w1 moves up
    out = decide(s, 2.0)
    assert set(admitted(out)) == {"w0"}
    assert reasons(out)["w1"].message.endswith("position 1 of 1 in team-a")


def test_deep_backlog_gets_one_stable_reason_and_only_where_another_was() -> None:
    s = two_teams(a=Quota(8, borrowing_limit=0))
    job("run").gpus(8, H).running().into(s)
    for i in range(5):
        stale = (Reason("quota", "old"),) if i == 4 else ()
        job(f"w{i}").gpus(8, H).with_(reasons=stale).into(s)
    out = decide(s, 0.0, AdmissionConfig(detail=2))
    why = reasons(out)
    assert set(why) == {"w0", "w1", "w4"}
    assert why["w1"].message.endswith("position 2 of more than 2 in team-a")
    assert why["w4"] == Reason("quota", "waiting in queue team-a behind 2 or more jobs; its quota is in use")


def test_requeues_stopped_jobs_from_their_checkpoint_and_admits_them() -> None:
    s = two_teams()
    j = move_to(s, job("pre").gpus(8, H).running().into(s).id, "preempted")
    j.attempt = 2
    j.reasons = (Reason("preempted", "preempted for hi"),)
    j.checkpoint = Checkpoint("s3://ckpt/pre/100", 100, 2, 7)
    out = decide(s, 0.0)
    (rq,) = of(out, JobRequeued)
    assert (rq.job_id, rq.attempt, rq.resume_from) == ("pre", 2, "s3://ckpt/pre/100")
    assert rq.reason.message == "preempted for hi; back in queue team-a for attempt 3, resuming from step 100"
    assert admitted(out)["pre"].attempt == 3
    assert fold_all(s, out) == 0
    assert s.jobs["pre"].phase == "admitted"


def test_a_job_requeued_without_a_checkpoint_is_said_to_start_over() -> None:
    # It read "preempted for hi; back in queue team-a for attempt 1" alone: nothing told its
    # owner, or the admin, that the work it had done was lost.
    s = two_teams()
    j = move_to(s, job("pre").gpus(8, H).running().into(s).id, "preempted")
    j.reasons = (Reason("preempted", "preempted for hi"),)
    (rq,) = of(decide(s, 0.0), JobRequeued)
    assert rq.resume_from is None
    said = "preempted for hi; back in queue team-a for attempt 1, from the start (no checkpoint)"
    assert rq.reason.message == said


def test_a_job_without_gpus_needs_no_quota() -> None:
    s = two_teams(a=Quota(0, borrowing_limit=0))
    job("cpu").gpus(0).into(s)
    assert admitted(decide(s, 0.0))["cpu"] == Admission("cpu", 0, 1)


def test_fractional_jobs_share_a_gpu_of_quota() -> None:
    s = two_teams(a=Quota(1, borrowing_limit=0))
    for i in range(5):
        job(f"f{i}").gpus(1, H, milli=250).into(s)
    out = decide(s, 0.0)
    assert sorted(admitted(out)) == ["f0", "f1", "f2", "f3"]
    assert fold_all(s, out) == 0


def test_a_cycle_admits_at_most_its_cap() -> None:
    s = two_teams()
    for i in range(5):
        job(f"j{i}").gpus(1, H).into(s)
    out = decide(s, 0.0, AdmissionConfig(max_admissions=2))
    assert list(admitted(out)) == ["j0", "j1"]
    assert reasons(out) == {}  # not reached this cycle: the next one decides


def test_a_job_may_take_its_second_model_when_the_first_is_full() -> None:
    s = two_teams()
    s.queues["team-a"] = msgspec.structs.replace(
        s.queues["team-a"], quotas={H: Quota(8, borrowing_limit=0), "A100": Quota(8, borrowing_limit=0)}
    )
    job("run").gpus(8, H).running().into(s)
    job("either").gpus(4, H, "A100").into(s)
    assert admitted(decide(s, 0.0))["either"].gpus == {"A100": 4}


def test_decide_is_deterministic_whatever_order_the_state_holds_jobs_in() -> None:
    s = two_teams(a=Quota(8), b=Quota(8))
    rng = random.Random(3)
    for i in range(60):
        q = rng.choice(("team-a", "team-b"))
        j = job(f"j{i}", q).gpus(rng.choice((1, 2, 4, 8)), H).with_(tenant=q[-1], priority=rng.choice((0, 5)))
        j = j.with_(
            phase=rng.choice(("queued", "submitted", "queued")),
            reasons=((Reason("x", "y"),) if i % 7 else ()),
        )
        if rng.random() < 0.2:
            j = j.running()
        j.into(s)
    # The same jobs, in another order: in the State and so in the indexes rebuilt from it.
    shuffled = msgspec.structs.replace(s, jobs=dict(sorted(s.jobs.items(), key=lambda _: rng.random())))
    indexes.rebuild(shuffled)
    assert decide(s, 9.0) == decide(shuffled, 9.0)


def bigs_before_small() -> State:
    """team-a (nominal 8, no borrowing) runs 6 GPUs; four 8-GPU jobs wait, then a 1-GPU job."""
    s = two_teams(a=Quota(8, borrowing_limit=0))
    job("run").gpus(6, H).with_spec(runtime_estimate_s=7200.0).running().into(s)
    for i in range(4):
        job(f"big{i}").gpus(8, H).into(s)
    job("small").gpus(1, H).with_spec(runtime_estimate_s=3600.0).into(s)  # it cannot delay big0
    return s


def test_best_effort_looks_only_so_far_past_jobs_that_do_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(order, "SKIPS", 0)  # every job looked past counts
    s = bigs_before_small()
    assert "small" in admitted(decide(s, 0.0, AdmissionConfig(lookahead=8)))
    out = decide(s, 0.0, AdmissionConfig(lookahead=2))
    assert admitted(out) == {}
    assert reasons(out)["small"].message == (
        "needs 1 H100, which fits now; waiting behind jobs that do not; position 5 of 5 in team-a"
    )


@pytest.mark.parametrize(("skips", "goes"), [(4096, True), (3, True), (2, False)])
def test_jobs_the_room_rules_out_do_not_use_up_the_lookahead(
    monkeypatch: pytest.MonkeyPatch, skips: int, goes: bool
) -> None:
    # big0 is checked and does not fit; the room it leaves (2) rules out big1..big3 at a look,
    # and up to SKIPS of those are passed without counting against the lookahead.
    monkeypatch.setattr(order, "SKIPS", skips)
    assert ("small" in admitted(decide(bigs_before_small(), 0.0, AdmissionConfig(lookahead=2)))) is goes


@pytest.mark.parametrize(("skips", "goes"), [(4096, True), (0, False)])
def test_jobs_that_may_not_borrow_do_not_hide_the_preemptible_ones_behind_them(
    monkeypatch: pytest.MonkeyPatch, skips: int, goes: bool
) -> None:
    # team-a's jobs that may not be preempted fill its nominal 4, so its five others of that kind
    # wait; they come first in its order. The preemptible job behind them may borrow team-b's
    # idle quota, and ends before ``run`` gives the first of them room (the hold lets it go):
    # the room the jobs that may not borrow have left rules the five out at a look, and it is
    # reached within a lookahead of 2.
    monkeypatch.setattr(order, "SKIPS", skips)
    s = two_teams(a=Quota(4), b=Quota(8))
    job("run").gpus(4, H).with_spec(preemptible=False, runtime_estimate_s=7200.0).running().into(s)
    for i in range(5):
        job(f"fixed{i}").gpus(1, H).with_spec(preemptible=False).into(s)
    job("spare").gpus(1, H).with_spec(runtime_estimate_s=3600.0).into(s)
    out = decide(s, 0.0, AdmissionConfig(lookahead=2))
    assert ("spare" in admitted(out)) is goes
    assert set(admitted(out)) <= {"spare"}
    assert fold_all(s, out) == 0


# -- holds: later jobs of a queue do not starve a large one ------------------------------------------


def held_world(estimate: float | None = None) -> State:
    """team-a (nominal 16, no borrowing) runs 8 GPUs until t=100 (its runtime estimate); ``gang``
    (12) waits for them; two 4-GPU jobs, with ``estimate``, come after it."""
    s = two_teams(a=Quota(16, borrowing_limit=0))
    job("run").gpus(8, H).with_spec(runtime_estimate_s=100.0).running().into(s)
    job("gang").gpus(4, H).replicas(3).into(s)
    job("s1").gpus(4, H).with_spec(runtime_estimate_s=estimate).into(s)
    job("s2").gpus(4, H).with_spec(runtime_estimate_s=estimate).into(s)
    return s


def test_the_first_job_that_does_not_fit_holds_its_queues_quota_against_later_jobs() -> None:
    # Letting s1 and s2 take the 8 GPUs left would leave the gang waiting for them too, and for
    # the next small jobs after them, for as long as small jobs keep coming. s1 alone leaves it
    # its 12 once run ends: it goes, whatever its length (Slurm's backfill: a job goes first if it
    # does not put the held job's expected start off).
    s = held_world()
    out = decide(s, 10.0)
    assert list(admitted(out)) == ["s1"]
    assert reasons(out)["s2"] == Reason(
        "quota-held",
        "needs 4 H100, which fits now, but queue team-a holds 12 H100 of its nominal quota for gang, "
        "its first job that does not fit, free of its own jobs at t=100s; a job behind it goes first only "
        "if it leaves it that room or its runtime estimate ends by then; position 2 of 2 in team-a",
    )
    assert reasons(out)["gang"].code == "quota"
    assert fold_all(s, out) == 0
    move_to(s, "run", "succeeded")
    out = decide(s, 100.0)
    assert list(admitted(out)) == ["gang"]  # 12 + s1's 4: the nominal 16
    assert fold_all(s, out) == 0


@pytest.mark.parametrize(
    ("estimate", "goes"),
    [
        pytest.param(50.0, {"s1", "s2"}, id="ends-well-before"),
        pytest.param(90.0, {"s1", "s2"}, id="ends-just-as-the-gang-could-start"),
        # s1 leaves the gang its room when run ends, whatever its length; s2 would not.
        pytest.param(91.0, {"s1"}, id="ends-after"),
        pytest.param(None, {"s1"}, id="no-estimate"),
    ],
)
def test_a_later_job_that_ends_before_the_held_job_could_start_goes_first(
    estimate: float | None, goes: set[str]
) -> None:
    assert set(admitted(decide(held_world(estimate), 10.0))) == goes


def test_no_job_is_known_to_end_before_jobs_without_an_estimate() -> None:
    s = held_world(estimate=1.0)
    s.jobs["run"].spec = msgspec.structs.replace(s.jobs["run"].spec, runtime_estimate_s=None)
    out = decide(s, 10.0)
    assert admitted(out) == {}
    assert "free of its own jobs when jobs without a runtime estimate end" in reasons(out)["s1"].message


def test_a_later_job_that_leaves_the_held_job_room_goes_first() -> None:
    # team-b borrows 8 of team-a's nominal, so the cohort has 6 left: the gang (12) waits for
    # them to be reclaimed. Within team-a's nominal 16, 2 + 12 leaves room for 2 more GPUs.
    s = two_teams(a=Quota(16), b=Quota(8))
    job("b-run", "team-b").gpus(16, H).with_(tenant="b").running().into(s)
    job("a-run").gpus(2, H).running().into(s)
    job("gang").gpus(4, H).replicas(3).into(s)
    job("four").gpus(4, H).into(s)
    job("two").gpus(2, H).into(s)
    out = decide(s, 0.0)
    assert set(admitted(out)) == {"two"}
    assert reasons(out)["four"].code == "quota-held"
    assert reasons(out)["gang"].preemption_helps  # team-b's borrowed GPUs can be reclaimed for it


def _stops_newer(s: State) -> None:
    s.queues["team-a"] = msgspec.structs.replace(
        s.queues["team-a"], preemption=PreemptionPolicy(within_queue="lower-or-newer-equal-priority")
    )


def test_a_later_job_the_held_job_may_stop_goes_first() -> None:
    # team-a's policy lets a job stop its queue's newer jobs of its own priority: s1 and s2 only
    # borrow the gang's room until the gang needs it, as another queue's borrower would. Before,
    # the queue took no new job until its own jobs had drained to leave the gang its room.
    s = held_world()
    _stops_newer(s)
    out = decide(s, 10.0)
    assert set(admitted(out)) == {"s1", "s2"}
    assert fold_all(s, out) == 0


@pytest.mark.parametrize(
    "why",
    [
        pytest.param("spec", id="may-not-be-preempted"),
        pytest.param("class", id="its-class-may-not-be-preempted"),
        pytest.param("cap", id="preempted-as-often-as-its-class-allows"),
        pytest.param("priority", id="of-a-higher-priority"),
    ],
)
def test_a_later_job_the_held_job_may_not_stop_stays_held(why: str) -> None:
    s = held_world()
    _stops_newer(s)
    s.priority_classes["once"] = PriorityClassSpec("once", 0, max_preemptions=1)
    s.priority_classes["fixed"] = PriorityClassSpec("fixed", 0, preemptible=False)
    for j in ("s1", "s2"):
        job_ = s.jobs[j]
        if why == "spec":
            job_.spec = msgspec.structs.replace(job_.spec, preemptible=False)
        elif why == "class":
            job_.spec = msgspec.structs.replace(job_.spec, priority_class="fixed")
        elif why == "cap":
            job_.spec = msgspec.structs.replace(job_.spec, priority_class="once")
            job_.preemptions = 1
        else:
            job_.priority = 5
    out = decide(s, 10.0)
    # s1 leaves the gang its room when run ends, which puts its start off by nothing; s2, which
    # would take that room and which the gang may not stop, stays held.
    assert set(admitted(out)) == {"s1"}
    assert reasons(out)["s2"].code == "quota-held"


def test_a_job_larger_than_its_queues_nominal_holds_nothing() -> None:
    # It can only ever run on borrowed quota, which no hold keeps for it: later jobs go.
    s = two_teams(a=Quota(8), b=Quota(8))
    job("b-run", "team-b").gpus(4, H).with_(tenant="b").running().into(s)
    job("a-run").gpus(4, H).running().into(s)
    job("gang").gpus(4, H).replicas(3).into(s)  # 12 > its nominal 8; 8 left in the cohort
    job("small").gpus(4, H).into(s)
    assert set(admitted(decide(s, 0.0))) == {"small"}


def test_a_strict_fifo_queue_needs_no_hold() -> None:
    s = two_teams(a=Quota(16, borrowing_limit=0), strategy="strict-fifo")
    job("run").gpus(8, H).with_spec(runtime_estimate_s=100.0).running().into(s)
    job("gang").gpus(4, H).replicas(3).into(s)
    job("short").gpus(4, H).with_spec(runtime_estimate_s=1.0).into(s)
    out = decide(s, 0.0)
    assert admitted(out) == {} and reasons(out)["short"].code == "fifo"


def test_a_job_whose_queue_is_gone_is_told_so() -> None:
    s = two_teams()
    job("orphan").gpus(1, H).into(s)
    del s.queues["team-a"]
    out = decide(s, 0.0)
    assert reasons(out)["orphan"].code == "unknown-queue"
    assert admitted(out) == {}


def test_in_a_cohort_tree_who_borrows_less_goes_first() -> None:
    # Kueue scheduler_test.go, "in a hierarchical cohort, workload borrowing less is scheduled
    # first": cohort ``guaranteed`` holds 4 GPUs of its own for its queue ``g`` (nominal 0);
    # ``best-effort`` (nominal 0) is in cohort ``others``, which holds nothing. Both heads
    # borrow; g's only from its own cohort, be's from the root, so g1 goes first although be has
    # the higher priority, and be finds nothing left.
    s = State()
    s.cohorts["root"] = CohortSpec("root")
    s.cohorts["guaranteed"] = CohortSpec("guaranteed", parent="root", quotas={ANY: Quota(4)})
    s.cohorts["others"] = CohortSpec("others", parent="root")
    s.queues["g"] = QueueSpec("g", cohort="guaranteed", quotas={ANY: Quota(0)})
    s.queues["best-effort"] = QueueSpec("best-effort", cohort="others", quotas={ANY: Quota(0)})
    job("be", "best-effort").gpus(4).with_(priority=3, seq=1).into(s)
    job("g1", "g").gpus(4).with_(priority=0, seq=2).into(s)
    ledger = Ledger.from_state(s)
    assert ledger.borrowing_height("g", ANY, 4000) == 1
    assert ledger.borrowing_height("best-effort", ANY, 4000) == 2
    assert set(admitted(decide(s, 0.0))) == {"g1"}


def test_one_gpu_is_said_as_one() -> None:
    # "needs 1 GPUs" and "of its nominal 1 GPUs" in the reasons of one-GPU jobs and queues.
    s = two_teams(a=Quota(2, borrowing_limit=0), key=ANY)
    job("run").gpus(1).running().into(s)
    job("two").gpus(2).into(s)
    why = reasons(decide(s, 0.0))["two"].message
    assert why.startswith("needs 2 GPUs; queue team-a using 1 of its nominal 2 GPUs"), why
    s = two_teams(a=Quota(1, borrowing_limit=0), key=ANY)
    job("run").gpus(1).running().into(s)
    job("one").gpus(1).into(s)
    why = reasons(decide(s, 0.0))["one"].message
    assert why.startswith("needs 1 GPU; queue team-a at its nominal 1/1 GPUs"), why
    assert gpus_text(1000) == "1 GPU" and gpus_text(2500) == "2.5 GPUs"
    assert gpus_text(250) == "0.25 GPUs" and gpus_text(1000, "H100") == "1 H100"


def test_a_job_within_its_nominal_hears_who_borrows_it_for_good() -> None:
    # team-a lent its 8 GPUs to team-b's job, which may not be stopped: its own job waited
    # reading "using 0 of its nominal 8 GPUs; cohort ml has 0 to lend", and no more.
    s = two_teams(a=Quota(8), b=Quota(0), key=ANY)
    job("kept", "team-b").gpus(8).with_(tenant="b").with_spec(preemptible=False).running().into(s)
    job("mine").gpus(8).into(s)
    why = reasons(decide(s, 0.0))["mine"]
    assert why.message.startswith("needs 8 GPUs; queue team-a using 0 of its nominal 8 GPUs"), why
    assert (
        "; of what it lent, jobs that may not be stopped (not preemptible, or preempted as often as "
        "their class allows) borrow other queues 8: it comes back as they end" in why.message
    ), why
    assert not why.preemption_helps
    # A borrower that may be stopped is reclaimed: the reason says so, not the above.
    s = two_teams(a=Quota(8), b=Quota(0), key=ANY)
    job("lent", "team-b").gpus(8).with_(tenant="b").running().into(s)
    job("mine").gpus(8).into(s)
    why = reasons(decide(s, 0.0))["mine"]
    assert why.preemption_helps and "may not be stopped" not in why.message, why
