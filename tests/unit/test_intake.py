"""The intake's verdict on one request, by table: appended as the subject's tenant's, refused
with a reason, or dropped when there is nowhere safe to answer."""

from __future__ import annotations

import asyncio
import json

import pytest

from corral.services.intake.decide import MAX_REQUEST, Accept, Refuse, decide

INBOXES = "_INBOX.corral"
SUBMIT = json.dumps({"request_id": "j1", "job": {"queue": "q"}}).encode()
QUEUE = json.dumps({"queue": {"name": "q"}}).encode()


def _decide(subject: str, data: bytes = SUBMIT, reply: str = "_INBOX.corral.a.x1", **headers: str) -> object:
    return decide(subject, reply, headers or None, data, inbox_prefix=INBOXES)


def test_a_request_is_appended_as_its_subjects_tenants() -> None:
    got = _decide("corral.req.a.submit", **{"Nats-Msg-Id": "submit:j1", "traceparent": "00-ab-cd-01"})
    assert got == Accept("corral.in.a.submit", SUBMIT, "a/submit:j1", {"traceparent": "00-ab-cd-01"})


def test_without_a_message_id_nothing_is_deduplicated() -> None:
    assert _decide("corral.req.a.submit") == Accept("corral.in.a.submit", SUBMIT, None, None)


@pytest.mark.parametrize(
    "reply",
    [
        "",  # a publish, not a request: nobody to answer
        "corral.ev.job.j1",  # into the log
        "corral.in.b.submit",  # as another tenant
        "$KV.corral_leases.placer",  # over a leader's lease
        "_INBOX.corral.b.x",  # into another tenant's inbox
        "_INBOX.corral.ab.x",  # a tenant whose name starts with a's
        "_INBOX.corral.a",  # the prefix itself, not an inbox under it
    ],
)
def test_an_answer_goes_only_into_the_tenants_own_inbox(reply: str) -> None:
    assert _decide("corral.req.a.submit", reply=reply) is None


@pytest.mark.parametrize(
    "subject", ["corral.req.a", "corral.req.a.submit.x", "corral.in.a.submit", "other.a.b.c"]
)
def test_only_intake_subjects_are_taken(subject: str) -> None:
    assert _decide(subject) is None


@pytest.mark.parametrize(
    ("subject", "data", "reply", "words"),
    [
        ("corral.req.a.queue", QUEUE, "_INBOX.corral.a.1", "a may not 'queue'"),
        ("corral.req.a.purge", b"{}", "_INBOX.corral.a.1", "may not 'purge'"),
        ("corral.req.a.submit", b"{", "_INBOX.corral.a.1", "not a submit request"),
        ("corral.req.a.submit", b'{"request_id":"j","job":{"replica":2}}', "_INBOX.corral.a.1", "replica"),
        ("corral.req.a.submit", b" " * (MAX_REQUEST + 1), "_INBOX.corral.a.1", "at most"),
        # parsers differ on which of two equal keys counts: refused, at any depth
        (
            "corral.req.a.submit",
            b'{"request_id":"j","request_id":"k","job":{"queue":"q"}}',
            "_INBOX.corral.a.1",
            "'request_id' given twice",
        ),
        (
            "corral.req.a.submit",
            b'{"request_id":"j","job":{"queue":"q","resources":{"gpus":1,"gpus":8}}}',
            "_INBOX.corral.a.1",
            "'gpus' given twice",
        ),
        ("corral.req.a.cancel", b'{"job_id":"j","job_id":"k"}', "_INBOX.corral.a.1", "given twice"),
    ],
)
def test_what_is_not_a_request_of_the_tenant_is_refused(
    subject: str, data: bytes, reply: str, words: str
) -> None:
    got = _decide(subject, data, reply)
    assert isinstance(got, Refuse) and words in got.description
    assert len(got.description) <= 512


# (verb, body, what the refusal names): a name that is no subject token could never name a job,
# queue, cohort, class, tenant or node; appended, it was kept in the log only to be refused.
NOT_NAMES = [
    ("submit", {"request_id": "", "job": {"queue": "q"}}, "job id ''"),
    ("submit", {"request_id": "j.1", "job": {"queue": "q"}}, "job id 'j.1'"),
    ("submit", {"request_id": "j" * 65, "job": {"queue": "q"}}, "job id 'jjjj"),
    ("submit", {"request_id": "j1", "job": {"queue": ""}}, "queue ''"),
    ("submit", {"request_id": "j1", "job": {"queue": "q", "priority_class": "a b"}}, "priority class 'a b'"),
    ("cancel", {"job_id": ""}, "job id ''"),
    ("cancel", {"job_id": "*"}, "job id '*'"),
    ("resize", {"job_id": "", "replicas": 2}, "job id ''"),
    ("queue", {"queue": {"name": ""}}, "queue ''"),
    ("queue", {"queue": {"name": "q", "cohort": ""}}, "cohort ''"),
    ("queue", {"queue": {"name": "q", "tenants": ["a", ""]}}, "tenant ''"),
    ("cohort", {"cohort": {"name": ""}}, "cohort ''"),
    ("cohort", {"cohort": {"name": "c", "parent": "o>"}}, "cohort 'o>'"),
    ("priority-class", {"priority_class": {"name": "", "value": 1}}, "priority class ''"),
    ("delete-queue", {"name": ""}, "queue ''"),
    ("delete-cohort", {"name": ""}, "cohort ''"),
    ("delete-priority-class", {"name": "x\n"}, "priority class 'x\\n'"),
    ("cordon", {"node": ""}, "node ''"),
    ("delete-node", {"node": "n.1"}, "node 'n.1'"),
]


@pytest.mark.parametrize(("verb", "body", "named"), NOT_NAMES, ids=[f"{v} {n}" for v, _, n in NOT_NAMES])
def test_a_name_that_could_never_name_anything_is_refused(verb: str, body: object, named: str) -> None:
    got = _decide(f"corral.req.admin.{verb}", json.dumps(body).encode(), "_INBOX.corral.admin.1")
    assert isinstance(got, Refuse) and got.code == 400, got
    assert got.description.startswith(f"not a {verb} request: {named}"), got.description
    assert "is not a name" in got.description


LONE = "half of a UTF-16 surrogate pair without its other half"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        # msgspec said "Input data was truncated" of these: the sender looked for what cut it
        (b'{"request_id":"j","job":{"queue":"q","command":["\\ud800"]}}', f"\\ud800 at byte 49 is {LONE}"),
        (b'{"request_id":"j","job":{"queue":"q","env":{"A":"\\udbff"}}}', f"\\udbff at byte 49 is {LONE}"),
        (b'{"request_id":"\\ud800","job":{"queue":"q"}}', f"\\ud800 at byte 15 is {LONE}"),
        (b'{"request_id":"\\udc00","job":{"queue":"q"}}', f"\\udc00 at byte 15 is {LONE}"),
        (b'{"request_id":"\\ud800\\u0041","job":{"queue":"q"}}', f"\\ud800 at byte 15 is {LONE}"),
        # a whole pair is a character; an escaped backslash before "ud800" is no escape of one
        (b'{"request_id":"\\ud83d\\ude00","job":{"queue":"q"}}', "job id '\U0001f600' is not a name"),
        (b'{"request_id":"\\\\ud800","job":{"queue":"q"}}', "job id '\\\\ud800' is not a name"),
        (b'{"request_id":"j","job":{"queue":"q"', "Input data was truncated"),  # it was
    ],
    ids=["end", "env", "id", "low", "unpaired", "pair", "backslash", "truncated"],
)
def test_a_lone_surrogate_is_refused_as_what_it_is(data: bytes, says: str) -> None:
    got = _decide("corral.req.a.submit", data)
    assert isinstance(got, Refuse) and got.code == 400, got
    assert says in got.description, got.description


def test_the_admin_may_use_admin_verbs() -> None:
    assert _decide("corral.req.admin.queue", QUEUE, "_INBOX.corral.admin.1") == Accept(
        "corral.in.admin.queue", QUEUE, None, None
    )


def test_headers_only_the_intake_may_set_are_not_passed_on() -> None:
    headers = {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Rollup": "all", "Nats-Batch-Id": "x"}
    got = _decide("corral.req.a.submit", **headers)
    assert got == Accept("corral.in.a.submit", SUBMIT, None, None)


@pytest.mark.parametrize("name", ["Nats-Msg-Id", "nats-msg-id", "NATS-MSG-ID", "nats-Msg-id"])
def test_a_message_id_is_the_senders_whatever_the_case_of_its_header(name: str) -> None:
    # A client in another language that spells the header in lower case asked to be
    # deduplicated as much as one that does not: its id was dropped, and a retry stored twice.
    got = _decide("corral.req.a.submit", **{name: "submit:j1"})
    assert got == Accept("corral.in.a.submit", SUBMIT, "a/submit:j1", None)


def test_two_message_ids_of_a_request_are_refused() -> None:
    got = _decide("corral.req.a.submit", **{"Nats-Msg-Id": "submit:j1", "nats-msg-id": "submit:j2"})
    assert isinstance(got, Refuse) and got.code == 400 and "two message ids" in got.description
    same = _decide("corral.req.a.submit", **{"Nats-Msg-Id": "submit:j1", "nats-msg-id": "submit:j1"})
    assert isinstance(same, Accept) and same.msg_id == "a/submit:j1"


def test_a_message_id_is_bounded() -> None:
    assert isinstance(_decide("corral.req.a.submit", **{"Nats-Msg-Id": "x" * 129}), Refuse)


async def test_a_tenant_sending_without_end_does_not_keep_the_others_out() -> None:
    # Past its share of the requests waiting to be appended, a tenant is answered busy (503)
    # at once; another tenant's request still waits its turn and is appended.
    from types import SimpleNamespace

    from corral.services.intake import service

    answers: list[tuple[str, dict[str, object]]] = []

    async def publish(subject: str, body: bytes) -> None:
        answers.append((subject, json.loads(body)))

    intake = service.Intake(SimpleNamespace(nc=SimpleNamespace(publish=publish)))  # type: ignore[arg-type]

    def request(tenant: str, n: int) -> SimpleNamespace:
        reply = f"{INBOXES}.{tenant}.{n}"
        return SimpleNamespace(subject=f"corral.req.{tenant}.submit", reply=reply, headers=None, data=SUBMIT)

    for n in range(service.MAX_WAITING_PER_TENANT + 2):
        await intake._on_request(request("a", n))  # type: ignore[arg-type]
    await intake._on_request(request("b", 0))  # type: ignore[arg-type]
    busy = [reply for reply, body in answers if body.get("error", {}).get("code") == 503]  # type: ignore[union-attr]
    cap = service.MAX_WAITING_PER_TENANT
    assert busy == [f"{INBOXES}.a.{cap}", f"{INBOXES}.a.{cap + 1}"]
    waiting = [accept.subject for accept, _ in intake._waiting]
    assert waiting.count("corral.in.a.submit") == cap and waiting[-1] == "corral.in.b.submit"


async def test_a_tenant_past_its_rate_is_told_when_to_send_again_and_nothing_of_it_waits() -> None:
    from types import SimpleNamespace

    from corral.services.intake import service
    from corral.services.intake.rate import Rate

    answers: list[tuple[str, dict[str, object]]] = []

    async def publish(subject: str, body: bytes) -> None:
        answers.append((subject, json.loads(body)))

    fake = SimpleNamespace(nc=SimpleNamespace(publish=publish))
    intake = service.Intake(fake, Rate(per_s=0.5, burst=3))  # type: ignore[arg-type]
    for tenant, n in (("a", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 0)):
        reply = f"{INBOXES}.{tenant}.{n}"
        msg = SimpleNamespace(subject=f"corral.req.{tenant}.submit", reply=reply, headers=None, data=SUBMIT)
        await intake._on_request(msg)  # type: ignore[arg-type]
    assert [reply for reply, _ in answers] == [f"{INBOXES}.a.3", f"{INBOXES}.a.4"]
    for _, body in answers:
        error = body["error"]
        assert isinstance(error, dict) and error["code"] == 429
        assert 0 < error["retry_s"] <= 2.0 and "more than 0.5 requests a second" in error["description"]
    waiting = [accept.subject for accept, _ in intake._waiting]
    assert waiting == ["corral.in.a.submit"] * 3 + ["corral.in.b.submit"]
    assert intake.limited == 2


async def test_an_intake_that_cannot_take_a_request_now_is_busy_to_the_client() -> None:
    from corral.client import AsyncClient, Busy, Refused

    async def answering(body: dict[str, object]) -> AsyncClient:
        client = AsyncClient("nats://127.0.0.1:1", tenant="team-a", timeout=0.5)

        async def connected() -> object:
            return object()

        async def request(*_: object, **__: object) -> str:
            return json.dumps(body)

        client._connected = connected  # type: ignore[method-assign,assignment]
        client._request = request  # type: ignore[method-assign,assignment]
        return client

    busy = await answering({"error": {"code": 503, "description": "3 requests of yours wait: retry"}})
    with pytest.raises(Busy, match="requests of yours wait"):
        await busy.cancel("j1")
    # Told to send again later than the client's timeout allows: Busy, with when.
    too_fast = await answering({"error": {"code": 429, "description": "more than 1 request", "retry_s": 60}})
    with pytest.raises(Busy, match="more than 1 request") as told:
        await too_fast.cancel("j1")
    assert told.value.retry_s == 60 and told.value.too_fast
    refused = await answering({"error": {"code": 400, "description": "not a submit"}})
    with pytest.raises(Refused):
        await refused.cancel("j1")


async def test_a_client_the_intake_could_not_take_sends_the_same_request_again_after_a_pause() -> None:
    # 503: nothing appended (the intake busy, or the log behind it electing its stream's leader
    # for a few seconds). The client sends the same message under its id again, after a pause,
    # within its timeout: an operator's submit failed for the election.
    from corral.client import AsyncClient

    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a", timeout=5.0)
    sent: list[tuple[bytes, dict[str, str], float]] = []
    answers = [
        {"error": {"code": 503, "description": "the log did not take it: no stream answered (503)"}},
        {"error": {"code": 503, "description": "the log did not take it: no stream answered (503)"}},
        {"stream": "CORRAL", "seq": 42},
    ]

    async def connected() -> object:
        return object()

    async def request(_session: object, _subject: str, data: bytes, headers: dict[str, str]) -> str:
        sent.append((data, headers, asyncio.get_running_loop().time()))
        return json.dumps(answers.pop(0))

    client._connected = connected  # type: ignore[method-assign,assignment]
    client._request = request  # type: ignore[method-assign,assignment]
    stored = await client.cancel("j1", wait=False)
    assert stored.seq == 42 and len(sent) == 3
    assert len({(data, headers["Nats-Msg-Id"]) for data, headers, _ in sent}) == 1
    pauses = [b[2] - a[2] for a, b in zip(sent, sent[1:], strict=False)]
    assert pauses[0] >= 0.25 and pauses[1] >= 0.5, pauses  # not asked again at once


async def test_a_client_past_its_rate_sends_the_same_request_again_when_told() -> None:
    # The intake answers 429 with when to send again: within its timeout the client waits that
    # long and sends the same message (its id too), then returns where the log stored it.
    from corral.client import AsyncClient

    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a", timeout=5.0)
    sent: list[tuple[bytes, dict[str, str]]] = []
    answers = [
        {"error": {"code": 429, "description": "more than 2 requests a second", "retry_s": 0.05}},
        {"error": {"code": 429, "description": "more than 2 requests a second", "retry_s": 0.05}},
        {"stream": "CORRAL", "seq": 42},
    ]

    async def connected() -> object:
        return object()

    async def request(_session: object, _subject: str, data: bytes, headers: dict[str, str]) -> str:
        sent.append((data, headers))
        return json.dumps(answers.pop(0))

    client._connected = connected  # type: ignore[method-assign,assignment]
    client._request = request  # type: ignore[method-assign,assignment]
    stored = await client.cancel("j1", wait=False)
    assert stored.seq == 42 and len(sent) == 3
    assert len({(data, headers["Nats-Msg-Id"]) for data, headers in sent}) == 1


async def test_a_requests_rate_is_charged_by_its_size_before_its_body_is_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Counted by requests, cancels of 250 KB at a fifth of the rate grew the log by 40 MB a
    # second; and each was decoded before the rate refused it. Now a request costs a token per
    # 4 KiB it starts, charged before its body is read, and the tenant is logged once a minute.
    import logging
    from types import SimpleNamespace

    from corral.services.intake import service
    from corral.services.intake.rate import Rate

    answers: list[dict[str, object]] = []

    async def publish(_: str, body: bytes) -> None:
        answers.append(json.loads(body))

    fake = SimpleNamespace(nc=SimpleNamespace(publish=publish))
    intake = service.Intake(fake, Rate(per_s=1.0, burst=100))  # type: ignore[arg-type]
    big = json.dumps({"job_id": "j1", "reason": "x" * 200_000}).encode()  # 49 tokens
    garbage = b"{" * 200_000  # not a request at all: refused for the rate, not decoded
    with caplog.at_level(logging.WARNING, logger="corral.intake"):
        for n, data in enumerate((big, big, garbage, garbage, SUBMIT)):
            msg = SimpleNamespace(
                subject="corral.req.a.cancel", reply=f"{INBOXES}.a.{n}", headers=None, data=data
            )
            await intake._on_request(msg)  # type: ignore[arg-type]
    codes = [a["error"]["code"] for a in answers]  # type: ignore[index]
    assert codes == [429, 429, 400], (
        answers
    )  # two large ones took 98 of 100; the small one's 400 is its verb's
    assert "this one 49" in str(answers[0]) and len(intake._waiting) == 2
    assert intake.limited == 2 and intake.refused == 1
    assert len([r for r in caplog.records if "past" in r.getMessage()]) == 1


async def test_a_request_the_log_did_not_acknowledge_is_sent_again_under_its_id() -> None:
    # No acknowledgement in time: stored or not, nobody knows. The intake says so (504, not
    # "not taken"), and the client sends the same message under the same id, which the stream
    # stores once: here the first was stored, and the second comes back as its duplicate.
    from types import SimpleNamespace

    from corral.client import AsyncClient
    from corral.events.log import UnacknowledgedError
    from corral.services.intake import service
    from corral.services.intake.decide import Accept

    intake = service.Intake(SimpleNamespace(nc=None), None)  # type: ignore[arg-type]
    told = intake._answer_of(
        Accept("corral.in.a.cancel", b"{}", "a/1", None), UnacknowledgedError("no ack in 5s")
    )
    assert told["error"]["code"] == service.MAYBE_STORED and "same message id" in told["error"]["description"]

    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a", timeout=5.0)
    sent: list[tuple[bytes, str]] = []
    answers = [told, {"stream": "CORRAL", "seq": 42, "duplicate": True}]

    async def connected() -> object:
        return object()

    async def request(_session: object, _subject: str, data: bytes, headers: dict[str, str]) -> str:
        sent.append((data, headers["Nats-Msg-Id"]))
        return json.dumps(answers.pop(0))

    client._connected = connected  # type: ignore[method-assign,assignment]
    client._request = request  # type: ignore[method-assign,assignment]
    stored = await client.cancel("j1", wait=False)
    assert stored.seq == 42 and len(sent) == 2 and len(set(sent)) == 1


def test_a_resend_that_finds_its_first_copy_being_stored_is_maybe_stored_too() -> None:
    # A clustered stream answers the same message id sent again while its first copy is still
    # proposed, not applied, with 409/10158 "duplicate message id is in process": exactly what
    # the client's resend after a 504 meets when the log is slow. Read as any error, it was
    # answered 503 "the log did not take it", and the client gave up on a request that may be
    # stored. A server's error is told from our own timeout by its error code.
    from types import SimpleNamespace

    from corral.events.jetstream import JetStreamLog, _ApiError, _PubAck
    from corral.events.log import Append, UnacknowledgedError
    from corral.services.client.aio import _intake_answer
    from corral.services.client.results import Busy
    from corral.services.intake import service
    from corral.services.intake.decide import Accept

    item = Append("corral.in.a.cancel", b"{}", msg_id="a/1")
    in_process = _ApiError(409, 10158, "duplicate message id is in process")
    result = JetStreamLog._result(item, _PubAck(error=in_process))
    assert isinstance(result, UnacknowledgedError), result
    intake = service.Intake(SimpleNamespace(nc=None), None)  # type: ignore[arg-type]
    told = intake._answer_of(Accept(item.subject, item.data, item.msg_id, None), result)
    assert told["error"]["code"] == service.MAYBE_STORED
    ack = _intake_answer("cancel", json.dumps(told).encode())
    assert isinstance(ack, Busy) and ack.maybe_stored and ack.resend
    ours = JetStreamLog._result(item, _PubAck(error=_ApiError(408, 0, "no acknowledgement within 5s")))
    assert isinstance(ours, UnacknowledgedError) and "refused" not in str(ours)
    theirs = JetStreamLog._result(item, _PubAck(error=_ApiError(408, 10999, "a server's own 408")))
    assert not isinstance(theirs, UnacknowledgedError)


async def test_a_requests_headers_are_charged_with_its_body_and_a_504_without_an_id_says_so() -> None:
    from types import SimpleNamespace

    from corral.events.log import UnacknowledgedError
    from corral.services.intake import service
    from corral.services.intake.decide import Accept
    from corral.services.intake.rate import Rate

    answers: list[dict[str, object]] = []

    async def publish(_: str, body: bytes) -> None:
        answers.append(json.loads(body))

    fake = SimpleNamespace(nc=SimpleNamespace(publish=publish))
    intake = service.Intake(fake, Rate(per_s=0.001, burst=4))  # type: ignore[arg-type]
    heavy = {"traceparent": "x" * 9_000}  # 3 tokens with the body
    for n in range(2):
        msg = SimpleNamespace(
            subject="corral.req.a.submit", reply=f"{INBOXES}.a.{n}", headers=heavy, data=SUBMIT
        )
        await intake._on_request(msg)  # type: ignore[arg-type]
    assert len(intake._waiting) == 1 and intake.limited == 1  # 3 of 4 taken, then 3 more owed
    told = intake._answer_of(Accept("corral.in.a.cancel", b"{}", None, None), UnacknowledgedError("late"))
    assert "no message id" in told["error"]["description"]


async def test_what_the_log_did_not_store_of_a_batch_is_said_once_not_once_a_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A tenant's flood slowed the log: each of thousands of requests not acknowledged was a line
    # of the intake's log of its own, the operator's log buried under one tenant's requests.
    # Each is still answered as what became of it; the log says a batch's count and its first.
    import logging
    from types import SimpleNamespace

    from corral.events.log import LogError, UnacknowledgedError
    from corral.services.intake import service

    answers: list[dict[str, object]] = []

    async def publish(_: str, body: bytes) -> None:
        answers.append(json.loads(body))

    async def append_many(items: list[object]) -> list[object]:
        late = [UnacknowledgedError(f"no acknowledgement {n}") for n in range(len(items) - 2)]
        return [*late, LogError("the stream has no leader"), LogError("the stream has no leader")]

    fake = SimpleNamespace(nc=SimpleNamespace(publish=publish), append_many=append_many)
    intake = service.Intake(fake, None)  # type: ignore[arg-type]
    for n in range(300):
        msg = SimpleNamespace(
            subject="corral.req.a.cancel", reply=f"{INBOXES}.a.{n}", headers=None, data=b'{"job_id": "j"}'
        )
        await intake._on_request(msg)  # type: ignore[arg-type]
    stop = asyncio.Event()
    stop.set()
    with caplog.at_level(logging.WARNING, logger="corral.intake"):
        await intake._appending(stop)
    codes = [body["error"]["code"] for body in answers]  # type: ignore[index]
    assert codes == [service.MAYBE_STORED] * 298 + [503, 503]
    said = [r.getMessage() for r in caplog.records if r.name == "corral.intake"]
    assert len(said) == 2, said
    assert said[0].startswith(
        "298 of 300 requests appended at once not acknowledged, the first on corral.in.a.cancel"
    )
    assert said[1].startswith("2 of 300 requests appended at once not stored") and "no leader" in said[1]
