"""The read service's answers, pure: who sees which jobs, queues, rejections and histories.

One small log with three tenants' worth of work; each case asks one question as one asker and
says what the answer must (and must not) show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from corral.events import subjects
from corral.events.base import Reason
from corral.events.jobs import CancelJob, JobAccepted, JobRejected, PendingReasonChanged
from corral.events.queues import QueueSpec, Quota
from corral.events.reader import Stall
from corral.projections.index import JobEvent
from corral.projections.state import State
from corral.services.query.decide import Ask, BadAsk, answer, parse_ask, settled
from corral.services.query.view import JobView
from corral.services.runtime import identities
from tests.builders import Cluster, LogBuilder, job

WAITING = Reason("quota", "queue qa has 0 of 8 GPUs free", preemption_helps=True)


def small_log() -> LogBuilder:
    log = LogBuilder().nodes(Cluster(1))
    log.queue(QueueSpec("qa", quotas={"*": Quota(8)}, tenants=("a",)))
    log.queue(QueueSpec("qb", quotas={"*": Quota(8)}, tenants=("b",)))
    log.queue(QueueSpec("open", quotas={"*": Quota(8)}))
    log.submit("a", "ja", job("qa").gpus(16))
    log.submit("b", "jb", job("qb"))
    log.submit("b", "jb2", job("open"))
    log.event(subjects.job("ja"), PendingReasonChanged(job_id="ja", reasons=(WAITING,)))
    log.request("a", "cancel", CancelJob(job_id="jb"))  # refused: not a's job
    log.request("b", "cancel", CancelJob(job_id="ja"))  # refused: not b's job
    log.submit("b", "bad.id", job("qb"))  # refused: malformed id
    return log


@pytest.fixture(scope="module")
def world() -> tuple[State, dict[str, list[JobEvent]]]:
    view = JobView(":memory:")
    view.fold(small_log().records)
    return view.state, view.history


def ids(key: str) -> Callable[[dict[str, Any]], set[str]]:
    field = {"jobs": "id", "queues": "queue", "rejections": "subject", "nodes": "name"}[key]
    return lambda a: {row[field] for row in a[key]}


@dataclass(frozen=True)
class Case:
    asker: str
    question: str
    ask: Ask
    expect: Callable[[dict[str, Any]], Any]
    wanted: Any


CASES = {
    "tenant lists its own jobs": Case("a", "jobs", Ask(), ids("jobs"), {"ja"}),
    "other tenant lists its own": Case("b", "jobs", Ask(), ids("jobs"), {"jb", "jb2"}),
    "admin lists every job": Case("admin", "jobs", Ask(), ids("jobs"), {"ja", "jb", "jb2"}),
    "unknown tenant lists nothing": Case("c", "jobs", Ask(), ids("jobs"), set()),
    "own job explained": Case("a", "explain", Ask("ja"), lambda a: a["job"]["id"], "ja"),
    "own job's pending reason": Case(
        "a", "explain", Ask("ja"), lambda a: [r["code"] for r in a["reasons"]], ["quota"]
    ),
    "other's job is no job": Case("a", "explain", Ask("jb"), lambda a: set(a), {"seq", "error"}),
    "missing job is no job": Case("a", "explain", Ask("nope"), lambda a: a["error"], "no job nope"),
    "admin explains any job": Case("admin", "explain", Ask("jb"), lambda a: a["job"]["tenant"], "b"),
    "wildcard id finds nothing": Case("a", "explain", Ask("*"), lambda a: a["error"], "no job *"),
    "tail wildcard id finds nothing": Case("a", "explain", Ask(">"), lambda a: a["error"], "no job >"),
    "dotted id finds nothing": Case("a", "explain", Ask("ja.x"), lambda a: a["error"], "no job ja.x"),
    "queues open to a": Case("a", "queues", Ask(), ids("queues"), {"qa", "open"}),
    "queues open to b": Case("b", "queues", Ask(), ids("queues"), {"qb", "open"}),
    "queues open to a stranger": Case("c", "queues", Ask(), ids("queues"), {"open"}),
    "admin sees every queue": Case("admin", "queues", Ask(), ids("queues"), {"qa", "qb", "open"}),
    "a's refused requests": Case("a", "rejections", Ask(), ids("rejections"), {"corral.in.a.cancel"}),
    "b's refused requests": Case(
        "b", "rejections", Ask(), ids("rejections"), {"corral.in.b.cancel", "corral.in.b.submit"}
    ),
    "admin sees every refusal": Case(
        "admin",
        "rejections",
        Ask(),
        ids("rejections"),
        {"corral.in.a.cancel", "corral.in.b.cancel", "corral.in.b.submit"},
    ),
    "everyone sees the nodes": Case("c", "nodes", Ask(), ids("nodes"), {"node-00"}),
    "everyone sees the nodes' GPUs": Case("c", "gpus", Ask(), ids("nodes"), {"node-00"}),
    "unknown question": Case(
        "a", "secrets", Ask(), lambda a: a["error"].split(";")[0], "no question 'secrets'"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_answer(case: Case, world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    state, history = world
    got = answer(state, history, case.asker, case.question, case.ask)
    assert got["seq"] == state.seq
    assert case.expect(got) == case.wanted


def test_another_tenants_job_is_answered_as_a_missing_one(
    world: tuple[State, dict[str, list[JobEvent]]],
) -> None:
    state, history = world
    other = answer(state, history, "a", "explain", Ask("jb"))
    missing = answer(state, history, "a", "explain", Ask("zz"))
    assert other == {**missing, "error": missing["error"].replace("zz", "jb")}


def test_history_keeps_others_attempts_out(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    """b's refused cancel of a's job is b's business, not part of the job a is shown."""
    state, history = world
    told = answer(state, history, "a", "explain", Ask("ja"))
    assert [h["subject"] for h in told["history"]] == ["corral.in.a.submit", "corral.ev.job.ja"]
    assert told["refused"] == []
    assert "pending" in told["text"] and "[quota]" in told["text"]


PARSES = {
    "nothing": (b"", Ask()),
    "bare id": (b" j-1\n", Ask("j-1")),
    "object": (b'{"job": "j-1", "after": 7}', Ask("j-1", 7)),
    "tenant field ignored": (b'{"job": "j-1", "tenant": "b", "asker": "admin"}', Ask("j-1")),
    "wildcard id kept as text": (b"corral.>", Ask("corral.>")),
}


@pytest.mark.parametrize(("data", "want"), PARSES.values(), ids=PARSES.keys())
def test_parse_ask(data: bytes, want: Ask) -> None:
    assert parse_ask(data) == want


@pytest.mark.parametrize("data", [b"{", b'{"job": 5}', b'{"after": "soon"}'], ids=["cut", "id", "after"])
def test_unreadable_question(data: bytes) -> None:
    with pytest.raises(BadAsk):
        parse_ask(data)


def test_payload_tricks_change_nothing(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    state, history = world
    plain = answer(state, history, "a", "jobs", Ask())
    tricked = answer(state, history, "a", "jobs", parse_ask(b'{"tenant": "admin", "job": "*"}'))
    assert plain == tricked


# -- identities -----------------------------------------------------------------------------------


def test_tenant_permissions_are_its_own_subjects_only() -> None:
    p = identities.permissions("a")
    assert p is not None
    assert p.publish == ("corral.req.a.>", "corral.read.a.>")
    assert p.subscribe == ("_INBOX.corral.a.>",)
    services = identities.permissions(identities.SERVICES)
    assert services is not None and services.publish == (">",)
    assert {"$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>"} <= set(services.deny_publish)


def test_the_intake_appends_requests_and_answers_into_inboxes_only() -> None:
    p = identities.permissions(identities.INTAKE)
    assert p is not None
    assert set(p.publish) == {
        "corral.in.>",
        "corral.ev.node.*",  # the node agents' reports
        "_INBOX.corral.>",
        "_INBOX.agent.>",
        "$JS.API.STREAM.INFO.CORRAL",
    }
    assert set(p.subscribe) == {"corral.req.>", "corral.nreq.>", "_INBOX.intake.>"}


def test_an_agent_sends_its_reports_to_the_intake_and_writes_no_stream_subject() -> None:
    p = identities.permissions(identities.agent("n1"))
    assert p is not None
    assert "corral.nreq.n1" in p.publish
    assert not any(s.startswith(("corral.ev", "corral.in", "$JS.API.STREAM.INFO.CORRAL")) for s in p.publish)


def test_read_service_publishes_only_into_inboxes_and_reads_the_stream() -> None:
    p = identities.permissions(identities.QUERY)
    assert p is not None
    assert not any(s.startswith(("corral.in", "corral.ev", ">")) for s in p.publish)
    assert "_INBOX.corral.>" in p.publish
    forecasts = "$JS.API.DIRECT.GET.KV_corral_forecasts.>"  # the start forecasts, key by key
    output = "$JS.API.DIRECT.GET.corral_output"  # workers' output, message by message
    assert all(
        s.startswith(("$JS.API.STREAM.INFO.", "$JS.API.CONSUMER.", "$JS.FC.", "_INBOX."))
        or s in (forecasts, output)
        for s in p.publish
    )
    # it hears the output's subjects (to follow a job) and no other stream's
    assert set(p.subscribe) == {"_INBOX.query.>", "corral.read.>", "corral.out.>"}


def test_an_agent_ships_its_own_nodes_output_only_and_a_tenant_none() -> None:
    p = identities.permissions(identities.agent("n1"))
    assert p is not None
    assert {s for s in p.publish if "out" in s} == {
        "corral.out.n1.>",
        "$JS.API.DIRECT.GET.corral_output.corral.out.n1.>",
    }
    tenant = identities.permissions("a")
    assert tenant is not None and not any("out" in s for s in (*tenant.publish, *tenant.subscribe))


@pytest.mark.parametrize("name", ["admin", "services", "query", "a.b", "*", ">", "", "a b"])
def test_reserved_or_odd_tenant_names_are_refused(name: str) -> None:
    with pytest.raises(identities.CredentialsError):
        identities.check_tenant(name)


def test_credentials_are_private_and_kept(tmp_path: Any) -> None:
    path = tmp_path / "credentials.json"
    first = identities.ensure(path, ["a"])
    assert set(first) == {"services", "query", "intake", "admin", "a"}
    assert path.stat().st_mode & 0o777 == 0o600
    second = identities.ensure(path, ["a", "b"])
    assert {k: second[k] for k in first} == first
    assert second["b"] and second["b"] != second["a"]


def test_parse_read_subject() -> None:
    assert identities.parse_read("corral.read.a.jobs") == ("a", "jobs")
    assert identities.parse_read("corral.read.a.jobs.x") is None
    assert identities.parse_read("corral.in.a.jobs") is None


# -- verdicts: what became of a request, asked after the position the intake stored it at ------


def verdict_log() -> tuple[LogBuilder, dict[str, int]]:
    """Requests of tenants a and b, and where each was stored."""
    log = LogBuilder().nodes(Cluster(1))
    at: dict[str, int] = {}

    def stored(name: str, step: LogBuilder) -> None:
        at[name] = step.last_seq

    stored("queue qa", log.queue(QueueSpec("qa", quotas={"*": Quota(8)}, tenants=("a",))))
    stored("submit ja", log.submit("a", "ja", job("qa")))
    log.event(subjects.job("ja"), JobAccepted(job_id="ja", priority=0))
    stored("submit jr", log.submit("a", "jr", job("qa").gpus(80)))
    why = Reason("never-fits", "needs 80 GPUs; queue qa can hold at most 8")
    log.event(subjects.job("jr"), JobRejected(job_id="jr", request_seq=at["submit jr"], reason=why))
    stored("submit jw", log.submit("a", "jw", job("qa")))  # admission has not judged it yet
    stored("submit ja again", log.submit("a", "ja", job("qa")))
    stored("submit ja changed", log.submit("a", "ja", job("qa").gpus(8)))
    stored("b takes ja's id", log.submit("b", "ja", job("qa")))
    stored("cancel nosuch", log.request("a", "cancel", CancelJob(job_id="nosuch")))
    stored("b cancels ja", log.request("b", "cancel", CancelJob(job_id="ja")))
    stored("a cancels ja", log.request("a", "cancel", CancelJob(job_id="ja")))
    stored("a cancels ja again", log.request("a", "cancel", CancelJob(job_id="ja")))
    return log, at


VERDICTS = {
    "accepted": ("a", "submit", "ja", "submit ja", ("accepted", None)),
    "rejected with admission's reason": ("a", "submit", "jr", "submit jr", ("rejected", "needs 80 GPUs")),
    "not judged yet": ("a", "submit", "jw", "submit jw", ("pending", None)),
    "the same id twice is one job": ("a", "submit", "ja", "submit ja again", ("accepted", None)),
    # Told "accepted", its owner took the job of the id for the one it sent again, changed.
    "the same id with another spec is refused": (
        "a",
        "submit",
        "ja",
        "submit ja changed",
        ("refused", "job ja was submitted with another spec"),
    ),
    "another's id is taken": ("b", "submit", "ja", "b takes ja's id", ("refused", "job id ja is taken")),
    "cancel of no job": ("a", "cancel", "nosuch", "cancel nosuch", ("refused", "no such job nosuch")),
    "cancel of another's job": ("b", "cancel", "ja", "b cancels ja", ("refused", "no such job ja")),
    "cancel applied": ("a", "cancel", "ja", "a cancels ja", ("applied", None)),
    "cancel of a finished job": ("a", "cancel", "ja", "a cancels ja again", ("refused", "already cancelled")),
    # Asked where the asker made no such request, a cancel was answered "applied".
    "another's cancel is not one's own": (
        "b",
        "cancel",
        "ja",
        "a cancels ja",
        ("refused", "no cancel of ja by b"),
    ),
    "no cancel at that position": ("a", "cancel", "ja", "submit jw", ("refused", "no cancel of ja by a")),
    "a cancel there, of another job": (
        "a",
        "cancel",
        "jw",
        "a cancels ja",
        ("refused", "no cancel of jw"),
    ),
    "a cancel there, asked as a resize": (
        "a",
        "resize",
        "ja",
        "a cancels ja",
        ("refused", "no resize of ja"),
    ),
    "the admin's queue applied": ("admin", "queue", "qa", "queue qa", ("applied", None)),
    "no queue applied there": ("admin", "queue", "qa", "submit ja", ("refused", "no queue of qa by admin")),
    "another's submit is no submit": ("b", "submit", "jr", "submit jr", ("refused", "no submit of job jr")),
}


@pytest.mark.parametrize(
    ("asker", "verb", "job_id", "stored_as", "want"), VERDICTS.values(), ids=VERDICTS.keys()
)
def test_verdict(asker: str, verb: str, job_id: str, stored_as: str, want: tuple[str, str | None]) -> None:
    log, at = verdict_log()
    view = JobView(":memory:")
    view.fold(log.records)
    got = answer(view.state, view.history, asker, "verdict", Ask(job_id, at[stored_as], verb=verb), view)
    kind, reason = want
    assert got["verdict"] == kind
    if reason is not None:
        assert reason in got["reason"]
    if kind == "refused":  # one's own refusal only: a tenant learns nothing of another's request
        assert set(got) == {"seq", "verdict", "code", "reason"}


def test_a_refusal_pushed_out_by_others_is_not_read_as_applied() -> None:
    # The state keeps the newest refusals only: b's flood of cancels of no job pushed a's out,
    # and a's cancel of no job read "applied", then "unknown". Now a tenant's flood pushes out
    # its own refusals only: what is no longer known of b's is said so, a's stay known.
    from corral.projections.state import MAX_REJECTIONS

    log, at = verdict_log()
    for _ in range(MAX_REJECTIONS + 1):
        log.request("b", "cancel", CancelJob(job_id="nosuch"))
    view = JobView(":memory:")
    view.fold(log.records)
    got = answer(
        view.state, view.history, "b", "verdict", Ask("ja", at["b takes ja's id"], verb="submit"), view
    )
    assert got["verdict"] == "unknown", got
    got = answer(
        view.state, view.history, "a", "verdict", Ask("nosuch", at["cancel nosuch"], verb="cancel"), view
    )
    assert (got["verdict"], got["reason"]) == ("refused", "no such job nosuch"), got
    rows = answer(view.state, view.history, "a", "rejections", Ask(), view)["rejections"]
    assert at["cancel nosuch"] in [r["seq"] for r in rows]
    got = answer(view.state, view.history, "a", "verdict", Ask("ja", at["submit ja"], verb="submit"), view)
    assert got["verdict"] == "accepted"  # a submit that made its job is known by the job


def test_a_cancel_older_than_the_view_keeps_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.services.query import view as view_module

    monkeypatch.setattr(view_module, "REQUESTS_KEPT", 2)
    log, at = verdict_log()
    later = []
    for other in ("jb", "jc"):
        log.submit("a", other, job("qa"))
        log.event(subjects.job(other), JobAccepted(job_id=other, priority=0))
        later.append(log.request("a", "cancel", CancelJob(job_id=other)).last_seq)
    view = JobView(":memory:")
    view.fold(log.records)
    ask = Ask("ja", at["a cancels ja"], verb="cancel")
    assert answer(view.state, view.history, "a", "verdict", ask, view)["verdict"] == "unknown"
    ask = Ask("jb", later[0], verb="cancel")
    assert answer(view.state, view.history, "a", "verdict", ask, view)["verdict"] == "applied"


def test_a_refused_cancel_delivered_again_is_not_read_as_applied() -> None:
    # A record folded already is skipped by the fold; the view took a redelivered refusal for
    # a request the fold took, and once the refusal was pushed out it read "applied".
    from corral.projections.state import MAX_REJECTIONS

    log, at = verdict_log()
    again = at["a cancels ja again"]
    for _ in range(MAX_REJECTIONS + 1):
        log.request("b", "cancel", CancelJob(job_id="nosuch"))
    view = JobView(":memory:")
    view.fold([r for r in log.records if r.seq <= again])
    view.fold([r for r in log.records if r.seq == again])  # delivered again
    view.fold([r for r in log.records if r.seq > again])
    got = answer(view.state, view.history, "a", "verdict", Ask("ja", again, verb="cancel"), view)
    assert got["verdict"] == "refused", got


def test_a_verdict_waits_for_the_log_to_get_there() -> None:
    log, at = verdict_log()
    view = JobView(":memory:")
    view.fold(log.records[: at["submit ja"] - 1])
    ask = Ask("ja", at["submit ja"], verb="submit", wait=5.0)
    assert not settled(view.state, "a", "verdict", ask, view)
    assert answer(view.state, view.history, "a", "verdict", ask, view)["verdict"] == "pending"
    view.fold(log.records[at["submit ja"] - 1 :])
    assert settled(view.state, "a", "verdict", ask, view)


def test_a_verdict_of_no_verb_is_refused(world: tuple[State, dict[str, list[JobEvent]]]) -> None:
    state, history = world
    assert "verdict" in answer(state, history, "a", "verdict", Ask("ja", 1, verb="drop"))["error"]


WAITS = {"negative": (-1.0, 0.0), "NaN": (float("nan"), 0.0), "huge": (1e9, 60.0), "some": (2.5, 2.5)}


@pytest.mark.parametrize(("wait", "patience"), WAITS.values(), ids=WAITS.keys())
def test_how_long_a_question_may_wait_is_bounded(wait: float, patience: float) -> None:
    assert Ask(wait=wait).patience() == patience


def _reader(stall: Stall | None = None) -> tuple[Any, list[tuple[str, dict[str, object]]]]:
    """A read service with no log and no forecasts, and the answers it sends, as sent; its log
    cannot be read on since ``stall`` (None: it can)."""
    import json
    from types import SimpleNamespace

    from corral.services.query import service

    class NoForecasts:
        async def get(self, tenant: str) -> None:
            return None

    log = SimpleNamespace(nc=None, stalled=lambda: stall)
    reader = service.ReadService(log, forecasts=NoForecasts())  # type: ignore[arg-type]
    replies: list[tuple[str, dict[str, object]]] = []

    async def send(reply: str, body: object) -> float:
        replies.append((reply, json.loads(json.dumps(body, default=str))))
        return 0.0

    reader._send = send  # type: ignore[method-assign]
    return reader, replies


async def test_questions_answered_at_once_are_taken_one_asker_at_a_time() -> None:
    # One tenant asking in a loop made another's question wait behind all of its own: they are
    # answered in turn per asker, and past its share an asker is told the service is busy.
    import asyncio
    from types import SimpleNamespace

    from corral.services.query import service

    reader, replies = _reader()

    def question(who: str, n: int) -> SimpleNamespace:
        inbox = f"{identities.inbox_prefix(who)}.{n}"
        return SimpleNamespace(subject=identities.read_subject(who, "queues"), reply=inbox, data=b"{}")

    try:
        for n in range(service.MAX_QUEUED_PER_ASKER + 1):
            await reader._on_question(question("b", n))  # type: ignore[arg-type]
        await reader._on_question(question("a", 0))  # type: ignore[arg-type]
        busy = [r for r, body in replies if body.get("busy") is True and "busy" in str(body.get("error"))]
        assert busy == [f"{identities.inbox_prefix('b')}.{service.MAX_QUEUED_PER_ASKER}"]
        await asyncio.wait_for(reader._answer_queued(), 10)
        assert not reader._turns and not reader._queued
        order = [r.rsplit(".", 2)[-2] for r, body in replies if "error" not in body]
        assert order[:3] == ["b", "a", "b"] and order.count("b") == service.MAX_QUEUED_PER_ASKER
    finally:
        reader.close()


async def test_the_loop_runs_between_answers() -> None:
    # A pass over the questions queued answered all of them without once giving the loop up:
    # eight tenants with a queue each of questions that cost 12 ms on a state of 40,000 jobs
    # stalled the fold, and in ``corral up`` every service, for seconds.
    import asyncio
    from types import SimpleNamespace

    reader, replies = _reader()

    def question(who: str, n: int) -> SimpleNamespace:
        inbox = f"{identities.inbox_prefix(who)}.{n}"
        return SimpleNamespace(subject=identities.read_subject(who, "queues"), reply=inbox, data=b"{}")

    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    other = asyncio.create_task(other_work())
    try:
        for who in "abcdefgh":
            for n in range(8):
                await reader._on_question(question(who, n))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the other work under way
        before = ticks
        await asyncio.wait_for(reader._answer_queued(), 10)
        assert len(replies) == 64
        assert ticks - before >= len(replies) - 1  # it ran between every two answers
    finally:
        other.cancel()
        reader.close()


async def test_an_asker_past_its_share_of_the_read_services_time_is_told_busy() -> None:
    # One tenant asking in a loop kept the read service busy answering it alone (a page of
    # jobs costs some 30 ms at 40,000 jobs): its turns bounded how long another tenant waited,
    # nothing bounded how much of the service's time it took from the fold and, in ``corral
    # up``, from every service. Each asker has a share of its time; past it, it is told busy
    # with when to ask again, and another asker is still answered.
    from types import SimpleNamespace

    from corral.services.runtime.spent import Spent

    reader, replies = _reader()
    # paid back so slowly that whatever the first answer cost is owed at the second question
    reader.spent = Spent(share=1e-9, most_s=0.0, share_all=1e-9, most_all_s=1e9)

    def question(who: str, n: int) -> SimpleNamespace:
        inbox = f"{identities.inbox_prefix(who)}.{n}"
        return SimpleNamespace(subject=identities.read_subject(who, "queues"), reply=inbox, data=b"{}")

    try:
        await reader._on_question(question("a", 0))  # type: ignore[arg-type]
        await reader._answer_queued()
        await reader._on_question(question("a", 1))  # type: ignore[arg-type]
        await reader._on_question(question("b", 0))  # type: ignore[arg-type]
        await reader._answer_queued()
        told = dict(replies)
        assert "queues" in told[f"{identities.inbox_prefix('a')}.0"]
        busy = told[f"{identities.inbox_prefix('a')}.1"]
        assert busy.get("busy") is True and float(busy["retry_s"]) > 0, busy  # type: ignore[arg-type]
        assert "share" in str(busy["error"])
        assert "queues" in told[f"{identities.inbox_prefix('b')}.0"]
        # what became of a request it sent is still told: refused busy, a stored submit would
        # read as not taken
        verdict = b'{"job": "ja", "verb": "submit"}'
        inbox = f"{identities.inbox_prefix('a')}.2"
        asked = SimpleNamespace(subject=identities.read_subject("a", "verdict"), reply=inbox, data=verdict)
        await reader._on_question(asked)  # type: ignore[arg-type]
        await reader._answer_queued()
        assert "verdict" in dict(replies)[inbox]
    finally:
        reader.close()


async def test_a_question_that_waited_for_the_log_is_told_busy_past_the_share() -> None:
    # A question about a position not yet folded waits for the log to get there; an asker past
    # its share by the time it is answered is told busy, as a queued question is: else 32
    # waiting pages of jobs were answered at every move of the log, whatever the share.
    from types import SimpleNamespace

    from corral.services.runtime.spent import Spent

    reader, replies = _reader()
    reader.spent = Spent(share=1e-9, most_s=0.0, share_all=1e-9, most_all_s=1e9)
    inbox = f"{identities.inbox_prefix('a')}"
    asked = SimpleNamespace(subject=identities.read_subject("a", "queues"), reply=f"{inbox}.0", data=b"{}")
    try:
        await reader._on_question(asked)  # type: ignore[arg-type]
        await reader._answer_queued()  # its first answer is owed at once
        await reader._answer_later(f"{inbox}.1", "a", "queues", Ask(), 0.01)
        told = dict(replies)
        assert "queues" in told[f"{inbox}.0"]
        assert told[f"{inbox}.1"].get("busy") is True, told[f"{inbox}.1"]
    finally:
        reader.close()


async def test_an_answers_encoding_is_charged_to_its_asker() -> None:
    # A page of jobs is up to 512 KiB of JSON: its encoding is work of the answer, charged to
    # the asker's share as the answer's reading of the state is.
    from types import SimpleNamespace

    from corral.services.query import service
    from corral.services.runtime.spent import Spent

    class Publisher:
        max_payload = 1 << 20

        async def publish(self, subject: str, data: bytes) -> None:
            return None

    class NoForecasts:
        async def get(self, tenant: str) -> None:
            return None

    def slow_encode(body: object) -> bytes:  # as a large page's encoding would take
        began = time.thread_time()
        while time.thread_time() - began < 0.05:
            pass
        return b"{}"

    log = SimpleNamespace(nc=Publisher(), stalled=lambda: None)
    reader = service.ReadService(log, forecasts=NoForecasts())  # type: ignore[arg-type]
    reader.spent = Spent(share=1e-9, most_s=0.04, share_all=1e-9, most_all_s=1e9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "_encode", slow_encode)
        try:
            await reader._answer(f"{identities.inbox_prefix('a')}.0", "a", "queues", Ask())
            assert reader.spent.wait_s("a", time.monotonic()) > 0  # past the 0.04 s it may use
        finally:
            reader.close()


async def test_a_question_larger_than_any_question_is_refused_unheld() -> None:
    # A question is a few short fields, but one of a megabyte (as much as NATS carries) was
    # parsed and held, queued or waiting up to a minute: 96 of them per tenant kept 96 MiB of
    # the read service's memory. Past ``MAX_QUESTION_BYTES`` it is refused at once, unread.
    import json
    from types import SimpleNamespace

    from corral.services.query import service

    reader, replies = _reader()
    inbox = f"{identities.inbox_prefix('a')}.0"
    huge = json.dumps({"job": "x" * (1 << 20), "after": 99, "wait": 60}).encode()
    asked = SimpleNamespace(subject=identities.read_subject("a", "explain"), reply=inbox, data=huge)
    try:
        await reader._on_question(asked)  # type: ignore[arg-type]
        assert not reader._waiting and not reader._queued
        told = dict(replies)[inbox]
        assert str(service.MAX_QUESTION_BYTES) in str(told["error"]) and "busy" not in told
    finally:
        reader.close()


async def test_output_questions_past_the_waits_are_taken_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past its waits, each of one tenant's output questions was a task of its own, and 3,000
    # of them held another tenant's `corral logs` for seconds: they wait their turn like any
    # question now, and past its share the asker is told the service is busy.
    import asyncio
    import json
    from types import SimpleNamespace

    from corral.services.query import service

    monkeypatch.setattr(service, "MAX_WAITING_PER_ASKER", 0)  # every wait taken already
    reader, replies = _reader()

    def question(who: str, n: int) -> SimpleNamespace:
        inbox = f"{identities.inbox_prefix(who)}.{n}"
        data = json.dumps({"job": "nosuch", "wait": 30}).encode()
        return SimpleNamespace(subject=identities.read_subject(who, "output"), reply=inbox, data=data)

    try:
        for n in range(service.MAX_QUEUED_PER_ASKER + 1):
            await reader._on_question(question("b", n))  # type: ignore[arg-type]
        await reader._on_question(question("a", 0))  # type: ignore[arg-type]
        assert not reader._waiting  # no task of its own for any of them
        busy = [r for r, body in replies if body.get("busy") is True]
        assert busy == [f"{identities.inbox_prefix('b')}.{service.MAX_QUEUED_PER_ASKER}"]
        await asyncio.wait_for(reader._answer_queued(), 10)
        order = [r.rsplit(".", 2)[-2] for r, body in replies if body.get("busy") is not True]
        assert order[:3] == ["b", "a", "b"] and order.count("b") == service.MAX_QUEUED_PER_ASKER
    finally:
        reader.close()


@pytest.mark.parametrize("stall", [None, Stall(1.0, "no stream leader")])
async def test_a_later_position_is_waited_for_only_while_the_log_is_read(stall: Stall | None) -> None:
    # A question after a position the service has not folded waits for it (a client's own
    # submission); while the log cannot be read it waited the whole 5 s for nothing.
    from types import SimpleNamespace

    reader, replies = _reader(stall)
    inbox = f"{identities.inbox_prefix('a')}.0"
    asked = SimpleNamespace(subject=identities.read_subject("a", "jobs"), reply=inbox, data=b'{"after": 9}')
    try:
        await reader._on_question(asked)  # type: ignore[arg-type]
        assert bool(reader._waiting) is (stall is None)
        assert bool(reader._queued) is (stall is not None)
    finally:
        reader.close()


def test_a_tenants_page_of_jobs_reads_its_own_jobs_only() -> None:
    # Each page of a tenant's jobs walked every tenant's jobs in the state: a tenant with one
    # job in a cluster of 40,000 paid 30 ms a page, charged to its share of the read service.
    # It reads its own, from the fold's index of each tenant's jobs; the admin reads all.
    from corral.services.query import decide

    log = LogBuilder().queues("qa")
    for i in range(500):
        log.submit("b", f"b{i:03d}", job("qa"))
    log.submit("a", "mine", job("qa"))
    log.submit("b", "later", job("qa"))
    state = log.fold()
    looked: list[str] = []
    real = decide.sees_job

    def counted(asker: str, j: Any) -> bool:
        looked.append(j.id)
        return real(asker, j)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decide, "sees_job", counted)
        got = answer(state, {}, "a", "jobs", Ask())
        assert [row["id"] for row in got["jobs"]] == ["mine"] and looked == ["mine"]
        got = answer(state, {}, subjects.ADMIN, "jobs", Ask())
        assert len(got["jobs"]) == 502 and [row["id"] for row in got["jobs"]][-2:] == ["mine", "later"]


@pytest.mark.parametrize("asker", ["b", subjects.ADMIN])
def test_a_later_page_of_jobs_reads_only_the_jobs_after_its_cursor(asker: str) -> None:
    # Each page read and sorted all the asker's jobs to find those after its cursor: the last
    # page of a tenant of 40,000 jobs cost all of them. Both lists are in submission order; a
    # page starts where its cursor falls (a binary search) and reads on from there.
    log = LogBuilder().queues("qa")
    for i in range(500):
        log.submit("b", f"b{i:03d}", job("qa"))
    state = log.fold()
    after = state.jobs["b494"].submitted_seq
    read: list[str] = []

    class Counted(dict[str, Any]):
        def __getitem__(self, job_id: str) -> Any:
            read.append(job_id)
            return super().__getitem__(job_id)

    state.jobs = Counted(state.jobs)
    got = answer(state, {}, asker, "jobs", Ask(page_after=after))
    assert [row["id"] for row in got["jobs"]] == [f"b{i}" for i in range(495, 500)]
    assert len(read) < 40, len(read)  # the five on the page, and the search's few


def test_jobs_come_a_page_at_a_time_that_fits_a_message() -> None:
    # Past some 3,500 jobs the answer was more than NATS carries, and nobody could list jobs.
    import msgspec

    from corral.services.query.decide import JOBS_PAGE_BYTES

    log = LogBuilder().queues("qa")
    submitted = [f"j{i * 7919 % 8000:05d}" for i in range(8000)]  # ids not in the order of submission
    for job_id in submitted:  # some 200 bytes a row
        log.submit("a", job_id, job("qa"))
    state = log.fold()
    seen: list[str] = []
    after = 0
    pages = 0
    while True:
        got = answer(state, {}, "a", "jobs", Ask(page_after=after))
        assert len(msgspec.json.encode(got)) < JOBS_PAGE_BYTES + 4096
        seen += [row["id"] for row in got["jobs"]]
        pages += 1
        if "next" not in got:
            break
        after = got["next"]
    assert pages > 2 and seen == submitted  # as they were submitted, as corral jobs lists them
    assert answer(state, {}, "b", "jobs", Ask())["jobs"] == []  # another's: none, as before


@pytest.mark.parametrize(("page_after", "rows"), [(-5, 3), (0, 3), (2**63 - 1, 0)])
def test_a_page_cursor_from_a_careless_client_reads_as_a_position(page_after: int, rows: int) -> None:
    # A negative cursor reads as "from the start", one past every submission as "nothing more".
    log = LogBuilder().queues("qa")
    for i in range(3):
        log.submit("a", f"j{i}", job("qa"))
    got = answer(log.fold(), {}, "a", "jobs", Ask(page_after=page_after))
    assert len(got["jobs"]) == rows and "next" not in got and "error" not in got


def test_a_page_cursor_that_is_no_integer_is_a_bad_question() -> None:
    for body in (b'{"page_after": "j1"}', b'{"page_after": 1e400}', b'{"page_after": 18446744073709551616}'):
        with pytest.raises(BadAsk):
            parse_ask(body)


@pytest.mark.parametrize("wait", [1e-6, 0.0004, 0.0014, 2.5])
def test_a_busy_answer_never_says_to_ask_again_at_once(wait: float) -> None:
    # The read service answers busy while its asker's wait is above zero, and said that wait to
    # the millisecond: one under half of one was "retry_s": 0.0, which a client asks again at
    # once on (and a tenant's dashboard took for a broken session, and dropped it). The time
    # said is never shorter than the wait, nor zero.
    from corral.services.dashboard import board
    from corral.services.query.decide import refusal

    told = refusal(State(), "busy: your questions used their share", busy=True, retry_s=wait)
    assert told["retry_s"] >= wait and told["retry_s"] > 0
    assert board.unanswered(told).retry_s == told["retry_s"]
