"""Admission properties: whatever the cohort tree, quotas and backlog, cycles of ``decide`` folded
through the fold never take a queue past nominal + what it may borrow, never have a cohort lend
more than it has, never take from a queue what its lending limit keeps for it, fold without a
single rejection, and decide the same for the same log."""

from __future__ import annotations

import random
from dataclasses import dataclass

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events import subjects as subj
from corral.events.base import Event, Request
from corral.events.jobs import CancelJob, JobsAdmitted, JobSpec, Resources, SubmitJob
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    FairShareSpec,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections import quota
from corral.projections.fold import apply_event
from corral.projections.lifecycle import HOLDS_QUOTA
from corral.projections.quota import ANY, Ledger
from corral.projections.state import WHOLE, State
from corral.services.admission.decide import AdmissionConfig, decide
from corral.services.admission.order import pending_order
from tests.builders import TRAIN

KEYS = (ANY, "H100")
PRIORITY_CLASSES = ("normal", "high", "low")


@dataclass
class Log:
    """A log being written: requests from tenants, events from admission, folded as they go."""

    state: State
    records: list[tuple[str, Event, str | None]]

    def request(self, body: Request, tenant: str, verb: str) -> None:
        self._fold(subj.request(tenant, verb), body, tenant)

    def cycle(self, now: float, config: AdmissionConfig) -> list[Event]:
        out = decide(self.state, now, config)
        before = self.state.rejected_total
        for e in out:
            if isinstance(e, JobsAdmitted):
                # The fold's quota check of each admission, at its position in the log.
                ledger = Ledger.from_state(self.state)
                for a in e.admissions:
                    assert ledger.claim(self.state.jobs[a.job_id], a) is None, a
                self._fold(subj.decision("admission"), e, None)
            else:
                self._fold(subj.job(e.job_id), e, None)  # type: ignore[attr-defined]
        assert self.state.rejected_total == before, self.state.rejections[-3:]
        return out

    def _fold(self, subject: str, body: Event, tenant: str | None) -> None:
        self.records.append((subject, body, tenant))
        s = self.state
        apply_event(s, s.seq + 1, subject, body, float(s.seq + 1), tenant)


def limit(draw: st.DrawFn, most: int) -> int | None:
    return draw(st.one_of(st.none(), st.integers(0, most)))


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[ApplyCohort], list[ApplyQueue]]:
    """An organisation, 1-3 team cohorts under it, 2-6 queues (one may stand alone)."""
    cohorts = [ApplyCohort(cohort=CohortSpec("org", quotas={ANY: Quota(draw(st.integers(0, 3)))}))]
    teams = [f"team{i}" for i in range(draw(st.integers(1, 3)))]
    for t in teams:
        own = {k: Quota(0, limit(draw, 6), limit(draw, 6)) for k in KEYS if draw(st.booleans())}
        cohorts.append(ApplyCohort(cohort=CohortSpec(t, parent="org", quotas=own)))
    queues = []
    for i in range(draw(st.integers(2, 6))):
        quotas = {
            k: Quota(nominal, limit(draw, 6), limit(draw, nominal))  # it lends its nominal at most
            for k in KEYS
            if k == ANY or draw(st.booleans())
            for nominal in [draw(st.integers(0, 8))]
        }
        cohort = draw(st.sampled_from([*teams, None])) if i else teams[0]
        spec = QueueSpec(
            f"q{i}",
            cohort=cohort,
            quotas=quotas,
            weight=draw(st.sampled_from((1.0, 2.0, 0.5))),
            strategy=draw(st.sampled_from(("best-effort-fifo", "strict-fifo"))),
        )
        queues.append(ApplyQueue(queue=spec))
    return cohorts, queues


@st.composite
def jobs(draw: st.DrawFn, queues: int) -> JobSpec:
    shape = draw(st.sampled_from(("whole", "whole", "fraction", "model", "cpu")))
    if shape == "fraction":
        res = Resources(gpus=1, gpu_milli=draw(st.sampled_from((100, 250, 500))))
    elif shape == "model":
        res = Resources(gpus=draw(st.integers(1, 4)), gpu_models=("H100",))
    elif shape == "cpu":
        res = Resources(gpus=0)
    else:
        res = Resources(gpus=draw(st.integers(1, 4)))
    replicas = draw(st.integers(1, 4))
    lo = draw(st.one_of(st.none(), st.integers(1, replicas)))
    return JobSpec(
        queue=f"q{draw(st.integers(0, queues - 1))}",
        replicas=replicas,
        min_replicas=lo,
        priority_class=draw(st.sampled_from(PRIORITY_CLASSES)),
        resources=res,
        command=TRAIN,
    )


def build(cluster: tuple[list[ApplyCohort], list[ApplyQueue]]) -> Log:
    log = Log(State(), [])
    cohorts, queues = cluster
    for c in cohorts:
        log.request(c, subj.ADMIN, "cohort")
    for q in queues:
        log.request(q, subj.ADMIN, "queue")
    for name, value in (("high", 100), ("low", -10)):
        log.request(
            ApplyPriorityClass(priority_class=PriorityClassSpec(name, value)), subj.ADMIN, "priority-class"
        )
    return log


# -- the invariants ---------------------------------------------------------------------------------


def held(s: State) -> dict[tuple[str, str], int]:
    """Milli-GPU held per (queue, key), summed from the jobs themselves."""
    out: dict[tuple[str, str], int] = {}
    for j in s.jobs.values():
        if j.phase in HOLDS_QUOTA and j.admission is not None:
            for k in j.admission.gpus:
                out[j.spec.queue, k] = out.get((j.spec.queue, k), 0) + (
                    quota.worker_milli(j.spec.resources, k) * j.admission.replicas
                )
    return out


def root_of(s: State, cohort: str | None, queue: str) -> str:
    if cohort is None:
        return f"queue:{queue}"
    while (c := s.cohorts.get(cohort)) is not None and c.parent is not None:
        cohort = c.parent
    return cohort


def check_invariants(s: State) -> None:
    used = held(s)
    ledger = Ledger.from_state(s)
    borrowed: dict[tuple[str, str], int] = {}
    lendable: dict[tuple[str, str], int] = {}
    for name, q in s.queues.items():
        root = root_of(s, q.cohort, name)
        for k in KEYS:
            u = used.get((name, k), 0)
            quota_ = q.quotas.get(k)
            if quota_ is None:
                assert u == 0, f"{name} holds {u} of {k}, which it has no quota for"
                continue
            nominal = quota_.nominal * WHOLE
            # A queue never holds more than nominal + what it may borrow.
            if q.cohort is None:
                assert u <= nominal, (name, k, u)
            elif quota_.borrowing_limit is not None:
                assert u <= nominal + quota_.borrowing_limit * WHOLE, (name, k, u)
            assert u <= ledger.ceiling(name, k), (name, k, u)
            # What the lending limit keeps for a queue is always there for it to take.
            if q.cohort is not None and quota_.lending_limit is not None:
                kept = max(0, nominal - quota_.lending_limit * WHOLE)
                assert ledger.available(name, k) >= kept - u, (name, k)
            borrowed[root, k] = borrowed.get((root, k), 0) + max(0, u - nominal)
            lend = nominal if quota_.lending_limit is None else min(nominal, quota_.lending_limit * WHOLE)
            if q.cohort is not None:
                lendable[root, k] = lendable.get((root, k), 0) + max(0, min(lend, nominal - u))
    for name, c in s.cohorts.items():
        for k, cq in c.quotas.items():
            root = root_of(s, name, "")
            lendable[root, k] = lendable.get((root, k), 0) + cq.nominal * WHOLE
    # A cohort never lends more than its members' idle lendable quota and its own.
    for tree, b in borrowed.items():
        assert b <= lendable.get(tree, 0), (tree, b, lendable.get(tree, 0))


# -- the properties -----------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(data=st.data(), cluster=clusters())
def test_repeated_cycles_keep_quota_invariants(
    data: st.DataObject, cluster: tuple[list[ApplyCohort], list[ApplyQueue]]
) -> None:
    log = build(cluster)
    half_life = FairShareSpec(half_life_s=data.draw(st.sampled_from((1.0, 60.0, 3600.0))))
    log.request(ApplyFairShare(fair_share=half_life), subj.ADMIN, "fair-share")
    n_queues = len(cluster[1])
    config = AdmissionConfig(detail=3, lookahead=4)
    rng = random.Random(data.draw(st.integers(0, 2**16)))
    n = 0
    for _cycle in range(data.draw(st.integers(1, 5))):
        for spec in data.draw(st.lists(jobs(n_queues), max_size=12)):
            log.request(SubmitJob(request_id=f"j{n}", job=spec), f"t{n % 3}", "submit")
            n += 1
        log.cycle(float(log.state.seq), config)
        check_invariants(log.state)
        # Some admitted jobs end (cancelled by the admin), which gives their quota back.
        holding = sorted(j.id for j in log.state.jobs.values() if j.phase in HOLDS_QUOTA)
        for jid in rng.sample(holding, k=len(holding) // 2):
            log.request(CancelJob(job_id=jid), subj.ADMIN, "cancel")
        check_invariants(log.state)
    log.cycle(float(log.state.seq), config)
    check_invariants(log.state)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), cluster=clusters())
def test_same_log_same_order_and_decisions(
    data: st.DataObject, cluster: tuple[list[ApplyCohort], list[ApplyQueue]]
) -> None:
    log = build(cluster)
    for i, spec in enumerate(data.draw(st.lists(jobs(len(cluster[1])), min_size=1, max_size=25))):
        log.request(SubmitJob(request_id=f"j{i}", job=spec), "t", "submit")
    log.cycle(float(log.state.seq), AdmissionConfig())
    for i, spec in enumerate(data.draw(st.lists(jobs(len(cluster[1])), max_size=10))):
        log.request(SubmitJob(request_id=f"k{i}", job=spec), "t", "submit")
    # Fold the same log again from nothing: the same order, the same decisions.
    again = State()
    for seq, (subject, body, tenant) in enumerate(log.records, 1):
        apply_event(again, seq, subject, body, float(seq), tenant)
    assert again == log.state
    now = float(log.state.seq) + 7.0
    assert [j.id for j in pending_order(log.state, now)] == [j.id for j in pending_order(again, now)]
    assert decide(log.state, now) == decide(again, now)
    # Nor does it matter in which order the State holds its jobs (e.g. after a snapshot).
    rng = random.Random(data.draw(st.integers(0, 2**16)))
    shuffled = msgspec.structs.replace(
        again, jobs=dict(sorted(again.jobs.items(), key=lambda _: rng.random()))
    )
    assert decide(shuffled, now) == decide(log.state, now)
