"""A node's view of the log (``projections.assignments.node_view``) and how the assignments
service keeps every node's view up to date (``services.assignments.decide``).

Each test folds a small log with ``LogBuilder`` and reads the view of one node: placements,
stops, checkpoint requests and jobs leaving the node. The last tests fold logs record by record
as the service does and check that the views it recomputes for the nodes it marks dirty are the
views a full recomputation gives, for every node, after every record.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from corral.events import codec
from corral.events import subjects as subj
from corral.events.jobs import CancelJob, JobSpec
from corral.events.log import InMemoryLog
from corral.events.nodes import NodeConditionChanged
from corral.projections.assignments import body, decode, encode, node_view
from corral.projections.fold import apply
from corral.projections.state import State
from corral.services.assignments import service as assignments_service
from corral.services.assignments.decide import Index, touched, touches_no_view, views
from corral.services.runtime.views import MemoryViews
from tests.builders import Cluster, LogBuilder, job, on, placement, running, whole, worker
from tests.unit.test_retention import ROUND_S, churn

N0, N1, N2 = "node-00", "node-01", "node-02"


def base() -> LogBuilder:
    return LogBuilder().nodes(Cluster(3)).queues("team-a", "team-b")


def spec(gpus: int = 1, **changes: object) -> JobSpec:
    return msgspec.structs.replace(job().gpus(gpus).build(), **changes)


def gang(log: LogBuilder) -> LogBuilder:
    """Job g: ranks 0, 1 on node-00, rank 2 on node-01."""
    slots = (worker(0, N0, whole(0)), worker(1, N0, whole(1)), worker(2, N1, whole(0)))
    return (
        log.submit("alice", "g", job().replicas(3))
        .accept("g")
        .admit("g", replicas=3)
        .place(placement("g", *slots))
    )


# -- placements --------------------------------------------------------------------------------


def test_a_placement_is_in_the_view_of_its_node_only_with_what_its_worker_needs() -> None:
    s = spec(2, command=("python", "train.py"), env={"LR": "0.1"}, grace_seconds=12.0, checkpointable=True)
    state = base().submit("alice", "j1", s).accept("j1").admit("j1").place(on(N0, 2, 3, job_id="j1")).fold()
    [a] = node_view(state, N0).jobs
    assert (a.job_id, a.attempt, a.phase) == ("j1", 0, "placed")
    assert (a.command, a.env, a.grace_seconds, a.checkpointable) == (
        ("python", "train.py"),
        {"LR": "0.1"},
        12.0,
        True,
    )
    [r] = a.ranks
    assert [(g.index, g.uuid) for g in r.gpus] == [(2, f"GPU-{N0}-02"), (3, f"GPU-{N0}-03")]
    assert r.rendezvous["WORLD_SIZE"] == "1" and r.rendezvous["MASTER_ADDR"] == "127.0.0.1"
    assert (a.started, a.live, a.held_attempt) == ((), (), 0)
    assert node_view(state, N1).jobs == ()
    assert node_view(state, N0).used_milli[2:4] == (1000, 1000)


def test_a_gang_across_nodes_shows_each_node_its_own_ranks_and_the_whole_rendezvous() -> None:
    state = gang(base()).started(N0, "g", rank=0).fold()
    [here] = node_view(state, N0).jobs
    [there] = node_view(state, N1).jobs
    assert [r.rank for r in here.ranks] == [0, 1] and [r.rank for r in there.ranks] == [2]
    assert here.started == (0,) and there.started == ()  # only this node's ranks
    assert here.live == (0,) and there.live == ()
    assert there.ranks[0].rendezvous["GROUP_RANK"] == "1"
    assert there.ranks[0].rendezvous["WORLD_SIZE"] == "3"


def test_an_unregistered_node_has_an_empty_view_without_inventory() -> None:
    view = node_view(base().fold(), "node-99")
    assert (view.inventory, view.jobs) == (None, ())
    assert node_view(base().fold(), N0).inventory is not None


# -- stops and checkpoint requests -------------------------------------------------------------


def test_a_cancelled_job_stays_in_the_view_while_its_worker_is_live_then_leaves() -> None:
    log = running("j1", log=base()).request("alice", "cancel", CancelJob(job_id="j1"))
    [a] = node_view(log.fold(), N0).jobs
    assert (a.phase, a.live) == ("cancelled", (0,))
    assert node_view(log.exited(N0, "j1", code=143, stopped=True).fold(), N0).jobs == ()


def test_a_preempted_job_shows_its_checkpoint_deadline() -> None:
    log = running("v", spec(checkpointable=True, grace_seconds=30.0), log=base())
    state = log.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "v").fold()
    [a] = node_view(state, N0).jobs
    v = state.jobs["v"]
    assert (a.phase, a.checkpointable) == ("checkpointing", True)
    assert a.deadline == (v.preempt_deadline or v.phase_since + 30.0)


def test_a_checkpoint_is_where_the_next_attempt_resumes_from() -> None:
    log = running("j1", log=base()).checkpoint(N0, "j1", step=7)
    [a] = node_view(log.fold(), N0).jobs
    assert a.resume_from != "" and a.resume_from == log.fold().jobs["j1"].checkpoint.location  # type: ignore[union-attr]


# -- jobs leaving the node ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "log",
    [
        pytest.param(running("j1", log=base()).exited(N0, "j1", code=0), id="succeeded"),
        pytest.param(running("j1", job().restarts(0), log=base()).exited(N0, "j1", code=9), id="failed"),
    ],
)
def test_a_finished_job_with_nothing_live_here_leaves_the_view(log: LogBuilder) -> None:
    assert node_view(log.fold(), N0).jobs == ()


def test_a_lost_node_keeps_nothing_of_the_jobs_it_ran() -> None:
    log = running("j1", log=base()).event(
        "corral.ev.node." + N0, NodeConditionChanged(node=N0, condition="lost")
    )
    state = log.fold()
    assert state.jobs["j1"].phase == "interrupted"
    assert [a.live for a in node_view(state, N0).jobs] in ([], [()])


# -- the view on the wire -----------------------------------------------------------------------


def test_a_view_round_trips_and_its_body_ignores_the_log_position() -> None:
    state = gang(base()).fold()
    view = node_view(state, N0)
    assert decode(encode(view)) == view
    later = msgspec.structs.replace(view, seq=view.seq + 100)
    assert body(later) == body(view) and encode(later) != encode(view)


# -- the service's incremental views equal a full recomputation ---------------------------------


def _logs() -> list[LogBuilder]:
    preempted = running("v", spec(checkpointable=True), log=base())
    preempted.submit("bob", "b", job("team-a")).accept("b", priority=10).preempt("b", "v")
    preempted.checkpoint(N0, "v", step=3).exited(N0, "v", code=0, stopped=True)
    restarted = gang(base()).started(N0, "g", 0).started(N0, "g", 1).started(N1, "g", 2)
    restarted.exited(N1, "g", rank=2, code=1)
    restarted.request("alice", "cancel", CancelJob(job_id="g"))
    lost = running("j1", log=base()).event(
        "corral.ev.node." + N0, NodeConditionChanged(node=N0, condition="lost")
    )
    return [preempted, restarted, lost]


@pytest.mark.parametrize("log", _logs(), ids=["preempted", "gang-restarted-cancelled", "node-lost"])
def test_views_kept_record_by_record_equal_views_computed_from_scratch(log: LogBuilder) -> None:
    state, index = State(), Index()
    written: dict[str, bytes] = {}
    nodes = {N0, N1, N2}
    for record in log.records:
        apply(state, record)
        dirty: set[str] = set()
        if not touches_no_view(record.subject):  # as the service passes them by
            body_, _, _ = codec.decode_record(record.subject, record.data, record.headers)
            jobs, node = touched(body_)
            index.mark(state, jobs, node, dirty)
        for view in views(state, index, dirty):
            written[view.node] = body(view)
        for n in nodes:
            assert written.get(n, body(node_view(state, n))) == body(node_view(state, n)), (record.seq, n)


def test_the_index_keeps_only_the_jobs_on_some_node() -> None:
    """Jobs queued and cancelled, rejected, or named again after they left every view leave no
    entry behind: over rounds of churn the index holds what the nodes' views hold (nothing,
    once every round's jobs ended), not an entry per job ever named."""
    log = LogBuilder(step=0.01).nodes(Cluster(3)).queue("team-a").retention(3 * ROUND_S)
    for i in range(60):
        churn(log, i)
    state, index = State(), Index()
    for record in log.records:
        apply(state, record)
        dirty: set[str] = set()
        body_, _, _ = codec.decode_record(record.subject, record.data, record.headers)
        jobs, node = touched(body_)
        index.mark(state, jobs, node, dirty)
        views(state, index, dirty)
    assert state.let_go > 300 and index.nodes_by_job == {}
    assert all(not on_node for on_node in index.jobs_on.values())


async def test_a_failing_view_is_counted_backed_off_and_written_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A view that cannot be computed (a bug meeting an input nobody foresaw) is supervised as
    # every service's cycle is: counted, backed off, and the node stays due until a cycle writes it.
    clock = [1_000.0]
    svc = assignments_service.service(InMemoryLog(), MemoryViews(), clock=lambda: clock[0])
    await svc.restore()
    svc.fold(LogBuilder().nodes(Cluster(1)).records)
    real = assignments_service.views
    broken = [True]

    def poisoned(*args: Any, **kw: Any) -> Any:
        if broken[0]:
            raise RuntimeError("poisoned")
        return real(*args, **kw)

    monkeypatch.setattr(assignments_service, "views", poisoned)
    assert await svc.cycle() == 0
    assert svc.supervision.failures == 1 and svc.dirty
    broken[0] = False
    assert await svc.cycle() == 0  # still backing off
    clock[0] += 5.0
    assert await svc.cycle() == 1
    assert svc.supervision.in_a_row == 0 and not svc.dirty


def test_a_submission_touches_no_view_and_every_other_record_is_looked_at() -> None:
    records = base().submit("alice", "j1", job()).accept("j1").admit("j1").place(on(N0, 0, job_id="j1"))
    passed = [r.subject for r in records.records if touches_no_view(r.subject)]
    assert passed == [subj.request("alice", "submit")]
    assert not touches_no_view(subj.request("alice", "cancel"))
    assert not touches_no_view(subj.node("submit"))  # a node may be named so


class _Turn:
    """A lease this replica holds when the test says."""

    def __init__(self) -> None:
        self.held = False

    async def hold(self) -> bool:
        return self.held

    async def release(self) -> None:
        self.held = False


async def test_a_standby_keeps_no_index_and_writes_every_view_once_it_leads() -> None:
    # A standby replica folds every record but writes nothing: an index kept meanwhile grew with
    # every job ever placed, each record costing more. It keeps none; taking the lease, it writes
    # every node's view from the state, the views a full recomputation gives.
    log = LogBuilder(step=0.01).nodes(Cluster(3)).queue("team-a").retention(3 * ROUND_S)
    for i in range(30):
        churn(log, i)
    gang(log.queue("team-b"))
    lease, store = _Turn(), MemoryViews()
    svc = assignments_service.service(InMemoryLog(), store, lease=lease, clock=lambda: 1_000.0)
    await svc.restore()
    svc.fold(log.records)
    assert await svc.cycle() == 0
    assert svc.index.nodes_by_job == {} and svc.index.jobs_on == {} and not svc.dirty
    lease.held = True
    assert await svc.cycle() > 0
    for n in (N0, N1, N2):
        assert store.values[n] == encode(node_view(svc.state, n)), n
    lease.held = False  # another replica leads: what this one knew is let go
    await svc.cycle()
    assert svc.index.nodes_by_job == {} and not svc.dirty


async def test_a_deleted_nodes_key_is_purged_and_the_node_forgotten() -> None:
    # Every node ever deleted kept its key (a view of no node and no jobs) in the bucket, and
    # stayed in the service's memory (the view last written, its index entry): a cluster whose
    # nodes are replaced under new names grew both without end.
    from corral.events.queues import DeleteNode

    store = MemoryViews()
    svc = assignments_service.service(InMemoryLog(), store, clock=lambda: 1_000.0)
    await svc.restore()
    log = base()
    running("j1", job(), node=N1, log=log)
    svc.fold(log.records)
    await svc.cycle()
    assert set(svc.written) == {N0, N1, N2} and svc.index.jobs_on[N1] == {"j1"}
    seen = len(log.records)
    log.exited(N1, "j1")
    log.admin("delete-node", DeleteNode(node=N1))
    svc.fold(log.records[seen:])
    assert svc.state.rejected_total == 0 and N1 not in svc.state.nodes, svc.state.rejections
    assert await svc.cycle() == 1
    assert set(store.values) == {N0, N2} and svc.purges == 1
    assert set(svc.written) == {N0, N2} and N1 not in svc.index.jobs_on and N1 not in svc.stored


async def test_records_naming_a_deleted_node_do_not_write_its_key_again() -> None:
    # Once forgotten, every record naming the node (a refused report of its agent's) wrote its
    # view of nothing again, and its agent's watch heard it each time.
    from corral.events.nodes import NodeConditionChanged
    from corral.events.queues import DeleteNode

    store = MemoryViews()
    svc = assignments_service.service(InMemoryLog(), store, clock=lambda: 1_000.0)
    await svc.restore()
    log = base()
    svc.fold(log.records)
    await svc.cycle()
    seen = len(log.records)
    log.admin("delete-node", DeleteNode(node=N1))
    svc.fold(log.records[seen:])
    assert await svc.cycle() == 1 and N1 not in svc.written and N1 not in store.values
    puts = store.puts
    for _ in range(5):
        seen = len(log.records)
        log.event("corral.ev.node." + N1, NodeConditionChanged(node=N1, condition="lost"))
        svc.fold(log.records[seen:])
        assert await svc.cycle() == 0
    assert store.puts == puts and svc.purges == 1 and N1 not in store.values
    seen = len(log.records)
    log.nodes(Cluster(2))  # it comes back: its view is written again
    svc.fold(log.records[seen:])
    await svc.cycle()
    back = store.get(N1)
    assert back is not None and back.inventory is not None and N1 in svc.stored


async def test_a_writer_that_takes_over_purges_the_keys_of_nodes_its_state_no_longer_has() -> None:
    # Keys of nodes deleted while no replica wrote, or before keys were purged, stayed for good:
    # the replica taking the lease reconciles the bucket's keys with its state.
    lease, store = _Turn(), MemoryViews()
    for stale in ("node-09", "node-10"):
        await store.put(stale, encode(node_view(State(), stale)))
    svc = assignments_service.service(InMemoryLog(), store, lease=lease, clock=lambda: 1_000.0)
    await svc.restore()
    svc.fold(base().records)
    assert await svc.cycle() == 0 and set(store.values) == {"node-09", "node-10"}  # a standby
    lease.held = True
    assert await svc.cycle() == 5
    assert set(store.values) == {N0, N1, N2} and svc.purges == 2
    for n in (N0, N1, N2):
        assert store.values[n] == encode(node_view(svc.state, n)), n


async def test_a_writer_behind_the_log_purges_no_key_of_a_node_registered_since() -> None:
    # A replica taking the lease behind the log (its reader slowed by the NATS failover that
    # cost the last writer the lease) lacks the nodes registered lately. Purged, such a node's
    # key read to its agent as its node gone from the cluster, and its workers stopped.
    class Log(InMemoryLog):
        head = 0

        async def last_seq(self) -> int:
            return self.head

    log = base()
    seen = len(log.records)
    log.nodes(Cluster(4))  # node-03 registers
    log_ = Log()
    log_.head = log.records[-1].seq
    lease, store = _Turn(), MemoryViews()
    late = "node-03"
    await store.put(late, encode(node_view(log.fold(), late)))  # as the last writer wrote it
    await store.put("node-09", encode(node_view(State(), "node-09")))  # a node deleted long ago
    svc = assignments_service.service(log_, store, lease=lease, clock=lambda: 1_000.0)
    await svc.restore()
    svc.fold(log.records[:seen])
    lease.held = True
    assert await svc.cycle() == 3  # the nodes it has
    assert late in store.values and "node-09" in store.values and svc.purges == 0
    svc.fold(log.records[seen:])
    await svc.cycle()  # folded as far as the log went: node-03 written, node-09 purged
    assert set(store.values) == {N0, N1, N2, late} and svc.purges == 1
    assert store.values[late] == encode(node_view(svc.state, late)) and store.get("node-09") is not None


async def test_a_deleted_nodes_key_whose_note_cannot_be_read_is_purged_later_not_without_its_parts() -> None:
    # The note's read failing (a server not answering) read as a view of no parts: the note was
    # purged, and the parts it named stayed in the bucket for good, a piece of up to 512 KiB each.
    from nats import errors as nats_errors

    from corral.services.runtime.views import KvViewStore

    class Bucket:
        def __init__(self) -> None:
            self.purged: list[str] = []

        async def get(self, key: str) -> Any:
            raise nats_errors.TimeoutError

        async def purge(self, key: str) -> None:
            self.purged.append(key)

    kv = Bucket()
    with pytest.raises(nats_errors.TimeoutError):
        await KvViewStore(kv).remove(N1)
    assert kv.purged == []  # the service tries again (``AssignmentService.cycle``)


async def test_a_writer_that_cannot_list_the_buckets_keys_writes_every_view_all_the_same() -> None:
    # The keys are listed only to purge those of nodes gone: a listing that failed (a server not
    # answering) held up every view, and agents start workers from nothing else.
    class Unlisted(MemoryViews):
        fails = True

        async def nodes(self) -> set[str]:
            if self.fails:
                raise TimeoutError
            return await super().nodes()

    lease, store = _Turn(), Unlisted()
    await store.put("node-09", encode(node_view(State(), "node-09")))
    t = [1_000_000.0]  # past the log's time: the service's clock is never behind it
    svc = assignments_service.service(InMemoryLog(), store, lease=lease, clock=lambda: t[0])
    await svc.restore()
    svc.fold(base().records)
    lease.held = True
    assert await svc.cycle() == 3 and set(store.values) == {N0, N1, N2, "node-09"}
    store.fails = False
    assert await svc.cycle() == 0  # not tried again at once
    t[0] += assignments_service.LIST_AGAIN_S
    assert await svc.cycle() == 1 and set(store.values) == {N0, N1, N2} and svc.purges == 1
