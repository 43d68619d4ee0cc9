"""What one tenant is told names none of another tenant's jobs, nor queues closed to it.

Each case runs the real services on the simulator (admission, placer, preemptor), folds the
log they wrote into the read service's view, and asks the read service's ``answer`` (and the
forecast role's what-if) as the tenant would: the answer must say why, without the other
tenant's job ids; the same tenant's own jobs are still named. The cases are the places a job's
reason or history speaks of another job: a strict-FIFO queue's head, the room a queue holds for
its first job, the placer's reservation, a preemption, a shrink; and the MIG instances of
``nodes``, and a what-if's victims in a queue closed to the asker. Last, what a tenant is told
is bounded in size whatever it sent or however long its job lives: a cancel's reason, the jobs
let go that a listing adds, a held job's history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from corral.events.base import Event
from corral.events.jobs import JobSpec, Resources
from corral.events.queues import ApplyCohort, ApplyQueue, CohortSpec, QueueSpec, Quota
from corral.projections.visibility import OTHER_JOB
from corral.services.agent import inventory
from corral.services.forecast.decide import whatif_answer
from corral.services.preemptor.decide import PreemptorConfig
from corral.services.query.decide import Ask, answer
from corral.services.query.view import JobView
from corral.services.sim.driver import SimConfig, SimJob, Simulation
from tests.builders import TRAIN


def spec(queue: str, gpus: int = 1, estimate: float = 1000.0, preemptible: bool = True, **kw: Any) -> JobSpec:
    res = Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024)
    return JobSpec(
        queue=queue, resources=res, runtime_estimate_s=estimate, preemptible=preemptible, command=TRAIN, **kw
    )


def folded(
    setup: Sequence[Event],
    jobs: Sequence[SimJob],
    until: float,
    profile: str = "h100-8x",
    config: SimConfig | None = None,
) -> JobView:
    sim = Simulation(inventory.cluster(1, profile), list(setup), list(jobs), config, record=True)
    sim.run(until=until)
    view = JobView(":memory:")
    view.fold(sim.log())
    return view


def ask(view: JobView, asker: str, question: str, **kw: Any) -> dict[str, Any]:
    return answer(view.state, view.history, asker, question, Ask(**kw), view)


def closed(name: str, tenant: str, nominal: int, cohort: str | None = None) -> ApplyQueue:
    quotas = {"*": Quota(nominal=nominal)}
    return ApplyQueue(queue=QueueSpec(name, cohort=cohort, quotas=quotas, tenants=(tenant,)))


SHARED_FIFO = [ApplyQueue(queue=QueueSpec("shared", quotas={"*": Quota(8)}, strategy="strict-fifo"))]
SHARED = [ApplyQueue(queue=QueueSpec("shared", quotas={"*": Quota(8)}))]
APART = [closed("qa", "alice", 16), closed("qb", "bob", 8)]
COHORT = [
    ApplyCohort(cohort=CohortSpec("org")),
    closed("qa", "alice", 4, "org"),
    closed("qb", "bob", 4, "org"),
]


def fifo_head(head_owner: str) -> list[SimJob]:
    return [
        SimJob("alice-running", "alice", spec("shared", 8, 5000), 0.0, 5000.0),
        SimJob("secret-head", head_owner, spec("shared", 8, 5000), 1.0, 5000.0),
        SimJob("bob-1", "bob", spec("shared", 1, 100), 2.0, 100.0),
    ]


def held_for(owner: str) -> list[SimJob]:
    return [
        SimJob("alice-run", "alice", spec("shared", 4, 1000, preemptible=False), 0.0, 1000.0),
        SimJob("secret-70b", owner, spec("shared", 8, 5000, preemptible=False), 1.0, 5000.0),
        SimJob("bob-1", "bob", spec("shared", 2, 5000, preemptible=False), 2.0, 5000.0),
    ]


RESERVED = [
    SimJob("alice-run", "alice", spec("qa", 4, 1000, preemptible=False), 0.0, 1000.0),
    SimJob("secret-70b", "alice", spec("qa", 8, 5000, preemptible=False), 1.0, 5000.0),
    SimJob("bob-1", "bob", spec("qb", 2, 5000, preemptible=False), 2.0, 5000.0),
]


@pytest.mark.parametrize(
    ("setup", "jobs", "said"),
    [
        (SHARED_FIFO, fifo_head("alice"), f"strict FIFO: waiting behind {OTHER_JOB}"),
        (SHARED, held_for("alice"), f"of its nominal quota for {OTHER_JOB}, its first job"),
        (APART, RESERVED, f"the free GPUs that fit are reserved for {OTHER_JOB}"),
    ],
    ids=["fifo-head", "queue-hold", "reservation"],
)
def test_why_a_job_waits_names_no_other_tenants_job(
    setup: list[Event], jobs: list[SimJob], said: str
) -> None:
    view = folded(setup, jobs, until=10.0)
    told = ask(view, "bob", "explain", job="bob-1")
    assert said in told["job"]["reason"]
    listed = ask(view, "bob", "jobs")
    for shown in (told, listed):
        assert "secret" not in json.dumps(shown)
    assert "secret" in json.dumps(ask(view, "admin", "jobs"))  # the admin sees every job


def test_the_admin_is_told_whom_the_gpus_a_job_waits_for_are_reserved_for() -> None:
    # The admin's explain of bob-1 read "reserved for another tenant's job", its owner's words,
    # with nothing to say which, short of reading the log.
    view = folded(APART, RESERVED, until=10.0)
    said = "the free GPUs that fit are reserved for: secret-70b (alice, queue qa)"
    assert said in ask(view, "admin", "explain", job="bob-1")["text"]
    told = ask(view, "bob", "explain", job="bob-1")
    assert "reserved for:" not in told["text"] and "secret" not in json.dumps(told)


def reserved_for(answer: dict[str, Any]) -> list[str | None]:
    return [r.get("reserved_for") for r in answer["reasons"]]


def test_which_job_the_gpus_are_reserved_for_is_data_only_to_whom_may_see_it() -> None:
    # The reason says which job a waiting job waits behind as data too, where the reader may see
    # that job: the admin always, the owner only of its own.
    view = folded(APART, RESERVED, until=10.0)
    assert reserved_for(ask(view, "admin", "explain", job="bob-1")) == ["secret-70b"]
    for told in (ask(view, "bob", "explain", job="bob-1"), ask(view, "bob", "jobs")):
        assert "secret" not in json.dumps(told)
    assert reserved_for(ask(view, "bob", "explain", job="bob-1")) == [None]
    own = [
        SimJob("bob-run", "bob", spec("qb", 4, 1000, preemptible=False), 0.0, 1000.0),
        SimJob("bob-70b", "bob", spec("qb", 8, 5000, preemptible=False), 1.0, 5000.0),
        SimJob("bob-1", "bob", spec("qb", 2, 5000, preemptible=False), 2.0, 5000.0),
    ]
    view = folded([closed("qb", "bob", 16)], own, until=10.0)
    assert reserved_for(ask(view, "bob", "explain", job="bob-1")) == ["bob-70b"]


@pytest.mark.parametrize(
    ("setup", "jobs", "said"),
    [
        (SHARED_FIFO, fifo_head("bob"), "waiting behind secret-head"),
        (SHARED, held_for("bob"), "nominal quota for secret-70b"),
    ],
    ids=["fifo-head", "queue-hold"],
)
def test_the_same_tenants_job_is_named(setup: list[Event], jobs: list[SimJob], said: str) -> None:
    view = folded(setup, jobs, until=10.0)
    assert said in ask(view, "bob", "explain", job="bob-1")["job"]["reason"]


def test_a_preemption_names_neither_side_to_the_other() -> None:
    jobs = [
        SimJob("alice-a1", "alice", spec("qa", 4, 9000), 0.0, 9000.0),
        SimJob("alice-secret-borrow", "alice", spec("qa", 4, 9000), 1.0, 9000.0),
        SimJob("bob-secret-urgent", "bob", spec("qb", 4, 100), 50.0, 100.0),
    ]
    view = folded(COHORT, jobs, until=55.0)
    victim = ask(view, "alice", "explain", job="alice-secret-borrow")
    beneficiary = ask(view, "bob", "explain", job="bob-secret-urgent")
    summaries = [e["summary"] for e in victim["history"]]
    assert any(f"asked to stop and yield to {OTHER_JOB}" in s for s in summaries), summaries  # no checkpoints
    assert any(f"preempted for {OTHER_JOB}" in s for s in summaries), summaries  # its requeue
    assert any(f"victims {OTHER_JOB}" in e["summary"] for e in beneficiary["history"])
    assert "bob-secret" not in json.dumps(victim) and "alice-secret" not in json.dumps(beneficiary)


def test_the_admin_is_told_both_sides_of_a_preemption() -> None:
    # The admin's explain read the owners' texts alone: "preempted for another tenant's job",
    # "victims another tenant's job", with nothing to say which, short of reading the log.
    jobs = [
        SimJob("alice-a1", "alice", spec("qa", 4, 9000), 0.0, 9000.0),
        SimJob("alice-borrow", "alice", spec("qa", 4, 9000), 1.0, 9000.0),
        SimJob("bob-urgent", "bob", spec("qb", 4, 100), 50.0, 100.0),
    ]
    view = folded(COHORT, jobs, until=51.0)
    victim = ask(view, "admin", "explain", job="alice-borrow")["text"]
    assert "  preempted for: bob-urgent (bob, queue qb)\n" in victim, victim
    beneficiary = ask(view, "admin", "explain", job="bob-urgent")["text"]
    assert "  stopped, shrunk or moved for it: alice-borrow (alice, queue qa)\n" in beneficiary, beneficiary
    for tenant, job_id in (("alice", "alice-borrow"), ("bob", "bob-urgent")):
        told = json.dumps(ask(view, tenant, "explain", job=job_id))
        assert "preempted for:" not in told and "shrunk for it:" not in told


def test_a_shrink_names_neither_side_to_the_other() -> None:
    jobs = [
        SimJob("alice-secret-elastic", "alice", spec("qa", 1, 9000, replicas=8, min_replicas=2), 0.0, 9000.0),
        SimJob("bob-secret-urgent", "bob", spec("qb", 4, 100), 50.0, 100.0),
    ]
    view = folded(COHORT, jobs, until=55.0, config=SimConfig(preemptor=PreemptorConfig()))
    shrunk = ask(view, "alice", "explain", job="alice-secret-elastic")
    beneficiary = ask(view, "bob", "explain", job="bob-secret-urgent")
    assert f"workers for {OTHER_JOB}" in shrunk["job"]["reason"]
    assert any(f"shrink of {OTHER_JOB}" in e["summary"] for e in beneficiary["history"])
    assert "bob-secret" not in json.dumps(shrunk) and "alice-secret" not in json.dumps(beneficiary)


def test_nodes_show_whose_mig_instance_only_to_its_owner() -> None:
    mig = JobSpec(
        queue="qa", resources=Resources(gpus=1, mig="1g.10gb", cpu_milli=1000, memory_mib=1024), command=TRAIN
    )
    jobs = [SimJob("alice-secret-finetune", "alice", mig, 0.0, 1000.0)]
    view = folded([closed("qa", "alice", 8), closed("qb", "bob", 8)], jobs, 10.0, "h100-8x-mig")

    def instances(asker: str) -> list[dict[str, Any]]:
        return [i for n in ask(view, asker, "nodes")["nodes"] for i in n["mig_instances"]]

    assert [i["job"] for i in instances("bob")] == [""]
    assert [i["job"] for i in instances("alice")] == ["alice-secret-finetune"]
    assert [i["job"] for i in instances("admin")] == ["alice-secret-finetune"]


def test_a_what_if_names_neither_another_tenants_job_nor_a_queue_closed_to_the_asker() -> None:
    setup = [
        ApplyCohort(cohort=CohortSpec("org")),
        closed("alice-private", "alice", 4, "org"),
        closed("qb", "bob", 4, "org"),
    ]
    jobs = [
        SimJob("alice-secret-1", "alice", spec("alice-private", 4, 9000), 0.0, 9000.0),
        SimJob("alice-secret-2", "alice", spec("alice-private", 4, 9000), 1.0, 9000.0),
    ]
    view = folded(setup, jobs, until=10.0)
    probe = {
        "id": "probe",
        "job": {
            "queue": "qb",
            "resources": {"gpus": 4},
            "runtime_estimate_s": 100,
            "command": ["python", "train.py"],
        },
    }
    told = whatif_answer(view.state, "bob", json.dumps(probe).encode(), 20.0)
    assert told["preempts"] == ["a job of another queue"], told
    assert "alice" not in json.dumps(told)


def test_a_preemptions_line_names_the_owners_victims_and_counts_the_others() -> None:
    from corral.events.decisions import PreemptionRequested, Victim
    from corral.projections.index import summarize

    ev = PreemptionRequested(
        beneficiary="b",
        victims=tuple(Victim(j, 0) for j in ("mine", "x", "y")),
        deadline=80.0,
        based_on=1,
        now=50.0,
    )
    named = {"b": "b", "mine": "mine"}.get
    said = summarize(ev, "b", named=lambda j: named(j) or OTHER_JOB)
    assert said == "preemption requested on its behalf: victims mine, 2 jobs of other tenants"
    assert summarize(ev, "b") == "preemption requested on its behalf: victims mine, x, y"


def test_a_cancels_reason_is_kept_short_wherever_it_is_shown() -> None:
    from corral.events.jobs import REASON_CHARS, CancelJob
    from corral.projections.index import summarize
    from tests.builders import Cluster, LogBuilder, job, queue_spec

    log = LogBuilder().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "j", job()).accept("j")
    log.request("alice", "cancel", CancelJob(job_id="j", reason="x" * 100_000))
    state = log.fold()
    (reason,) = state.jobs["j"].reasons
    assert len(reason.message) == REASON_CHARS and reason.message.endswith("…")
    line = summarize(CancelJob(job_id="j", reason="x" * 100_000), "j")
    assert len(line) < REASON_CHARS + 40


def test_the_jobs_let_go_that_a_listing_adds_are_bounded_in_bytes_not_only_in_number() -> None:
    # 700 jobs let go, each cancelled with a long reason (kept to REASON_CHARS): fewer than
    # MAX_LET_GO, more than the budget's bytes. ``jobs --all`` adds the newest that fit and
    # counts the rest.
    from corral.events.jobs import CancelJob
    from corral.services.query.decide import LET_GO_BYTES, MAX_LET_GO
    from tests.builders import Cluster, LogBuilder, job

    n = 700
    assert n < MAX_LET_GO
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    for i in range(n):
        log.submit("a", f"j{i}", job()).accept(f"j{i}")
        log.request("a", "cancel", CancelJob(job_id=f"j{i}", reason="x" * 10_000))
    log.cordon("node-00", False)  # the last one let go too
    view = JobView(":memory:")
    view.fold(log.records)
    assert not view.state.jobs
    listed = ask(view, "a", "jobs", all=True)
    names = [row["id"] for row in listed["jobs"]]
    assert 1 <= len(names) < n and names == [f"j{i}" for i in range(n - len(names), n)]
    assert listed["more_let_go"] == n - len(names)
    assert LET_GO_BYTES - 2048 < len(json.dumps(listed)) < LET_GO_BYTES + 4096


def test_a_long_lived_jobs_history_keeps_its_first_and_newest_records_and_counts_the_rest() -> None:
    # A job that checkpoints for weeks: its history in the read service kept every record, and
    # its explain grew past what a NATS message carries.
    from corral.projections.index import JobEvent
    from corral.services.query.view import HISTORY_FIRST, HISTORY_MOST, LEFT_OUT
    from tests.builders import Cluster, LogBuilder, job, on

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    log.submit("a", "long", job()).accept("long").admit("long").place(on("node-00", 0, job_id="long"))
    log.started("node-00", "long")
    steps = 3 * HISTORY_MOST
    for step in range(1, steps + 1):
        log.checkpoint("node-00", "long", step)
    view = JobView(":memory:")
    view.fold(log.records)
    events: list[JobEvent] = view.history["long"]
    assert len(events) == HISTORY_MOST
    assert [e.type for e in events[:2]] == ["SubmitJob", "JobAccepted"]
    marker = events[HISTORY_FIRST]
    assert marker.type == LEFT_OUT
    everything = 5 + steps  # submit, accept, admit, place, start, then the checkpoints
    left = everything - (HISTORY_MOST - 1)  # the count is one of the entries
    assert marker.summary.startswith(f"{left} records about it left out")
    assert events[HISTORY_FIRST - 1].seq < marker.seq < events[HISTORY_FIRST + 1].seq
    assert events[-1].summary.startswith(f"checkpoint at step {steps}:")
    told = ask(view, "a", "explain", job="long")
    assert len(told["history"]) == HISTORY_MOST and len(json.dumps(told)) < 256 * 1024


def _accounted(events: list[Any]) -> int:
    """The records a history stands for: one an entry, or the number a count entry gives."""
    from corral.services.query.view import LEFT_OUT, REQUESTS_LEFT_OUT

    counts = (LEFT_OUT, REQUESTS_LEFT_OUT)
    return sum(int(e.summary.split(" ", 1)[0]) if e.type in counts else 1 for e in events)


def test_a_tenants_requests_about_its_job_are_counted_in_its_history_not_kept() -> None:
    # Its submit sent again and again, each refused (or a resize, each taken): 512 entries kept
    # for each of its jobs, up to the jobs a tenant may hold, in every read service, charged to
    # nobody.
    from corral.events.jobs import CancelJob, SubmitJob
    from corral.projections.index import JobEvent
    from corral.services.query.view import REQUESTS_LEFT_OUT, REQUESTS_MOST
    from tests.builders import Cluster, LogBuilder, job

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    log.submit("a", "w", job()).accept("w")
    again = SubmitJob(request_id="w", job=job().build())
    for _ in range(300):
        log.request("a", "submit", again)
    for _ in range(51):
        log.request("a", "cancel", CancelJob(job_id="w", reason="done"))
    view = JobView(":memory:")
    view.fold(log.records)
    assert view.state.rejected_total == 350 and view.state.jobs["w"].phase == "cancelled"
    events: list[JobEvent] = view.history["w"]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["SubmitJob", "JobAccepted"] and kinds.count("SubmitJob") == REQUESTS_MOST, kinds
    (count,) = [e for e in events if e.type == REQUESTS_LEFT_OUT]
    assert count.summary.startswith(f"{1 + 300 + 51 - REQUESTS_MOST} more requests about it left out")
    assert count.seq == log.last_seq and count.refused  # the newest one counted, and its verdict
    assert len(events) == 2 + (REQUESTS_MOST - 1) + 1 and _accounted(events) == 2 + 300 + 51


def test_requests_between_other_records_are_counted_in_one_entry() -> None:
    # Counted a run at a time, a tenant that had something else recorded between two of its
    # requests (a checkpoint, a service's answer) made each request an entry again.
    from corral.events.jobs import SubmitJob
    from corral.services.query.view import REQUESTS_LEFT_OUT, REQUESTS_MOST
    from tests.builders import Cluster, LogBuilder, job, on

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    log.submit("a", "w", job()).accept("w").admit("w").place(on("node-00", 0, job_id="w"))
    log.started("node-00", "w")
    again = SubmitJob(request_id="w", job=job().build())
    for step in range(1, 101):
        log.request("a", "submit", again).checkpoint("node-00", "w", step)
    view = JobView(":memory:")
    view.fold(log.records)
    events = view.history["w"]
    requests = [e for e in events if e.subject.startswith("corral.in.")]
    assert len(requests) == REQUESTS_MOST + 1 and requests[-1].type == REQUESTS_LEFT_OUT
    assert requests[-1].seq == log.last_seq - 1  # where the newest request is
    assert _accounted(events) == 5 + 100 * 2


def test_a_long_history_of_requests_and_checkpoints_accounts_for_every_record() -> None:
    # Runs of requests between a running job's checkpoints: each run one entry, and once the
    # history is full, what the entries left out stood for still counted, not one a count.
    from corral.events.jobs import SubmitJob
    from corral.services.query.view import HISTORY_MOST
    from tests.builders import Cluster, LogBuilder, job, on

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    log.submit("a", "w", job()).accept("w").admit("w").place(on("node-00", 0, job_id="w"))
    log.started("node-00", "w")
    again = SubmitJob(request_id="w", job=job().build())
    for step in range(1, HISTORY_MOST + 100):
        for _ in range(5):
            log.request("a", "submit", again)
        log.checkpoint("node-00", "w", step)
    view = JobView(":memory:")
    view.fold(log.records)
    events = view.history["w"]
    assert len(events) == HISTORY_MOST
    assert _accounted(events) == 5 + (HISTORY_MOST + 99) * 6


def test_the_gpus_of_a_thousand_nodes_come_a_page_at_a_time() -> None:
    # 10,000 GPUs: one answer of every GPU was more than a NATS message carries (1 MiB), and
    # the dashboard's grid of a cluster that size was refused.
    import msgspec

    from corral.services.query.decide import GPUS_PAGE_BYTES
    from tests.builders import Cluster, LogBuilder

    view = JobView(":memory:")
    view.fold(LogBuilder().nodes(Cluster(1_250)).records)
    seen: list[str] = []
    page = ask(view, "a", "gpus")
    while True:
        assert len(msgspec.json.encode(page)) < GPUS_PAGE_BYTES + 4096  # as the service sends it
        seen += [n["name"] for n in page["nodes"]]
        if not page.get("next"):
            break
        page = ask(view, "a", "gpus", node_after=page["next"])
    assert seen == sorted(view.state.nodes) and len(seen) == 1_250


@pytest.mark.parametrize("question", ["gpus", "nodes"])
async def test_every_page_of_the_nodes_is_read(question: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # ``nodes`` was one answer: past a message (a thousand nodes with long labels) nobody got
    # any. It is paged as ``gpus`` is; the dashboard and ``corral nodes`` read every page.
    from corral.services.query import decide
    from corral.services.query.client import every_page
    from tests.builders import Cluster, LogBuilder

    monkeypatch.setattr(decide, "GPUS_PAGE_BYTES", 16 * 1024)

    view = JobView(":memory:")
    view.fold(LogBuilder().nodes(Cluster(1_250)).records)

    class Asked:  # the read service's own answers, as a session brings them
        async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
            return ask(view, asker, question, **fields)

    assert ask(view, "a", question).get("next")
    every = await every_page(Asked(), "a", question)
    assert [n["name"] for n in every["nodes"]] == sorted(view.state.nodes)


async def test_the_dashboard_reads_every_page_of_a_tenants_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the first page was read: a tenant with more rows than a page saw its newest jobs,
    # waiting or running, missing from its own board.
    from corral.services.dashboard import app
    from corral.services.dashboard.app import Feed
    from tests.builders import Cluster, LogBuilder, job

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    for i in range(3000):
        log.submit("a", f"j{i:04d}", job()).accept(f"j{i:04d}")
    view = JobView(":memory:")
    view.fold(log.records)

    class Asked:
        async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
            return ask(view, asker, question, **fields)

    assert ask(view, "a", "jobs").get("next")
    every = await Feed("nats://unused", "a", None)._every_job(Asked())  # type: ignore[arg-type]
    assert sorted(r["id"] for r in every["jobs"]) == sorted(view.state.jobs)
    # Of more pages than it shows, the newest.
    monkeypatch.setattr(app, "JOB_PAGES", 1)
    newest = await Feed("nats://unused", "a", None)._every_job(Asked())  # type: ignore[arg-type]
    ids = [r["id"] for r in newest["jobs"]]
    assert ids and "j2999" in ids and "j0000" not in ids


async def test_the_dashboard_feed_outlives_an_error_and_says_so_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the read service's refusals were caught: any other error ended the feed for good,
    # its last board shown as live.
    import asyncio

    from corral.services.dashboard import app
    from corral.services.dashboard.app import Feed
    from tests.builders import Cluster, LogBuilder, job

    view = JobView(":memory:")
    view.fold(LogBuilder().nodes(Cluster(2)).queue("team-a").submit("a", "j", job()).accept("j").records)
    failed: list[str] = []

    class Asked:
        async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
            if not failed:
                failed.append(question)
                raise RuntimeError("a bug")
            return ask(view, asker, question, **fields)

        async def close(self) -> None:
            pass

    async def session(self: Feed) -> Asked:
        return Asked()

    monkeypatch.setattr(Feed, "_session", session)
    monkeypatch.setattr(app, "RETRY_S", 0.01)
    feed = Feed("nats://unused", "a", None, min_interval=0.01)
    problems: list[str] = []
    running = asyncio.create_task(feed.run())
    try:
        async with asyncio.timeout(10):
            while feed.board is None:
                problems.append(feed.problem)
                await feed.wait_newer(feed.version, 1.0)
    finally:
        running.cancel()
    assert any("could not read the cluster: RuntimeError" in p for p in problems), problems
    assert feed.problem == "" and feed.board is not None


def test_the_refusals_answer_keeps_the_newest_that_fit_a_message() -> None:
    # Refusals are bounded in characters: three tenants' submits under ids of four-byte
    # characters made the admin's answer 1.5 MB, more than a NATS message carries.
    from corral.events.jobs import SubmitJob
    from corral.services.query.decide import REJECTIONS_BYTES
    from tests.builders import Cluster, LogBuilder, job

    log = LogBuilder().nodes(Cluster(1)).queue("team-a")
    grin = "\U0001f600" * 600  # no name: each refused, its id quoted in 2 KB of the message
    for i in range(750):
        log.request("abc"[i % 3], "submit", SubmitJob(request_id=grin + str(i), job=job().build()))
    view = JobView(":memory:")
    view.fold(log.records)
    told = ask(view, "admin", "rejections")
    encoded = len(json.dumps(told, ensure_ascii=False).encode())
    assert REJECTIONS_BYTES // 2 < encoded < REJECTIONS_BYTES + 4096
    rows = told["rejections"]
    assert rows[-1]["seq"] == log.last_seq and told["left_out"] == 750 - len(rows)
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
