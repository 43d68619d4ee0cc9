"""The intake's verdict on a node agent's report, by table (appended on the subject's node's
subject, refused with a reason, or dropped when there is nowhere safe to answer); the node's
rate charged before the report is read; and the agent's side: what each answer becomes, and
reports held in order until the intake said to send again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from corral.events import codec
from corral.events.base import Event
from corral.events.jobs import CancelJob
from corral.events.log import Ack, Append, LogError, RetryLater, UnacknowledgedError, UnstorableError
from corral.events.nodes import (
    REPORT_IDS,
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeRegistered,
    NodeShutdown,
    WorkerExited,
    WorkerStarted,
)
from corral.services.agent.intake import _ack
from corral.services.agent.inventory import h100_8x_nvswitch
from corral.services.agent.service import msg_id
from corral.services.intake import service
from corral.services.intake.decide import MAX_REQUEST, Accept, Refuse, Reporter, Sender, addressed, judge
from corral.services.intake.rate import Rate
from tests.integration import polling

INBOXES, NODE_INBOXES = "_INBOX.corral", "_INBOX.agent"
N1 = "n1"


def _report(body: Event, **envelope: Any) -> bytes:
    """``body`` sealed as node n1's agent seals it (``envelope``: fields given otherwise)."""
    sealed = {
        "event_id": msg_id(body) if type(body) in REPORT_IDS else "x",
        "time": 1.0,
        "producer": f"agent/{getattr(body, 'node', N1)}@host-1:4242",
        **envelope,
    }
    return codec.encode(codec.seal(body, **sealed))


START = _report(WorkerStarted(node=N1, job_id="j", attempt=0, rank=0, pid=7))
STARTED_J = WorkerStarted(node=N1, job_id="j", attempt=0, rank=0)


def _decide(
    data: bytes = START, subject: str = "corral.nreq.n1", reply: str = "_INBOX.agent.n1.abc.1", **headers: str
) -> Accept | Refuse | None:
    sender = addressed(subject, reply, len(data), inbox_prefix=INBOXES, node_inboxes=NODE_INBOXES)
    if not isinstance(sender, Sender | Reporter):
        return sender
    return judge(sender, headers or None, data)


@pytest.mark.parametrize(
    "body",
    [
        NodeRegistered(node=N1, inventory=h100_8x_nvswitch(N1)),
        WorkerStarted(node=N1, job_id="j", attempt=0, rank=0, pid=7),
        WorkerExited(node=N1, job_id="j", attempt=0, rank=0, code=0),
        CheckpointCompleted(node=N1, job_id="j", attempt=0, step=10, location="/ckpt/j/10"),
        NodeShutdown(node=N1, at=5.0),
    ],
    ids=["registered", "started", "exited", "checkpoint", "shutdown"],
)
def test_a_report_is_appended_on_its_subjects_node_under_the_agents_id(body: Event) -> None:
    data = _report(body)
    got = _decide(data, **{"Nats-Msg-Id": "started:j:0:0:7", "traceparent": "00-ab-cd-01"})
    trace = {"traceparent": "00-ab-cd-01"}
    assert got == Accept("corral.ev.node.n1", data, "agent-n1/started:j:0:0:7", trace)


@pytest.mark.parametrize(
    "reply",
    [
        "",  # a publish: nobody to answer
        "corral.ev.node.n1",  # into the log
        "_INBOX.agent.n2.x",  # another node's agent's inbox
        "_INBOX.agent.n10.x",  # a node whose name starts with n1's
        "_INBOX.corral.n1.x",  # a tenant's inbox of the node's name
        "_INBOX.agent.n1",  # the prefix itself
    ],
)
def test_an_answer_goes_only_into_the_nodes_agents_inbox(reply: str) -> None:
    assert _decide(reply=reply) is None


@pytest.mark.parametrize("subject", ["corral.nreq", "corral.nreq.n1.x", "corral.nreq.*", "corral.ev.node.n1"])
def test_only_a_node_intake_subject_naming_one_node_is_taken(subject: str) -> None:
    assert _decide(subject=subject) is None


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        # the node comes from the subject: a report about another node is not n1's to make
        (_report(WorkerStarted(node="n2", job_id="j", attempt=0, rank=0)), 403, "n1 only, not for 'n2'"),
        (_report(NodeShutdown(node="n2", at=1.0)), 403, "n1 only"),
        # the health monitor's word on the node, and a tenant's request, are not an agent's
        (_report(NodeConditionChanged(node=N1, condition="lost")), 403, "not write NodeConditionChanged"),
        (_report(GpuHealthChanged(node=N1, gpu=0, healthy=False)), 403, "does not write GpuHealthChanged"),
        (_report(CancelJob(job_id="j")), 403, "does not write CancelJob"),
        (b'{"job_id":"j"}', 400, "not a node report"),
        (b"{", 400, "not a node report"),
        (b" " * (MAX_REQUEST + 1), 400, "at most"),
        (START.replace(b'"job_id":"j"', b'"job_id":"j","job_id":"k"'), 400, "'job_id' given twice"),
        # the envelope speaks for the node's agent only: traces and ``corral verify`` take the
        # writer from the producer and a decision's cycle from the id
        (_report(STARTED_J, producer="placer@h:1"), 403, "producer"),
        (_report(STARTED_J, producer="agent/n10@h:1"), 403, "producer"),
        (_report(NodeShutdown(node=N1, at=1.0), producer="agent/n1@" + "h" * 300), 403, "at most 256"),
        (_report(STARTED_J, event_id="placer:5:0"), 403, "'started:'"),
        (_report(STARTED_J, event_id="exited:j:0:0"), 403, "begins"),
        (_report(NodeShutdown(node=N1, at=1.0), event_id="shutdown:" + "9" * 300), 403, "at most 256"),
        (_report(NodeShutdown(node=N1, at=1.0), causation="admission:4:0"), 403, "no causation"),
        (_report(NodeShutdown(node=N1, at=1.0), correlation="j"), 403, "no causation"),
        # a reader in another language routes by the envelope's type, not its body's
        (
            START.replace(b'"type":"WorkerStarted","time"', b'"type":"JobsPlaced","time"'),
            403,
            "not 'JobsPlaced'",
        ),
        # a job id no job could have is kept out of the log, as a tenant's is
        (_report(WorkerExited(node=N1, job_id="a.b", attempt=0, rank=0, code=1)), 403, "'a.b' is not"),
        (
            _report(CheckpointCompleted(node=N1, job_id="", attempt=0, step=1, location="/c")),
            403,
            "not a name",
        ),
    ],
    ids=[
        "other-node",
        "other-shutdown",
        "condition",
        "gpu-health",
        "request",
        "bare-body",
        "not-json",
        "too-large",
        "given-twice",
        "producer-of-a-role",
        "producer-of-another-node",
        "producer-too-long",
        "id-of-a-decision",
        "id-of-another-kind",
        "id-too-long",
        "causation",
        "correlation",
        "typed-as-another-kind",
        "job-id-no-token",
        "job-id-empty",
    ],
)
def test_what_is_not_a_report_of_the_node_is_refused(data: bytes, code: int, words: str) -> None:
    got = _decide(data)
    assert isinstance(got, Refuse) and (got.code, words in got.description) == (code, True), got
    assert len(got.description) <= 512


def test_only_the_trace_context_of_a_reports_headers_travels() -> None:
    headers = {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Rollup": "all", "tracestate": "a=b"}
    assert _decide(**headers) == Accept("corral.ev.node.n1", START, None, {"tracestate": "a=b"})
    assert isinstance(_decide(**{"Nats-Msg-Id": "x" * 257}), Refuse)


def _fake_intake(rate: Rate | None, node_rate: Rate | None) -> tuple[service.Intake, list[dict[str, Any]]]:
    answers: list[dict[str, Any]] = []

    async def publish(_: str, body: bytes) -> None:
        answers.append(json.loads(body))

    fake = SimpleNamespace(nc=SimpleNamespace(publish=publish))
    return service.Intake(fake, rate, node_rate), answers  # type: ignore[arg-type]


def _msg(data: bytes, node: str = N1, n: int = 1) -> Any:
    reply = f"_INBOX.agent.{node}.x.{n}"
    return SimpleNamespace(subject=f"corral.nreq.{node}", reply=reply, headers=None, data=data)


async def test_a_node_past_its_rate_is_told_when_to_send_again_before_its_report_is_read() -> None:
    intake, answers = _fake_intake(None, Rate(per_s=1.0, burst=3))
    garbage = b"x" * 5000  # two tokens, and not a report: refused once read
    await intake._on_request(_msg(garbage))
    assert answers[-1]["error"]["code"] == 400  # within its rate: read, and refused
    await intake._on_request(_msg(garbage))  # the burst is spent: not read at all
    told = answers[-1]["error"]
    assert told["code"] == 429 and told["retry_s"] > 0 and "reports a second" in told["description"]
    assert (intake.limited, intake.refused, len(intake._waiting)) == (1, 1, 0)
    # Another node, and a tenant of the same name, have rates of their own.
    await intake._on_request(_msg(_report(WorkerStarted(node="n2", job_id="j", attempt=0, rank=0)), "n2"))
    assert len(intake._waiting) == 1 and intake._waiting_of == {"agent-n2": 1}


def test_what_the_intakes_answers_become_for_the_agent() -> None:
    assert _ack(b'{"stream":"CORRAL","seq":7}') == Ack(7)
    assert _ack(b'{"stream":"CORRAL","seq":7,"duplicate":true}') == Ack(7, duplicate=True)
    for answer, error in [
        ({"code": 429, "description": "slow down", "retry_s": 2.5}, RetryLater),
        ({"code": 504, "description": "maybe"}, UnacknowledgedError),
        ({"code": 403, "description": "not yours"}, UnstorableError),
        ({"code": 400, "description": "not a report"}, UnstorableError),
        ({"code": 503, "description": "busy"}, LogError),
    ]:
        with pytest.raises(error) as caught:
            _ack(json.dumps({"error": answer}).encode())
        assert type(caught.value) is error
    with pytest.raises(RetryLater) as told:
        _ack(b'{"error":{"code":429,"retry_s":2.5}}')
    assert told.value.retry_s == 2.5
    for odd in (b"[]", b'{"seq":true}', b"nonsense"):
        with pytest.raises(LogError):
            _ack(odd)


class _Slowed:
    """A log that tells the agent, once, to send again in ``retry_s``, then stores."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self.told = False
        self.stored: list[Append] = []
        self.asked = 0

    async def append(self, item: Append) -> Ack:
        self.asked += 1
        if not self.told:
            self.told = True
            raise RetryLater("past the node's rate", self.retry_s)
        self.stored.append(item)
        return Ack(len(self.stored))


async def test_an_agent_told_to_wait_holds_every_report_in_order_until_then(tmp_path: Path) -> None:
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    log = _Slowed(retry_s=3600.0)
    agent = NodeAgent(N1, log, MemoryViews(), work_dir=tmp_path)
    reports = [WorkerStarted(node=N1, job_id="j", attempt=0, rank=0, pid=1)]
    reports += [WorkerExited(node=N1, job_id="j", attempt=0, rank=0, code=0, pid=1)]
    agent._unsent = list(reports)
    assert await agent.flush() == 0 and agent._unsent == reports
    asked = log.asked
    assert await agent.flush() == 0 and log.asked == asked  # held: not even asked
    agent._held_until = 0.0  # the time it was told has come
    assert await agent.flush() == 2 and agent._unsent == []
    assert [json.loads(a.data)["body"]["type"] for a in log.stored] == ["WorkerStarted", "WorkerExited"]


async def test_an_agent_stopping_waits_for_the_time_it_was_told_and_then_stores_all(tmp_path: Path) -> None:
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    log = _Slowed(retry_s=0.01)
    agent = NodeAgent(N1, log, MemoryViews(), work_dir=tmp_path)
    exited = WorkerExited(node=N1, job_id="j", attempt=0, rank=0, code=143)
    agent._unsent = [NodeShutdown(node=N1, at=1.0), exited]
    assert await agent.flush(patient=True) == 2
    assert [json.loads(a.data)["body"]["type"] for a in log.stored] == ["NodeShutdown", "WorkerExited"]


async def test_a_registration_not_taken_yet_is_sent_again_until_stored(tmp_path: Path) -> None:
    # While a corral starts no intake may answer, or the node may be past its rate: the agent
    # sends the same registration again when told, and registers once it is stored.
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    log = _Slowed(retry_s=0.01)
    agent = NodeAgent(N1, log, MemoryViews(), work_dir=tmp_path)
    await agent.register()
    assert agent.registered.is_set() and log.asked == 2
    assert [json.loads(a.data)["body"]["type"] for a in log.stored] == ["NodeRegistered"]


class _Away:
    """A log nobody answers for, or one that refuses what it is sent."""

    def __init__(self, error: LogError) -> None:
        self.error = error

    async def append(self, item: Append) -> Ack:
        raise self.error


async def test_a_registration_ends_with_the_agent_or_is_raised_when_refused(tmp_path: Path) -> None:
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    agent = NodeAgent(N1, _Away(LogError("no intake answers")), MemoryViews(), work_dir=tmp_path)
    agent._halt.set()  # told to end while it waits to send again
    await agent.register()
    assert not agent.registered.is_set()
    refused = NodeAgent(N1, _Away(UnstorableError("too large")), MemoryViews(), work_dir=tmp_path)
    with pytest.raises(UnstorableError):
        await refused.register()


async def test_an_agent_back_from_a_shutdown_registers_its_node_again_once_per_shutdown(
    tmp_path: Path,
) -> None:
    # The log holds the node as it is, but out of service since an earlier agent shut it down:
    # this agent's registration puts it back, and is not taken for a duplicate of an earlier
    # registration of the same hardware (named by the view it answers).
    from corral.projections.assignments import NodeView
    from corral.services.agent.discovery import simulated
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    found = simulated(N1, "h100-8x")
    inventory = found.inventory
    log = _Slowed(retry_s=0.01)
    agent = NodeAgent(N1, log, MemoryViews(), work_dir=tmp_path, found=found)
    agent._saw(NodeView(node=N1, seq=12, inventory=inventory))
    await agent.register()
    assert log.stored == []  # in service as it is: nothing to say
    ids = []
    for shutdown in (40, 90):
        agent._saw(NodeView(node=N1, seq=shutdown + 3, inventory=inventory, shut_down=shutdown))
        await agent.register()
        ids.append(log.stored[-1].msg_id)
    # The hardware changed meanwhile, and changed back: registered again, under another id.
    other = msgspec.structs.replace(inventory, memory_mib=inventory.memory_mib // 2)
    agent._saw(NodeView(node=N1, seq=120, inventory=other))
    await agent.register()
    ids.append(log.stored[-1].msg_id)
    assert len(log.stored) == 3 and len(set(ids)) == 3
    assert msg_id(NodeRegistered(node=N1, inventory=inventory)) not in ids


async def test_an_agent_whose_view_says_later_that_its_node_was_shut_down_registers_it_again(
    tmp_path: Path,
) -> None:
    # Its first view was written before the earlier agent's shutdown was folded: the view that
    # says so comes while it runs, and the node must not stay out of service for it.
    from corral.projections.assignments import NodeView, encode
    from corral.services.agent.discovery import simulated
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    found = simulated(N1, "h100-8x")
    views = MemoryViews()
    await views.put(N1, encode(NodeView(node=N1, seq=5, inventory=found.inventory)))
    log = _Slowed(retry_s=0.01)
    agent = NodeAgent(N1, log, views, work_dir=tmp_path, found=found, tick=0.01)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.registered.wait(), 10)
        assert log.stored == []
        await views.put(N1, encode(NodeView(node=N1, seq=8, inventory=found.inventory, shut_down=7)))
        await polling.until(lambda: len(log.stored) == 1, 10)
        assert json.loads(log.stored[0].data)["body"]["type"] == "NodeRegistered"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


class _NoRegistrations:
    """An intake that stores every report but no registration (one it cannot take yet)."""

    def __init__(self) -> None:
        self.registrations = 0
        self.stored: list[Append] = []

    async def append(self, item: Append) -> Ack:
        if (item.msg_id or "").startswith(REPORT_IDS[NodeRegistered]):
            self.registrations += 1
            raise LogError("no intake answers")
        self.stored.append(item)
        return Ack(len(self.stored))


async def test_an_agent_registering_its_node_again_goes_on_and_stops_when_told(tmp_path: Path) -> None:
    # The registration after another agent's shutdown is sent again until stored: meanwhile
    # the agent's cycles go on, and it stops when told, not once the registration is stored.
    from corral.projections.assignments import NodeView, encode
    from corral.services.agent.discovery import simulated
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.views import MemoryViews

    found = simulated(N1, "h100-8x")
    views = MemoryViews()
    await views.put(N1, encode(NodeView(node=N1, seq=5, inventory=found.inventory)))
    log = _NoRegistrations()
    agent = NodeAgent(N1, log, views, work_dir=tmp_path, found=found, tick=0.01, stop_grace=0.1)
    stop = asyncio.Event()
    cycles = 0
    cycle = agent.cycle

    async def counted() -> int:
        nonlocal cycles
        cycles += 1
        return await cycle()

    agent.cycle = counted  # type: ignore[method-assign]
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.registered.wait(), 10)
        await views.put(N1, encode(NodeView(node=N1, seq=8, inventory=found.inventory, shut_down=7)))
        await polling.until(lambda: log.registrations >= 1, 10)
        then = cycles
        await polling.until(lambda: cycles > then + 3, 10)
        stop.set()
        await asyncio.wait_for(asyncio.shield(task), 10)
    finally:
        agent._halt.set()
        await asyncio.wait_for(task, 30)
    assert [json.loads(a.data)["body"]["type"] for a in log.stored] == ["NodeShutdown"]
