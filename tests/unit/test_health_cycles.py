"""When the health monitor evaluates: once a tick, and at once after a node fact is folded; a
busy log of job records brings no evaluation of its own, and a quiet log still gets one a tick
(silences are measured on the clock, not the log)."""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client

from corral.events import codec, subjects
from corral.events.heartbeats import GpuHealthSample, Heartbeat, XidReport
from corral.events.jobs import SubmitJob
from corral.events.log import Append, InMemoryLog
from corral.events.nodes import (
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    WorkerExited,
)
from corral.events.queues import CordonNode
from corral.services.cli.display import node_table
from corral.services.health.decide import HeartbeatTracker
from corral.services.health.service import HealthMonitor
from corral.services.query import present
from tests.builders import Cluster, LogBuilder, job, on, spec_of

T0 = 1_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


async def _append(log: InMemoryLog, lb: LogBuilder, monitor: HealthMonitor) -> None:
    for r in lb.records[len(log.records) :]:
        await log.append(Append(r.subject, r.data, headers=r.headers))
    monitor.fold([r for r in log.records if r.seq > monitor.state.seq])


async def _monitor() -> tuple[InMemoryLog, LogBuilder, HealthMonitor, Clock]:
    log, clock = InMemoryLog(), Clock()
    lb = LogBuilder().nodes(Cluster(2)).queue("q")
    tracker = HeartbeatTracker(interval=5.0, suspect_after=3, lost_after=60.0)
    monitor = HealthMonitor(log, Client(), tracker=tracker, clock=clock, tick=1.0)
    await _append(log, lb, monitor)
    await monitor.restore()
    return log, lb, monitor, clock


async def test_job_records_bring_no_evaluation_within_a_tick_and_node_facts_do() -> None:
    log, lb, monitor, clock = await _monitor()
    await monitor.cycle()
    assert monitor.skipped == 0  # the first cycle evaluates
    lb.request("alice", "submit", SubmitJob(request_id="j1", job=spec_of(job("q"))))
    await _append(log, lb, monitor)
    await monitor.cycle()
    assert monitor.skipped == 1  # a job record changes nothing the tracker reads
    lb.request("admin", "cordon", CordonNode(node="node-00", cordoned=True))
    await _append(log, lb, monitor)
    await monitor.cycle()
    assert monitor.skipped == 1  # a node fact folded: evaluated at once, in the same tick
    clock.t += 1.0
    await monitor.cycle()
    assert monitor.skipped == 1  # a tick on: evaluated though nothing was folded


async def test_a_quiet_log_is_evaluated_every_tick_and_silences_are_told() -> None:
    log, lb, monitor, clock = await _monitor()
    for node in ("node-00", "node-01"):
        monitor.tracker.record(node, T0, Heartbeat(node=node, seq=1))
    await monitor.cycle()
    before = len(log.records)
    for _ in range(16):  # sixteen ticks of a log nothing is written to
        clock.t += 1.0
        await monitor.cycle()
    told = [codec.decode_body(r.subject, r.data, r.headers).body for r in log.records[before:]]
    assert monitor.skipped == 0
    # Both nodes suspect once more than 15 s of silence passed, each said once.
    assert [(e.node, e.condition) for e in told if isinstance(e, NodeConditionChanged)] == [
        ("node-00", "suspect"),
        ("node-01", "suspect"),
    ]


async def _stepped(step: float) -> tuple[InMemoryLog, HealthMonitor, Clock, Clock]:
    """A monitor whose wall clock is stepped by ``step`` seconds after heartbeats from both
    nodes, its receive clock (monotonic) going on as time does."""
    log, wall, steady = InMemoryLog(), Clock(), Clock()
    lb = LogBuilder().nodes(Cluster(2)).queue("q")
    tracker = HeartbeatTracker(interval=5.0, suspect_after=3, lost_after=60.0)
    monitor = HealthMonitor(log, Client(), tracker=tracker, clock=wall, receive_clock=steady, tick=1.0)
    await _append(log, lb, monitor)
    await monitor.restore()
    for node in ("node-00", "node-01"):
        monitor._on_heartbeat(f"corral.hb.{node}", codec.encode(Heartbeat(node=node, seq=1)))
    await monitor.cycle()
    wall.t += step
    return log, monitor, wall, steady


def _conditions(log: InMemoryLog, since: int) -> list[tuple[str, str]]:
    told = [codec.decode_body(r.subject, r.data, r.headers).body for r in log.records[since:]]
    return [(e.node, e.condition) for e in told if isinstance(e, NodeConditionChanged)]


async def test_a_step_of_the_wall_clock_marks_no_node_lost() -> None:
    # An NTP or admin step of a few minutes forward made every healthy node lost at once, and
    # every running job was interrupted.
    log, monitor, wall, steady = await _stepped(+300.0)
    before = len(log.records)
    for seq in range(2, 5):
        steady.t += 1.0
        wall.t += 1.0
        for node in ("node-00", "node-01"):
            monitor._on_heartbeat(f"corral.hb.{node}", codec.encode(Heartbeat(node=node, seq=seq)))
        await monitor.cycle()
    assert _conditions(log, before) == []


async def test_a_step_back_of_the_wall_clock_hides_no_silence() -> None:
    # A step back of two minutes hid a node gone silent: its silence read as negative.
    log, monitor, wall, steady = await _stepped(-120.0)
    before = len(log.records)
    for _ in range(20):
        steady.t += 1.0
        wall.t += 1.0
        monitor._on_heartbeat("corral.hb.node-00", codec.encode(Heartbeat(node="node-00", seq=2 + _)))
        await monitor.cycle()
    assert _conditions(log, before) == [("node-01", "suspect")]


async def test_a_verdict_the_fold_voids_after_a_renumbering_registration_is_stated_again() -> None:
    # The monitor judged GPU 2 of the layout it had folded; the node registered again without
    # its GPU 0 before the verdict was appended, so the fold voided it (index 2 is another GPU
    # now). The monitor took it as said, and the bad GPU stayed placeable for good.
    log, lb, monitor, clock = await _monitor()
    bad = monitor.state.nodes["node-00"].inventory.gpus[2].uuid
    monitor.tracker.record(
        "node-00", T0, Heartbeat(node="node-00", seq=1, xids=(XidReport(gpu=2, xid=48, uuid=bad),))
    )
    (judged,) = [e for e in monitor.tracker.evaluate(T0) if isinstance(e, GpuHealthChanged)]
    inv = monitor.state.nodes["node-00"].inventory
    left = [msgspec.structs.replace(g, index=i) for i, g in enumerate(inv.gpus[1:])]
    lb.event(
        subjects.node("node-00"),
        NodeRegistered(node="node-00", inventory=msgspec.structs.replace(inv, gpus=left)),
    )
    lb.event(subjects.node("node-00"), judged)
    await _append(log, lb, monitor)
    assert monitor.state.rejections[-1].code == "void"
    await monitor.cycle()
    await _append(log, lb, monitor)
    failed = [g.info.uuid for g in monitor.state.nodes["node-00"].gpus if not g.healthy]
    assert failed == [bad]


async def test_a_gpu_a_worker_died_of_stays_failed_when_a_counter_signal_comes_and_goes() -> None:
    # The fold failed GPU 2 from the worker's exit (its agent named XID 48 there); the monitor,
    # which had not seen the XID, took a passing ECC count for the GPU's only fault, and said
    # it well once the count cleared: the XID's verdict undone without a repair.
    log, lb, monitor, clock = await _monitor()
    lb.submit("alice", "j", job("q").gpus(1)).accept("j").admit("j").place(on("node-00", 2, job_id="j"))
    lb.started("node-00", "j")
    bad = monitor.state.nodes["node-00"].inventory.gpus[2].uuid
    died = WorkerExited(
        node="node-00", job_id="j", attempt=0, rank=0, code=1, xids=(XidReport(2, 48, uuid=bad),)
    )
    lb.event(subjects.node("node-00"), died)
    await _append(log, lb, monitor)
    assert not monitor.state.nodes["node-00"].gpus[2].healthy
    inv = monitor.state.nodes["node-00"].inventory
    for seq, ecc in ((1, 1), (2, 0)):
        samples = tuple(
            GpuHealthSample(
                index=g.index, uuid=g.uuid, nvlinks_active=g.nvlinks, ecc_uncorrected=ecc * (g.index == 2)
            )
            for g in inv.gpus
        )
        monitor.tracker.record("node-00", clock.t, Heartbeat(node="node-00", seq=seq, gpus=samples))
        await monitor.cycle()
        await _append(log, lb, monitor)
        clock.t += 1.0
    assert not monitor.state.nodes["node-00"].gpus[2].healthy


async def test_a_node_that_fails_starts_in_a_row_for_its_own_fault_is_cordoned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A node whose disk is full fails every start at once and, free again, takes the next job:
    # every job placed there failed in turn. From the third in a row it is cordoned (not
    # drained), said once; jobs elsewhere, and a worker that ran in between, reset the count.
    log, lb, monitor, clock = await _monitor()

    def start_fault(jid: str, node: str = "node-00") -> None:
        lb.submit("alice", jid, job("q").gpus(1)).accept(jid).admit(jid).place(on(node, 0, job_id=jid))
        lb.started(node, jid)
        why = "cannot prepare directories: [Errno 28] No space left on device"
        lb.event(
            subjects.node(node),
            WorkerExited(node=node, job_id=jid, attempt=0, rank=0, code=127, node_fault=why),
        )

    async def cycle() -> None:
        await monitor.cycle()
        for r in log.records[len(lb.records) :]:  # what the monitor appended, in the builder too
            lb.raw(r.subject, r.data, r.headers)
        await _append(log, lb, monitor)

    def cordons() -> list[NodeCordoned]:
        return [
            body
            for r in log.records
            if isinstance(body := codec.decode_body(r.subject, r.data, r.headers).body, NodeCordoned)
        ]

    start_fault("a")
    start_fault("b")
    lb.submit("alice", "ok", job("q").gpus(1)).accept("ok").admit("ok").place(on("node-00", 1, job_id="ok"))
    lb.started("node-00", "ok").exited("node-00", "ok", code=1)  # it ran: the run of faults is over
    start_fault("c")
    start_fault("d")
    start_fault("e", "node-01")
    await _append(log, lb, monitor)
    await cycle()
    assert cordons() == [] and monitor.state.nodes["node-00"].start_faults == ("c", "d")
    start_fault("f")
    await _append(log, lb, monitor)
    await cycle()
    [cordon] = cordons()
    assert (cordon.node, cordon.cordoned, cordon.drain) == ("node-00", True, False)
    assert cordon.reason.startswith(
        "quarantined: the starts of 3 jobs in a row failed for the node's own fault; the last: "
    )
    assert monitor.state.nodes["node-00"].cordoned and not monitor.state.nodes["node-00"].draining
    # ``corral nodes`` says why, where it showed "cordoned" alone and the reason was the log's.
    row = present.node_row(monitor.state.nodes["node-00"])
    assert row["condition"] == "cordoned" and row["why"] == cordon.reason
    assert "quarantined: the starts of 3 jobs" in node_table([row])
    assert [monitor.state.jobs[j].phase for j in "cdf"] == ["interrupted"] * 3  # none charged
    # The operator is told in the monitor's log too: the reason is nowhere else but the log.
    [said] = [
        r.getMessage() for r in caplog.records if r.name == "corral.health" and "cordoned" in r.getMessage()
    ]
    assert (
        said.startswith("node node-00 cordoned: quarantined: the starts of 3 jobs in a row")
        and "uncordon node-00" in said
    )
    clock.t += 1.0
    await cycle()
    assert len(cordons()) == 1  # said once
    # A person looks, frees the disk and lifts the cordon: the count starts again from nothing.
    lb.admin("cordon", CordonNode(node="node-00", cordoned=False))
    await _append(log, lb, monitor)
    assert monitor.state.nodes["node-00"].start_faults == ()
    assert not monitor.state.nodes["node-00"].cordoned
    assert present.node_row(monitor.state.nodes["node-00"])["why"] == ""
    await cycle()
    assert len(cordons()) == 1


class _RenewedAcrossAPause:
    """A lease held, whose renewal's answer comes only after this process was stopped for
    ``pause`` seconds (SIGSTOP, a VM paused) while it waited for it: the heartbeats sent
    meanwhile wait in the connection, unread, when the cycle goes on."""

    def __init__(self, clock: Clock, pause: float) -> None:
        self.clock, self.pause, self.held = clock, pause, True

    async def hold(self) -> bool:
        self.clock.t += self.pause
        self.pause = 0.0
        return True

    async def release(self) -> None:
        self.held = False


async def test_a_monitor_stopped_past_the_lost_node_timeout_marks_no_node_lost_for_its_own_pause() -> None:
    # Stopped while it waited for its lease's renewal, the monitor went on, once resumed, to
    # evaluate before it read the heartbeats waiting in its connection: every node had been
    # silent for the pause on its clock, and every one was stated lost (its jobs interrupted
    # everywhere); on the decision subject nobody writes, no fence refused it.
    log, clock = InMemoryLog(), Clock()
    lb = LogBuilder().nodes(Cluster(2)).queue("q")
    tracker = HeartbeatTracker(interval=5.0, suspect_after=3, lost_after=60.0)
    lease = _RenewedAcrossAPause(clock, 0.0)
    monitor = HealthMonitor(log, Client(), tracker=tracker, clock=clock, tick=1.0, lease=lease)
    await _append(log, lb, monitor)
    await monitor.restore()
    for node in ("node-00", "node-01"):
        monitor._on_heartbeat(f"corral.hb.{node}", codec.encode(Heartbeat(node=node, seq=1)))
    await monitor.cycle()
    before = len(log.records)
    lease.pause = 90.0
    await monitor.cycle()  # resumed: what it has heard is from before the pause
    for seq in range(2, 5):  # it reads the heartbeats that waited, and hears them on
        for node in ("node-00", "node-01"):
            monitor._on_heartbeat(f"corral.hb.{node}", codec.encode(Heartbeat(node=node, seq=seq)))
        clock.t += 1.0
        await monitor.cycle()
    assert _conditions(log, before) == []
