"""Each queue's order the fold keeps (``State.queued_by_queue``) is, after every record, exactly a
full sort of its queued jobs by priority, submission and id; and the workers per ask it keeps
are exactly a recount of the unfinished jobs. Whatever the records: accepted at any priority,
priorities changed while waiting or not, admitted, withdrawn, cancelled, resized, placed, run
and requeued, in any order (the fold refuses what is illegal, and keeps its indexes either way)."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.jobs import CancelJob, JobPriorityChanged, ResizeJob
from corral.projections import indexes
from corral.projections.fold import apply
from corral.projections.lifecycle import FINAL
from corral.projections.state import State
from tests.builders import Cluster, LogBuilder, job, on

JOBS = [f"j{i}" for i in range(8)]
QUEUES = ("team-a", "team-b")
NODE = "node-00"

ids = st.sampled_from(JOBS)
priorities = st.integers(-3, 3)
steps = st.one_of(
    st.tuples(st.just("submit"), ids, st.sampled_from(QUEUES), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("accept"), ids, priorities),
    st.tuples(st.just("priority"), ids, priorities),
    st.tuples(st.just("admit"), ids),
    st.tuples(st.just("withdraw"), ids),
    st.tuples(st.just("cancel"), ids),
    st.tuples(st.just("resize"), ids, st.integers(1, 4)),
    st.tuples(st.just("run"), ids),
    st.tuples(st.just("lose"), ids),
)


def _log(drawn: list[tuple[object, ...]]) -> LogBuilder:
    log = LogBuilder().nodes(Cluster(1)).queues(*QUEUES)
    for step in drawn:
        kind, job_id = step[0], str(step[1])
        if kind == "submit":
            _, _, queue, gpus, elastic = step
            spec = job(str(queue)).gpus(int(str(gpus)))
            log.submit("alice", job_id, spec.replicas(2, minimum=1) if elastic else spec)
        elif kind == "accept":
            log.accept(job_id, priority=int(str(step[2])))
        elif kind == "priority":
            body = JobPriorityChanged(job_id=job_id, priority=int(str(step[2])), reason=Reason("t", "t"))
            log.event(subj.job(job_id), body)
        elif kind == "admit":
            log.admit(job_id)
        elif kind == "withdraw":
            log.withdraw(job_id)
        elif kind == "cancel":
            log.request("alice", "cancel", CancelJob(job_id=job_id))
        elif kind == "resize":
            log.request("alice", "resize", ResizeJob(job_id=job_id, replicas=int(str(step[2]))))
        elif kind == "run":
            log.place(on(NODE, JOBS.index(job_id), job_id=job_id)).started(NODE, job_id)
        elif kind == "lose":  # its worker fails; it goes back to its queue for another attempt
            log.exited(NODE, job_id, code=1).requeue(job_id, 0)
    return log


def _full_sort(state: State, queue: str) -> list[str]:
    queued = [j for j in state.jobs.values() if j.phase == "queued" and j.spec.queue == queue]
    queued.sort(key=lambda j: (-j.priority, j.submitted_seq, j.id))
    return [j.id for j in queued]


def _recount(state: State) -> dict[str, int]:
    asks: dict[str, int] = {}
    for j in state.jobs.values():
        if j.phase not in FINAL:
            key = indexes.ask_key(j.spec.resources)
            asks[key] = asks.get(key, 0) + max(1, j.spec.replicas)
    return asks


@settings(max_examples=150, deadline=None)
@given(st.lists(steps, min_size=1, max_size=40))
def test_each_queue_is_in_full_sort_order_after_every_record(drawn: list[tuple[object, ...]]) -> None:
    state = State()
    for i, rec in enumerate(_log(drawn).records):
        apply(state, msgspec.structs.replace(rec, seq=i + 1))
        assert state.faults == 0
        for queue in QUEUES:
            assert [j.id for j in indexes.queued_in(state, queue)] == _full_sort(state, queue)
        assert state.workers_by_ask == _recount(state)
        assert all(state.queued_by_queue.values())  # no queue kept empty
    # A snapshot keeps the order, as tuples a reader compares with its own.
    restored = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)
    assert restored == state
    indexes.check(restored)


def test_a_priority_change_moves_a_waiting_job_to_its_new_place() -> None:
    log = LogBuilder().nodes(Cluster(1)).queues(*QUEUES)
    for j in ("a", "b", "c"):
        log.submit("alice", j).accept(j)
    state = log.fold()
    assert [j.id for j in indexes.queued_in(state, "team-a")] == ["a", "b", "c"]
    up = JobPriorityChanged(job_id="c", priority=5, reason=Reason("t", "waited long"))
    down = JobPriorityChanged(job_id="a", priority=-1, reason=Reason("t", "ran long"))
    state = log.event(subj.job("c"), up).event(subj.job("a"), down).fold(state)
    assert [j.id for j in indexes.queued_in(state, "team-a")] == ["c", "b", "a"]
