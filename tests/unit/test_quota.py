"""Quota arithmetic: nominal, borrowing and lending limits, nested cohorts, what a job costs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from corral.events.jobs import Admission, JobSpec, Resources
from corral.events.queues import CohortSpec, QueueSpec, Quota
from corral.projections import indexes, quota
from corral.projections.quota import ANY, Ledger
from corral.projections.state import JobState, State
from corral.services.query.queues import queue_usage
from tests.builders import move_to

G = 1000  # milli-GPU per GPU


# -- builders --------------------------------------------------------------------------------------


def cluster(
    queues: dict[str, tuple[str | None, dict[str, Quota]]],
    cohorts: dict[str, tuple[str | None, dict[str, Quota]]] | None = None,
    held: dict[str, int] | None = None,
    key: str = ANY,
) -> State:
    """Queues ``name -> (cohort, quotas)``, cohorts ``name -> (parent, quotas)``, and running
    jobs holding ``held[queue]`` whole GPUs of ``key`` per queue."""
    s = State()
    for name, (parent, quotas) in (cohorts or {}).items():
        s.cohorts[name] = CohortSpec(name, parent=parent, quotas=quotas)
    for name, (cohort, quotas) in queues.items():
        s.queues[name] = QueueSpec(name, cohort=cohort, quotas=quotas)
    for i, (q, gpus) in enumerate((held or {}).items()):
        hold(s, q, gpus, key, f"held-{i}")
    return s


def hold(s: State, queue: str, gpus: int, key: str = ANY, job_id: str | None = None) -> JobState:
    jid = job_id or f"h{len(s.jobs)}"
    models = () if key == ANY else (key,)
    spec = JobSpec(queue=queue, replicas=gpus, resources=Resources(gpus=1, gpu_models=models))
    job = JobState(
        id=jid,
        tenant="t",
        spec=spec,
        submitted_seq=len(s.jobs) + 1,
        submitted_at=0.0,
        phase="running",
        admission=Admission(jid, 0, gpus, {key: gpus}),
    )
    indexes.add(s, job)
    quota.count_holding(s, job, 1)  # what the fold does when a job is admitted
    return job


def Q(nominal: int, borrow: int | None = None, lend: int | None = None) -> Quota:  # noqa: N802
    return Quota(nominal, borrowing_limit=borrow, lending_limit=lend)


# -- available: what a queue may still take right now ---------------------------------------------


@dataclass
class Case:
    id: str
    queues: dict[str, tuple[str | None, dict[str, Quota]]]
    held: dict[str, int]
    queue: str
    available: int  # whole GPUs
    cohorts: dict[str, tuple[str | None, dict[str, Quota]]] = field(default_factory=dict)


TWO = "team"  # one flat cohort
CASES = [
    Case("no cohort: nominal only", {"a": (None, {ANY: Q(8)})}, {"a": 3}, "a", 5),
    Case("no cohort: exactly at quota", {"a": (None, {ANY: Q(8)})}, {"a": 8}, "a", 0),
    Case(
        "borrow a sibling's idle quota",
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8)})},
        {"a": 8},
        "a",
        8,
    ),
    Case(
        "borrow only what the sibling does not use",
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8)})},
        {"a": 8, "b": 6},
        "a",
        2,
    ),
    Case(
        "borrowing limit caps what may be borrowed",
        {"a": (TWO, {ANY: Q(8, borrow=4)}), "b": (TWO, {ANY: Q(8)})},
        {"a": 8},
        "a",
        4,
    ),
    Case(
        "borrowing limit zero: nominal only",
        {"a": (TWO, {ANY: Q(8, borrow=0)}), "b": (TWO, {ANY: Q(8)})},
        {"a": 8},
        "a",
        0,
    ),
    Case(
        "borrowing limit counts from nominal, not from now",
        {"a": (TWO, {ANY: Q(8, borrow=4)}), "b": (TWO, {ANY: Q(8)})},
        {"a": 10},
        "a",
        2,
    ),
    Case(
        "lending limit zero: nothing to borrow",
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8, lend=0)})},
        {"a": 8},
        "a",
        0,
    ),
    Case(
        "lending limit caps what the sibling lends",
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8, lend=2)})},
        {"a": 8},
        "a",
        2,
    ),
    Case(
        "a lender keeps nominal less lending limit while lending",
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8, lend=2)})},
        {"a": 10},
        "b",
        6,
    ),
    Case(
        "a lender without lending limit must reclaim what it lent",
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8)})},
        {"a": 12},
        "b",
        4,
    ),
    Case(
        "nested: borrow a cousin's idle quota through the organisation",
        {"a": ("t1", {ANY: Q(8)}), "b": ("t1", {ANY: Q(8)}), "c": ("t2", {ANY: Q(8)})},
        {"a": 8, "b": 8},
        "a",
        8,
        cohorts={"org": (None, {}), "t1": ("org", {}), "t2": ("org", {})},
    ),
    Case(
        "nested: a team cohort's borrowing limit caps the whole team",
        {"a": ("t1", {ANY: Q(8)}), "b": ("t1", {ANY: Q(8)}), "c": ("t2", {ANY: Q(8)})},
        {"a": 8, "b": 8},
        "a",
        3,
        cohorts={"org": (None, {}), "t1": ("org", {ANY: Q(0, borrow=3)}), "t2": ("org", {})},
    ),
    Case(
        "nested: a team cohort's lending limit caps what leaves the team",
        {"a": ("t1", {ANY: Q(8)}), "b": ("t1", {ANY: Q(8)}), "c": ("t2", {ANY: Q(8)})},
        {"a": 8, "b": 8},
        "a",
        5,
        cohorts={"org": (None, {}), "t1": ("org", {}), "t2": ("org", {ANY: Q(0, lend=5)})},
    ),
    Case(
        "nested: the organisation's own quota is lent to every team",
        {"a": ("t1", {ANY: Q(8)}), "c": ("t2", {ANY: Q(8)})},
        {"a": 8, "c": 8},
        "a",
        4,
        cohorts={"org": (None, {ANY: Q(4)}), "t1": ("org", {}), "t2": ("org", {})},
    ),
    Case(
        "nested: a sibling in the team lends before the cousin",
        {"a": ("t1", {ANY: Q(8)}), "b": ("t1", {ANY: Q(8, lend=1)}), "c": ("t2", {ANY: Q(8, lend=0)})},
        {"a": 8},
        "a",
        1,
        cohorts={"org": (None, {}), "t1": ("org", {}), "t2": ("org", {})},
    ),
    Case(
        "a cohort named by a queue need not be defined",
        {"a": ("ghost", {ANY: Q(8)}), "b": ("ghost", {ANY: Q(4)})},
        {"a": 8},
        "a",
        4,
    ),
    Case(
        "a queue with no entry for the key may not use it",
        {"a": (TWO, {"H100": Q(8)}), "b": (TWO, {ANY: Q(8)})},
        {},
        "a",
        0,
    ),
    Case(
        "nominal zero listed: borrow only",
        {"a": (TWO, {ANY: Q(0)}), "b": (TWO, {ANY: Q(8)})},
        {},
        "a",
        8,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_available(case: Case) -> None:
    s = cluster(case.queues, case.cohorts, case.held)
    ledger = Ledger.from_state(s)
    assert ledger.available(case.queue, ANY) == case.available * G
    fits_all = quota.admissible(s, case.queue, {ANY: case.available * G})
    assert fits_all is None or case.available == 0
    if case.available >= 0:
        too_much = quota.admissible(s, case.queue, {ANY: case.available * G + 1})
        assert too_much is not None and too_much.code in ("quota", "no-quota")


@pytest.mark.parametrize(
    ("id", "queues", "cohorts", "ceiling"),
    [
        ("no cohort: its nominal", {"a": (None, {ANY: Q(8, borrow=99)})}, {}, 8),
        ("unlimited borrowing: the whole tree", {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8)})}, {}, 16),
        ("borrowing limit", {"a": (TWO, {ANY: Q(8, borrow=2)}), "b": (TWO, {ANY: Q(8)})}, {}, 10),
        ("lending limit of the others", {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8, lend=3)})}, {}, 11),
        (
            "nested limits",
            {"a": ("t1", {ANY: Q(8)}), "c": ("t2", {ANY: Q(8)})},
            {"org": (None, {ANY: Q(2)}), "t1": ("org", {ANY: Q(0, borrow=5)}), "t2": ("org", {})},
            13,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_ceiling_is_the_most_a_queue_could_ever_hold(
    id: str,
    queues: dict[str, tuple[str | None, dict[str, Quota]]],
    cohorts: dict[str, tuple[str | None, dict[str, Quota]]],
    ceiling: int,
) -> None:
    s = cluster(queues, cohorts, {"a": 3, "c": 1} if "c" in queues else {"a": 3})
    assert Ledger.from_state(s).ceiling("a", ANY) == ceiling * G


# -- what a job costs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("id", "res", "key", "milli"),
    [
        ("cpu only", Resources(gpus=0), ANY, 0),
        ("whole GPUs", Resources(gpus=8), ANY, 8 * G),
        ("a quarter GPU", Resources(gpus=1, gpu_milli=250), ANY, 250),
        (
            "MIG 3g.40gb on an A100-80GB is half its memory",
            Resources(gpus=1, mig="3g.40gb"),
            "A100-80GB",
            500,
        ),
        (
            "MIG 1g.10gb unpinned: the larger share it has anywhere",
            Resources(gpus=1, mig="1g.10gb"),
            ANY,
            250,
        ),
        ("MIG 1g.10gb pinned to A100-80GB: one slice", Resources(gpus=1, mig="1g.10gb"), "A100-80GB", 125),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_worker_charge(id: str, res: Resources, key: str, milli: int) -> None:
    assert quota.worker_milli(res, key) == milli


@pytest.mark.parametrize(
    ("id", "quotas", "models", "keys"),
    [
        ("no model: any", {ANY: Q(8), "H100": Q(8)}, (), (ANY,)),
        (
            "first listed model, in the job's order",
            {"A100": Q(1), "H100": Q(1)},
            ("H100", "A100"),
            ("H100", "A100"),
        ),
        ("models the queue does not list are skipped", {"H100": Q(1)}, ("A100", "H100"), ("H100",)),
        ("no listed model: any", {ANY: Q(8)}, ("A100",), (ANY,)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_candidate_keys(
    id: str, quotas: dict[str, Quota], models: tuple[str, ...], keys: tuple[str, ...]
) -> None:
    q = QueueSpec("a", quotas=quotas)
    assert quota.candidate_keys(q, Resources(gpus=1, gpu_models=models)) == keys


@pytest.mark.parametrize(
    ("id", "h100", "a100", "b_h100", "b_a100", "key"),
    [
        ("fits its first model", 0, 0, 4, 0, "H100"),
        ("fits only its second model", 4, 0, 4, 0, "A100"),
        ("fits neither; the second's nominal is lent", 4, 0, 4, 2, "A100"),
        ("fits neither; its own jobs fill both", 4, 2, 4, 0, "H100"),
        ("fits the first by borrowing", 4, 0, 0, 0, "H100"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_key_a_job_of_several_models_counts_against(
    id: str, h100: int, a100: int, b_h100: int, b_a100: int, key: str
) -> None:
    # Queue a: 4 H100 and 4 A100 of nominal; b: 4 H100, no A100 of its own. a's job of 4 GPUs
    # counts against the first model it fits now, borrowing if it must (Kueue's default
    # fungibility); else the first whose nominal only others hold (its queue can take it back);
    # else the first within the nominal.
    s = State()
    s.cohorts["c"] = CohortSpec("c")
    s.queues["a"] = QueueSpec("a", cohort="c", quotas={"H100": Q(4), "A100": Q(4)})
    s.queues["b"] = QueueSpec("b", cohort="c", quotas={"H100": Q(4), "A100": Q(0)})
    ledger = Ledger(s)
    for queue, model, held in (
        ("a", "H100", h100),
        ("a", "A100", a100),
        ("b", "H100", b_h100),
        ("b", "A100", b_a100),
    ):
        ledger.charge(queue, model, held * G)
    spec = JobSpec(queue="a", resources=Resources(gpus=4, gpu_models=("H100", "A100")))
    assert ledger.key_for(
        "a", JobState(id="j", tenant="t", spec=spec, submitted_seq=1, submitted_at=0.0)
    ) == (key, 4 * G)


def test_fractions_are_exact_and_recorded_rounded_up() -> None:
    s = cluster({"a": (None, {ANY: Q(1)})})
    ledger = Ledger.from_state(s)
    for i in range(4):
        jid = f"f{i}"
        spec = JobSpec(queue="a", resources=Resources(gpus=1, gpu_milli=250))
        job = JobState(id=jid, tenant="t", spec=spec, submitted_seq=i + 1, submitted_at=0.0, phase="queued")
        adm = Admission(jid, 0, 1, quota.admission_gpus(ANY, 250))
        assert adm.gpus == {ANY: 1}
        assert ledger.claim(job, adm) is None
    assert ledger.used("a", ANY) == G
    assert ledger.available("a", ANY) == 0


# -- the fold's check of an admission ----------------------------------------------------------------


def _queued(s: State, queue: str, res: Resources, replicas: int = 1) -> JobState:
    spec = JobSpec(queue=queue, replicas=replicas, resources=res)
    job = JobState(id="j", tenant="t", spec=spec, submitted_seq=99, submitted_at=0.0, phase="queued")
    indexes.add(s, job)
    return job


@pytest.mark.parametrize(
    ("id", "adm", "code"),
    [
        ("fits", Admission("j", 0, 2, {"H100": 8}), None),
        ("more than the queue may take", Admission("j", 0, 3, {"H100": 12}), "quota"),
        ("a key the job may not use", Admission("j", 0, 2, {ANY: 8}), "shape"),
        ("GPUs that do not match the replicas", Admission("j", 0, 2, {"H100": 4}), "shape"),
        ("two keys", Admission("j", 0, 2, {"H100": 4, "A100": 4}), "shape"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_check_admission(id: str, adm: Admission, code: str | None) -> None:
    s = cluster({"a": (None, {"H100": Q(10), "A100": Q(10), ANY: Q(10)})})
    job = _queued(s, "a", Resources(gpus=4, gpu_models=("H100",)), replicas=3)
    why = Ledger.from_state(s).check(job, adm)
    assert (why.code if why else None) == code


def test_the_faithful_admission_of_a_job_passes_the_check() -> None:
    s = cluster({"a": (None, {"H100": Q(10), ANY: Q(10)})})
    job = _queued(s, "a", Resources(gpus=1, gpu_milli=300, gpu_models=("A100", "H100")), replicas=3)
    adm = quota.admission(s.queues["a"], job)
    assert adm == Admission("j", 0, 3, {"H100": 1})
    assert Ledger.from_state(s).check(job, adm) is None


def test_claims_are_charged_in_order() -> None:
    s = cluster({"a": (None, {ANY: Q(8)})})
    ledger = Ledger.from_state(s)
    job = _queued(s, "a", Resources(gpus=4))
    assert ledger.claim(job, Admission("j", 0, 1, {ANY: 4})) is None
    assert ledger.claim(job, Admission("j", 0, 1, {ANY: 4})) is None
    why = ledger.claim(job, Admission("j", 0, 1, {ANY: 4}))
    assert why is not None and why.code == "quota"


def test_unknown_queue() -> None:
    why = quota.admissible(State(), "nope", {ANY: G})
    assert why is not None and why.code == "unknown-queue"


def test_released_quota_is_available_again() -> None:
    s = cluster({"a": (None, {ANY: Q(8)})}, held={"a": 8})
    move_to(s, "held-0", "succeeded")  # gives back what it held, as the fold does
    assert Ledger.from_state(s).available("a", ANY) == 8 * G
    assert Ledger.from_jobs(s).available("a", ANY) == 8 * G


def test_charge_and_release_round_trip_through_nested_cohorts() -> None:
    s = cluster(
        {"a": ("t1", {ANY: Q(8, lend=2)}), "b": ("t1", {ANY: Q(4)}), "c": ("t2", {ANY: Q(8)})},
        {"org": (None, {ANY: Q(2)}), "t1": ("org", {ANY: Q(0, lend=3)}), "t2": ("org", {})},
        held={"a": 5, "b": 7, "c": 2},
    )
    ledger = Ledger.from_state(s)
    before = {q: ledger.available(q, ANY) for q in "abc"}
    for q, n in (("a", 3 * G), ("c", 7 * G), ("b", -2 * G)):
        ledger.charge(q, ANY, n)
    for q, n in (("a", 3 * G), ("c", 7 * G), ("b", -2 * G)):
        ledger.charge(q, ANY, -n)
    assert {q: ledger.available(q, ANY) for q in "abc"} == before


# -- corral queues: nominal, used, borrowed, lent ---------------------------------------------------


def test_queue_usage_borrowed_and_lent() -> None:
    s = cluster(
        {"a": (TWO, {ANY: Q(8)}), "b": (TWO, {ANY: Q(8)}), "c": (TWO, {ANY: Q(8, lend=0)})},
        held={"a": 12, "b": 2},
    )
    usage = queue_usage(s)
    a, b, c = (usage[q].keys[ANY] for q in "abc")
    assert (a.used, a.borrowed, a.lent) == (12 * G, 4 * G, 0)
    assert (b.used, b.borrowed, b.lent) == (2 * G, 0, 4 * G)
    assert (c.used, c.borrowed, c.lent) == (0, 0, 0)  # lends nothing: its lending limit is 0
    # b may take what is left of the pool; c keeps its 8 and may borrow that same 2.
    assert b.available == 2 * G and c.available == 10 * G


def test_describe_says_where_the_queue_stands() -> None:
    s = cluster({"a": (TWO, {"H100": Q(16)}), "b": (TWO, {"H100": Q(8)})}, held={"a": 16, "b": 8}, key="H100")
    text = Ledger.from_state(s).describe("a", "H100", 8 * G)
    assert text == "needs 8 H100; queue a at its nominal 16/16 H100; cohort team has 0 to lend"


def test_fmt_gpus() -> None:
    assert [quota.fmt_gpus(m) for m in (0, 16000, 2500, 125)] == ["0", "16", "2.5", "0.125"]
