"""Tracing never holds a process up: a CLI command with a collector configured but down ends at
once, its span abandoned, instead of sitting out the exporter's retries."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from corral.events import codec
from corral.events.base import Event
from corral.events.nodes import NodeConditionChanged
from corral.events.queues import DeleteNode
from corral.projections import trace_ids
from corral.projections.fold import apply
from corral.projections.state import State
from corral.services.runtime import tracing
from corral.services.runtime.traces import JobTraces
from tests.builders import Cluster, LogBuilder, job, on, placement, queue_spec, whole, worker


@pytest.fixture
def fresh() -> Iterator[None]:
    tracing.shutdown()  # providers made earlier in this process were made without a collector
    try:
        yield
    finally:
        tracing.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: a connection there is refused, as by a collector that is down


def test_shutdown_with_a_dead_collector_abandons_the_spans_instead_of_retrying(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    # A patient exporter: left to itself it would retry with back-off for half a minute.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    tracing.setup("cli")
    assert tracing.enabled("cli")
    with tracing.span("corral.submit", {"corral.tenant": "team-a"}, service="cli"):
        pass
    result: list[list[str]] = []
    ended = threading.Event()

    def stop() -> None:
        result.append(tracing.shutdown(wait_s=0.2))
        ended.set()

    threading.Thread(target=stop, daemon=True).start()
    # Generous: only a shutdown that waits out the retries (tens of seconds) misses it.
    assert ended.wait(10.0), "shutdown waited on the dead collector"
    assert result == [["cli"]]  # given up, not delivered
    assert not tracing.enabled("cli")


def test_without_a_collector_no_span_is_made_and_nothing_is_waited_on(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing.setup("cli")
    assert not tracing.enabled("cli")
    assert tracing.shutdown() == []


def test_each_process_of_a_role_is_an_instance_of_its_own(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas of one role are told apart in a viewer: the host and pid, as in producer ids,
    unless the operator names the instance (a pod's name, say) in OTEL_RESOURCE_ATTRIBUTES."""
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    got = InMemorySpanExporter()
    tracing.setup("placer", SimpleSpanProcessor(got))
    with tracing.span("corral.cycle", {}, service="placer"):
        pass
    [made] = got.get_finished_spans()
    assert made.resource.attributes["service.name"] == "corral-placer"
    assert made.resource.attributes["service.instance.id"] == f"{socket.gethostname()}:{os.getpid()}"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=placer-7f9c")
    assert tracing._identity("placer")["service.name"] == "corral-placer"
    assert "service.instance.id" not in tracing._identity("placer")  # the operator's name stands


def test_every_reader_derives_the_same_trace_for_a_job() -> None:
    sent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    under = trace_ids.job_trace("j1", 7, sent)
    assert (f"{under.trace_id:032x}", f"{under.submit_span:016x}") == (sent[3:35], sent[36:52])
    derived = trace_ids.job_trace("j1", 7)
    assert derived == trace_ids.job_trace("j1", 7) and derived.submit_span == 0
    assert derived.trace_id != trace_ids.job_trace("j1", 8).trace_id  # the id reused later: a new trace
    # An agent, from the job's span alone, names the same attempt and worker spans.
    seen = trace_ids.from_traceparent("j1", derived.traceparent)
    assert seen is not None
    assert (seen.attempt_span(2), seen.worker_span(2, 1)) == (
        derived.attempt_span(2),
        derived.worker_span(2, 1),
    )
    assert trace_ids.parse("00-nothex-1-01") is None


# -- spans made from the log --------------------------------------------------------------------


class AsWritten(LogBuilder):
    """Records sealed as their writers would: a decision by its role, a node report by the agent."""

    def event(self, subject: str, body: Event) -> LogBuilder:
        if subject.startswith("corral.ev.decision."):
            role = subject.rsplit(".", 1)[1]
        else:
            role = "agent/n" if subject.startswith("corral.ev.node.") else "admission"
        envelope = codec.seal(
            body, event_id=f"ev-{self.last_seq + 1}", time=self.time, producer=f"{role}@t:1"
        )
        return self.raw(subject, codec.encode(envelope))


def spans_of(role: str, log: LogBuilder, snapshot_at: int = 0) -> list[ReadableSpan]:
    """What role ``role`` emits while it folds ``log`` as its writer of record and lease holder;
    from a snapshot of log sequence ``snapshot_at`` if given, taken up as the shell does."""
    got = InMemorySpanExporter()
    tracing.setup(role, processor=SimpleSpanProcessor(got))
    traces = JobTraces(role, f"{role}@t:1")
    traces.live = True
    state = State()
    for r in log.records[:snapshot_at]:
        apply(state, r)
    if snapshot_at:
        state = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)
        traces.seed(state)
    for r in log.records[snapshot_at:]:
        rejected = state.rejected_total
        apply(state, r)
        traces.folded(state, r, rejected)
        traces.emit_pending(after=0)  # as the lease holder, from the start of the log
    assert state.faults == 0
    return list(got.get_finished_spans())


def test_a_voided_placement_is_a_void_span_not_a_placement(fresh: None) -> None:
    log = AsWritten().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1").accept("j1").submit("alice", "j2").accept("j2").admit("j1", "j2")
    log.place(on("node-00", 0, job_id="j1"), on("node-00", 0, job_id="j2"))  # GPU 0 twice: j2's is void
    spans = {s.name: s for s in spans_of("placer", log)}
    assert set(spans) == {"waiting for placement", "placement void"}
    void, placed = spans["placement void"], spans["waiting for placement"]
    assert void.attributes is not None and placed.attributes is not None
    assert (void.attributes["corral.job.id"], void.attributes["corral.void"]) == ("j2", True)
    assert placed.attributes["corral.job.id"] == "j1"
    assert [e.name for e in placed.events] == ["placed"]
    # The placement span lasted from the admission to the placement, in log time (one second).
    assert placed.end_time is not None and placed.start_time is not None
    assert placed.end_time - placed.start_time == 1_000_000_000


def test_a_role_emits_only_the_spans_of_what_it_wrote(fresh: None) -> None:
    log = AsWritten().nodes(Cluster(1)).queues("team-a").submit("alice", "j1").accept("j1").admit("j1")
    log.place(on("node-00", 0, job_id="j1")).started("node-00", "j1")
    placer = [s.name for s in spans_of("placer", log)]
    admission = [s.name for s in spans_of("admission", log)]
    assert placer == ["waiting for placement"]
    # Admission's own (queued), and the agent's report's (starting): no deciding role wrote it.
    assert admission == ["queued", "starting"]


def test_a_shrink_is_a_span_of_the_shrunk_job_linked_from_its_beneficiary(fresh: None) -> None:
    log = AsWritten().nodes(Cluster(1)).queue(queue_spec("team-a", 8))
    log.submit("alice", "e", job("team-a").replicas(4, minimum=2).checkpointable()).accept("e")
    log.admit("e", replicas=4).place(placement("e", *(worker(r, "node-00", whole(r)) for r in range(4))))
    for r in range(4):
        log.started("node-00", "e", rank=r)
    log.submit("bob", "b", job("team-a").replicas(2)).accept("b", priority=10).shrink("e", 2, "b")
    spans = spans_of("preemptor", log)
    [shrunk] = [s for s in spans if s.attributes.get("corral.job.id") == "e"]
    [asked] = [s for s in spans if s.attributes.get("corral.job.id") == "b"]
    assert shrunk.attributes is not None and asked.attributes is not None
    state = State()
    for r in log.records:
        apply(state, r)
    e = trace_ids.job_trace("e", state.jobs["e"].submitted_seq)
    b = trace_ids.job_trace("b", state.jobs["b"].submitted_seq)
    # In the shrunk job's trace, under its attempt: why, for whom, which ranks leave.
    assert shrunk.name == "shrink" and shrunk.context is not None and shrunk.parent is not None
    assert (shrunk.context.trace_id, shrunk.parent.span_id) == (e.trace_id, e.attempt_span(0))
    assert shrunk.attributes["corral.shrunk_for"] == "b" and shrunk.attributes["corral.ranks.leaving"] == (
        2,
        3,
    )
    assert shrunk.attributes["corral.reason"] == "shrunk to 2 ranks for job b"
    assert [(lk.context.trace_id, lk.context.span_id) for lk in shrunk.links] == [(b.trace_id, b.job_span)]
    # The beneficiary's trace links to it, as a preemption links to its victims.
    assert asked.name == "shrink" and asked.context is not None
    assert asked.context.trace_id == b.trace_id
    assert [(lk.context.trace_id, lk.context.span_id) for lk in asked.links] == [
        (shrunk.context.trace_id, shrunk.context.span_id)
    ]


def test_a_node_deleted_from_the_cluster_is_forgotten_by_every_roles_traces() -> None:
    """Nodes come and go (a cloud's, each under a name of its own): each role's traces keep the
    nodes the cluster has, not every name it ever had."""
    inventory = next(Cluster(1).events()).inventory
    log = LogBuilder()
    for i in range(2_000):
        log.node(f"spot-{i}", inventory).admin("delete-node", DeleteNode(node=f"spot-{i}"))
    log.node("stays", inventory)
    traces = JobTraces("health", "health@t:1")
    state = State()
    for r in log.records:
        rejected = state.rejected_total
        apply(state, r)
        traces.folded(state, r, rejected)
    assert set(state.nodes) == {"stays"}
    assert set(traces.nodes) == {"stays"}


class FromHealth(AsWritten):
    """A node's condition as the health monitor writes it."""

    def event(self, subject: str, body: Event) -> LogBuilder:
        if not isinstance(body, NodeConditionChanged):
            return super().event(subject, body)
        envelope = codec.seal(body, event_id=f"ev-{self.last_seq + 1}", time=self.time, producer="health@t:1")
        return self.raw(subject, codec.encode(envelope))


def test_a_node_condition_is_a_span_of_the_time_the_node_was_in_it(fresh: None) -> None:
    log = FromHealth().at(1000.0).nodes(Cluster(1))
    log.at(1100.0).condition("node-00", "suspect").at(1130.0).condition("node-00", "lost")
    log.at(1200.0).node("node-00", Cluster(1).nodes[0][1]).at(1210.0).condition("node-00", "ready")
    spans = [(s.name, s.start_time, s.end_time, s.status.is_ok) for s in spans_of("health", log)]
    seconds = 1_000_000_000
    # Ready for 100 s, suspect for 30, lost for 80 (its agent back at 1200 did not make it
    # ready: the health monitor did, at 1210); never "suspect" for the 100 s it was ready.
    assert spans[1:] == [
        ("node ready", 1000 * seconds, 1100 * seconds, True),
        ("node suspect", 1100 * seconds, 1130 * seconds, False),
        ("node lost", 1130 * seconds, 1210 * seconds, False),
    ]


def interrupted_by(end: Callable[[LogBuilder], LogBuilder]) -> dict[str, ReadableSpan]:
    """The spans of a job's run and attempt that ``end`` interrupted, its workers stopped and
    the job requeued, as the roles that emit them (health: what a node fact ended; admission:
    the attempt its requeue ended) made them."""
    log = FromHealth().nodes(Cluster(1)).queues("team-a").submit("alice", "j1").accept("j1").admit("j1")
    log.place(on("node-00", 0, job_id="j1")).started("node-00", "j1")
    end(log).exited("node-00", "j1", code=143, stopped=True).requeue("j1", 0)
    spans = []
    for role in ("health", "admission"):
        tracing.shutdown()  # each role's spans to its own exporter, whatever ran before
        spans += spans_of(role, log)
    return {s.name: s for s in spans if s.name in ("running", "interrupted", "attempt 0")}


def seen(spans: list[ReadableSpan]) -> list[tuple[object, ...]]:
    """What a reader of the trace sees of each span, ids included, in the order they ended."""
    return [
        (
            s.name,
            s.context and s.context.span_id,
            s.parent and s.parent.span_id,
            s.start_time,
            s.end_time,
            s.status.status_code,
            s.status.description,
            dict(s.attributes or {}),
            [(e.name, dict(e.attributes or {})) for e in s.events],
        )
        for s in spans
    ]


def from_snapshot_and_whole(end: Callable[[LogBuilder], LogBuilder]) -> tuple[list[tuple[object, ...]], ...]:
    """The lease's spans of the records after a snapshot taken while ``end`` had left the job
    interrupted (before its workers' exit and its requeue): as a replica started from that
    snapshot emits them, and as one that folded the whole log did."""
    log = FromHealth().nodes(Cluster(1)).queues("team-a").submit("alice", "j1").accept("j1").admit("j1")
    log.place(on("node-00", 0, job_id="j1")).started("node-00", "j1")
    cut = end(log).last_seq
    log.exited("node-00", "j1", code=143, stopped=True).requeue("j1", 0)
    taken = log.records[cut - 1].time * 1_000_000_000
    tracing.shutdown()
    whole = [s for s in spans_of("admission", log) if (s.end_time or 0) > taken]
    tracing.shutdown()
    return seen(spans_of("admission", log, snapshot_at=cut)), seen(whole)


def test_a_replica_started_from_a_snapshot_emits_the_spans_of_one_that_folded_the_log(fresh: None) -> None:
    """The attempt a snapshot caught under way is timed from when it entered its queue, which
    the fold keeps: a replica taking it up emits the attempt's span, as one that saw it start."""
    snapshot, whole = from_snapshot_and_whole(lambda log: log.condition("node-00", "lost"))
    assert [span[0] for span in whole] == ["interrupted", "attempt 0"]
    assert snapshot == whole


def test_a_job_its_node_s_planned_shutdown_stopped_is_no_error(fresh: None) -> None:
    """An operator stopping a node (its agent's ``NodeShutdown``) stops its jobs as a drain
    does: they resume elsewhere, and nothing failed. A node lost is a failure."""
    planned = interrupted_by(lambda log: log.shutdown("node-00", "maintenance"))
    assert set(planned) == {"running", "interrupted", "attempt 0"}
    errors = {name: s.status.description for name, s in planned.items() if not s.status.is_ok}
    assert not errors, errors
    assert ("interrupted", "node node-00 shut down: maintenance") in [
        (e.name, (e.attributes or {}).get("corral.reason")) for e in planned["running"].events
    ]
    lost = interrupted_by(lambda log: log.condition("node-00", "lost"))
    assert not lost["running"].status.is_ok and not lost["attempt 0"].status.is_ok


def stopped_by(checkpointable: bool, stop: Callable[[LogBuilder], LogBuilder]) -> list[tuple[str, list[str]]]:
    """The spans (name, event names) of a job ``stop`` sent away from its node, from its run to
    its requeue, its workers' exit between, in the order they ended, whichever role emitted them."""
    log = AsWritten().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "j1", job("team-a").checkpointable(checkpointable)).accept("j1").admit("j1")
    log.place(on("node-00", 0, job_id="j1")).started("node-00", "j1")
    stop(log).exited("node-00", "j1", code=143, stopped=True).requeue("j1", 0)
    spans = []
    for role in ("preemptor", "admission"):
        tracing.shutdown()
        spans += [s for s in spans_of(role, log) if (s.attributes or {}).get("corral.job.id") == "j1"]
    spans.sort(key=lambda s: s.end_time or 0)
    out = [(s.name, [e.name for e in s.events]) for s in spans]
    return out[[name for name, _ in out].index("running") :]


def test_a_drain_is_no_preemption_and_a_job_that_cannot_checkpoint_is_asked_to_stop(fresh: None) -> None:
    """The fold sends a drained job through the preemption's phases (checkpointing, preempted),
    for nobody; its trace says what happened: drained, and asked to checkpoint only if it can."""

    def drain(log: LogBuilder) -> LogBuilder:
        return log.cordon("node-00", drain=True)

    assert stopped_by(False, drain) == [
        ("running", ["drained"]),
        ("stopping", ["exited", "stopped"]),
        ("drained", ["requeued"]),
        ("attempt 0", []),
    ]
    assert stopped_by(True, drain)[1:3] == [
        ("checkpointing", ["exited", "stopped"]),
        ("drained", ["requeued"]),
    ]

    # A preemption stays one; a victim that cannot checkpoint is stopped for its beneficiary.
    def preempt(log: LogBuilder) -> LogBuilder:
        return log.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "j1")

    assert stopped_by(False, preempt)[:3] == [
        ("running", ["preempted"]),
        ("stopping", ["exited", "preempted"]),
        ("preempted", ["requeued"]),
    ]


def test_a_replica_started_from_a_snapshot_knows_a_planned_shutdown_from_the_job(fresh: None) -> None:
    """A snapshot taken between a node's planned shutdown and its jobs' requeue holds no record
    of the shutdown, only the jobs it interrupted: what they say is what tells the stop was
    planned, so the attempt it ended is no error there either."""
    snapshot, whole = from_snapshot_and_whole(lambda log: log.shutdown("node-00", "maintenance"))
    assert [(span[0], span[5]) for span in whole] == [
        ("interrupted", StatusCode.UNSET),
        ("attempt 0", StatusCode.UNSET),
    ]
    assert snapshot == whole
    # Said without a reason too (an agent of an older build), and not registering again.
    snapshot, whole = from_snapshot_and_whole(lambda log: log.shutdown("node-00", registers_again=False))
    assert snapshot == whole and all(span[5] == StatusCode.UNSET for span in whole)
