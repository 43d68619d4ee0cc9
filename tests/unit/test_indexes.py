"""The indexes the fold keeps of the jobs (``projections/indexes.py``): every change of phase,
queue and held GPUs the log can make keeps them equal to what ``State.jobs`` says, in the order
jobs entered; nothing that decides walks every job."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from corral.events import subjects as subj
from corral.events.base import Reason
from corral.events.jobs import (
    CancelJob,
    JobPriorityChanged,
    JobRejected,
    JobSpec,
    ResizeJob,
    Resources,
    Topology,
)
from corral.events.nodes import NodeInventory
from corral.events.queues import ApplyQueue, ApplyRetention, DeleteQueue, QueueSpec, Quota, RetentionSpec
from corral.projections import indexes
from corral.projections.holds import QuotaHolders
from corral.projections.state import State
from corral.services.admission.decide import decide as admission_decide
from corral.services.placer.decide import decide as placer_decide
from corral.services.preemptor.decide import decide as preemptor_decide
from corral.services.sim.driver import SimConfig, SimJob, Simulation
from tests.builders import Cluster, LogBuilder, job, on, placement, whole, worker

N0, N1 = "node-00", "node-01"


def view(state: State) -> dict[str, dict[str, list[str]]]:
    """The indexes with their order, and checked against the jobs."""
    indexes.check(state)
    return {
        "phase": {p: list(ids) for p, ids in state.jobs_by_phase.items()},
        "queued": {q: [i for _, _, i in places] for q, places in state.queued_by_queue.items()},
        "holding": {n: list(ids) for n, ids in state.holding_by_node.items()},
    }


def base(nodes: int = 2) -> LogBuilder:
    return LogBuilder().nodes(Cluster(nodes)).queue("team-a").queue("team-b")


def test_a_job_is_indexed_from_submit_to_success() -> None:
    log = base().submit("alice", "j", job().gpus(8))
    state = log.fold()
    assert view(state) == {"phase": {"submitted": ["j"]}, "queued": {}, "holding": {}}
    state = log.accept("j").fold(state)
    assert view(state) == {"phase": {"queued": ["j"]}, "queued": {"team-a": ["j"]}, "holding": {}}
    state = log.admit("j").fold(state)
    assert view(state) == {"phase": {"admitted": ["j"]}, "queued": {}, "holding": {}}
    state = log.place(on(N0, *range(8), job_id="j")).fold(state)
    assert view(state) == {"phase": {"placed": ["j"]}, "queued": {}, "holding": {N0: ["j"]}}
    state = log.started(N0, "j").fold(state)  # start, then run: one move to running
    assert view(state) == {"phase": {"running": ["j"]}, "queued": {}, "holding": {N0: ["j"]}}
    state = log.exited(N0, "j").fold(state)
    assert view(state) == {"phase": {"succeeded": ["j"]}, "queued": {}, "holding": {}}


def test_a_queues_holders_of_quota_are_indexed_from_admission_to_release() -> None:
    log = base().submit("alice", "a", job().gpus(8)).submit("bob", "b", job(queue="team-b").gpus(1))
    state = log.accept("a").accept("b").fold()
    assert state.holding_quota_by_queue == {}
    state = log.admit("a").admit("b").fold(state)
    assert state.holding_quota_by_queue == {"team-a": {"a": None}, "team-b": {"b": None}}
    state = log.place(on(N0, *range(8), job_id="a")).started(N0, "a").fold(state)
    assert [j.id for j in indexes.holding_quota(state, "team-a")] == ["a"]
    state = log.exited(N0, "a").fold(state)
    assert state.holding_quota_by_queue == {"team-b": {"b": None}}
    indexes.check(state)


def test_quota_holders_are_read_for_the_queues_asked_about() -> None:
    """A cycle reads the holders of the queues it asks about, from the fold's index, and the
    ends it adds itself on top."""
    log = (
        base()
        .submit("alice", "a", job().gpus(8).estimate(600))
        .submit("bob", "b", job(queue="team-b").gpus(1))
    )
    state = log.accept("a").accept("b").admit("a").admit("b").fold()
    state = log.place(on(N0, *range(8), job_id="a")).started(N0, "a").fold(state)
    now = state.time + 60
    holders = QuotaHolders(state, now, lambda q: q in state.queues)
    holders.end("team-b", "*", now + 5, 1000)
    assert holders.jobs("team-a", "*") == [(0, 8000, True)]
    assert holders.ends("team-a", "*") == [(state.jobs["a"].phase_since + 600, 8000)]
    assert holders.ends("team-b", "*") == [(now + 5, 1000), (math.inf, 1000)]  # no estimate: never
    assert holders.jobs("team-c", "*") == [] and holders.ends("gone", "*") == []


def test_a_rejected_job_leaves_submitted() -> None:
    log = base().submit("alice", "j")
    reject = JobRejected(job_id="j", request_seq=log.last_seq, reason=Reason("too-big", "no"))
    state = log.event(subj.job("j"), reject).fold()
    assert view(state)["phase"] == {"rejected": ["j"]}


def test_each_phase_keeps_the_order_jobs_entered_it() -> None:
    log = base()
    for j in ("a", "b", "c"):
        log.submit("alice", j)
    log.accept("c").accept("a").accept("b")
    state = log.fold()
    assert view(state)["phase"] == {"queued": ["c", "a", "b"]}
    # A queue keeps its jobs in the order it serves them: priority, then submission.
    assert [j.id for j in indexes.queued_in(state, "team-a")] == ["a", "b", "c"]
    # Withdrawn back to the queue: at the end of its phase, as it entered it again; in its queue,
    # at its place.
    state = log.admit("a").withdraw("a").fold(state)
    assert view(state)["queued"] == {"team-a": ["a", "b", "c"]}
    assert [j.id for j in indexes.jobs_in(state, "queued")] == ["c", "b", "a"]


def test_a_gang_is_held_on_each_of_its_nodes_and_a_lost_node_interrupts_it() -> None:
    log = base().submit("alice", "g", job().gpus(4).replicas(2)).submit("alice", "one", job().gpus(1))
    log.accept("g").accept("one").admit("g", replicas=2).admit("one")
    # "one" takes its GPU before the gang; holding_on still gives them in submission order.
    log.place(on(N0, 0, job_id="one"))
    log.place(placement("g", worker(0, N1, *map(whole, range(4))), worker(1, N0, *map(whole, range(1, 5)))))
    log.started(N1, "g", rank=0).started(N0, "g", rank=1).started(N0, "one")
    state = log.fold()
    assert view(state)["holding"] == {N0: ["one", "g"], N1: ["g"]}
    assert [j.id for j in indexes.holding_on(state, N0)] == ["g", "one"]
    assert sorted(j.id for j in indexes.holding(state)) == ["g", "one"]
    state = log.condition(N0, "lost").fold(state)
    # Their workers there are gone: "one" gives its GPU back; the gang holds all of its GPUs
    # until its last worker, on N1, is gone too.
    assert view(state) == {
        "phase": {"interrupted": ["g", "one"]},
        "queued": {},
        "holding": {N0: ["g"], N1: ["g"]},
    }
    state = log.exited(N1, "g", rank=0, code=143, stopped=True).requeue("g", 0).requeue("one", 0).fold(state)
    assert view(state) == {
        "phase": {"queued": ["g", "one"]},
        "queued": {"team-a": ["g", "one"]},
        "holding": {},
    }


def test_a_bad_gpu_interrupts_only_its_job_which_holds_the_rest_until_its_worker_exits() -> None:
    log = base().submit("alice", "a", job().gpus(1)).submit("alice", "b", job().gpus(1))
    log.accept("a").accept("b").admit("a", "b").place(on(N0, 0, job_id="a"), on(N0, 1, job_id="b"))
    log.started(N0, "a").started(N0, "b").gpu_health(N0, 1, False)
    state = log.fold()
    assert view(state) == {
        "phase": {"running": ["a"], "interrupted": ["b"]},
        "queued": {},
        "holding": {N0: ["a", "b"]},
    }
    state = log.exited(N0, "b", code=137).fold(state)
    assert view(state)["holding"] == {N0: ["a"]}


def test_a_preempted_job_checkpoints_stops_and_waits_again() -> None:
    log = base().submit("alice", "v", job().gpus(8).preemptible()).accept("v").admit("v")
    log.place(on(N0, *range(8), job_id="v")).started(N0, "v")
    log.submit("alice", "hi", job().gpus(8)).accept("hi", priority=10).preempt("hi", "v")
    state = log.fold()
    assert view(state) == {
        "phase": {"checkpointing": ["v"], "queued": ["hi"]},
        "queued": {"team-a": ["hi"]},
        "holding": {N0: ["v"]},
    }
    state = log.exited(N0, "v", stopped=True).fold(state)
    assert view(state)["phase"] == {"queued": ["hi"], "preempted": ["v"]}
    assert view(state)["holding"] == {}
    state = log.requeue("v", 0).fold(state)
    assert view(state)["queued"] == {"team-a": ["hi", "v"]}


def test_a_cancelled_job_leaves_its_queue_at_once_and_its_gpus_when_its_worker_exits() -> None:
    log = base().submit("alice", "q").submit("alice", "r", job().gpus(2)).accept("q").accept("r")
    log.admit("r").place(on(N1, 0, 1, job_id="r")).started(N1, "r")
    log.request("alice", "cancel", CancelJob(job_id="q")).request("alice", "cancel", CancelJob(job_id="r"))
    state = log.fold()
    assert view(state) == {"phase": {"cancelled": ["q", "r"]}, "queued": {}, "holding": {N1: ["r"]}}
    state = log.exited(N1, "r", code=143, stopped=True).fold(state)
    assert view(state)["holding"] == {}


def test_an_elastic_job_holds_the_nodes_of_its_ranks_as_it_grows_and_shrinks() -> None:
    log = base().submit("alice", "e", job().gpus(8).replicas(2, minimum=1)).accept("e").admit("e", replicas=1)
    log.place(on(N0, *range(8), job_id="e")).started(N0, "e")
    log.grow("e", 2).place(
        placement("e", worker(0, N0, *map(whole, range(8))), worker(1, N1, *map(whole, range(8))))
    )
    state = log.fold()
    assert view(state)["holding"] == {N0: ["e"], N1: ["e"]}
    log.started(N1, "e", rank=1).submit("alice", "b", job().gpus(8)).accept("b", priority=10)
    state = log.shrink("e", 1, "b").exited(N1, "e", rank=1, stopped=True).fold(state)
    assert state.rejected_total == 0, state.rejections
    assert view(state)["holding"] == {N0: ["e"]}
    assert state.jobs["e"].phase == "running"


def test_a_node_that_registers_again_with_its_gpus_renumbered_keeps_its_holders_indexed() -> None:
    nodes = Cluster(1)
    name, inv = nodes.nodes[0]
    log = LogBuilder().nodes(nodes).queue("team-a").submit("alice", "j", job().gpus(1)).accept("j").admit("j")
    log.place(on(name, 0, job_id="j")).started(name, "j")
    gpus = tuple(inv.gpus)
    renumbered = tuple(msgspec.structs.replace(g, index=i) for i, g in enumerate(gpus[1:] + gpus[:1]))
    state = log.node(name, NodeInventory(inv.cpu_milli, inv.memory_mib, renumbered, inv.labels)).fold()
    assert state.jobs["j"].phase == "interrupted"
    assert view(state)["holding"] == {name: ["j"]}  # until its worker's exit is reported
    state = log.exited(name, "j", code=137).fold(state)
    assert view(state)["holding"] == {}


def test_forget_takes_a_job_out_of_the_state_and_every_index() -> None:
    log = base().submit("alice", "q").submit("alice", "r", job().gpus(2)).accept("q").accept("r")
    state = log.admit("r").place(on(N1, 0, 1, job_id="r")).fold()
    indexes.forget(state, state.jobs["q"])
    indexes.forget(state, state.jobs["r"])
    assert state.jobs == {}
    assert view(state) == {"phase": {}, "queued": {}, "holding": {}}


def test_a_phases_elastic_jobs_are_indexed_and_a_resize_keeps_them() -> None:
    elastic = job().gpus(1).replicas(4, minimum=2)
    log = base().submit("alice", "e", elastic).submit("alice", "r", job().gpus(1)).accept("e").accept("r")
    state = log.admit("e", replicas=4).admit("r").fold()
    assert state.elastic_by_phase == {"admitted": {"e": None}}
    log.place(on(N0, 0, job_id="r"), placement("e", *(worker(i, N0, whole(i + 1)) for i in range(4))))
    state = log.started(N0, "r").fold(state)
    for rank in range(4):
        state = log.started(N0, "e", rank=rank).fold(state)
    assert [j.id for j in indexes.jobs_in(state, "running")] == ["r", "e"]
    assert [j.id for j in indexes.elastic_in(state, "running")] == ["e"]
    state = log.request("alice", "resize", {"job_id": "e", "replicas": 3}).fold(state)
    assert [j.id for j in indexes.elastic_in(state, "running")] == ["e"]
    indexes.check(state)


def test_rebuild_makes_the_indexes_of_the_jobs_in_their_order() -> None:
    log = base().submit("alice", "a").submit("alice", "b", job().gpus(1)).accept("a").accept("b").admit("b")
    state = log.place(on(N0, 3, job_id="b")).fold()
    built = indexes.rebuild(State(jobs=dict(state.jobs)))
    assert view(built) == view(state)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda s: s.jobs_by_phase["queued"].pop("a"), id="a job missing"),
        pytest.param(
            lambda s: s.queued_by_queue.setdefault("team-b", []).append((0, 1, "a")), id="a job twice"
        ),
        pytest.param(lambda s: s.queued_by_queue["team-a"].insert(0, (-1, 99, "z")), id="out of order"),
        pytest.param(lambda s: s.workers_by_ask.clear(), id="asks lost"),
        pytest.param(lambda s: s.holding_by_node.setdefault(N1, {}), id="an empty entry kept"),
        pytest.param(lambda s: s.holding_by_node.pop(N0), id="a holder missing"),
        pytest.param(lambda s: s.holding_quota_by_queue.pop("team-a"), id="a holder of quota missing"),
        pytest.param(
            lambda s: s.holding_quota_by_queue.setdefault("team-b", {}).update(a=None),
            id="a holder of quota in another queue",
        ),
        pytest.param(
            lambda s: s.naming_by_beneficiary.setdefault("b", {}).update(a=None), id="a name not given"
        ),
        pytest.param(lambda s: s.explained_by_queue.setdefault("team-a", {}).update(a=None), id="no reason"),
        pytest.param(
            lambda s: s.queued_by_shape.setdefault("[]", {}).update(b=None), id="a shape not queued"
        ),
        pytest.param(lambda s: s.queued_by_form.clear(), id="forms lost"),
        pytest.param(lambda s: s.elastic_by_phase.setdefault("placed", {}).update(b=None), id="not elastic"),
        pytest.param(
            lambda s: s.queued_by_form.setdefault("[]", []).append((0, 1, "b")), id="a form not queued"
        ),
        pytest.param(lambda s: s.places_held.update(a=None), id="a place not held"),
    ],
)
def test_check_says_where_an_index_differs_from_the_jobs(spoil: Any) -> None:
    log = base().submit("alice", "a").submit("alice", "b", job().gpus(1)).accept("a").accept("b").admit("b")
    state = log.place(on(N0, 3, job_id="b")).fold()
    indexes.check(state)
    spoil(state)
    with pytest.raises(AssertionError, match="indexes differ"):
        indexes.check(state)


def test_queued_jobs_are_indexed_by_host_shape_and_a_resize_moves_theirs() -> None:
    elastic = job().gpus(8).replicas(4, minimum=2)
    log = (
        base().submit("alice", "a", elastic).submit("alice", "b", elastic).submit("alice", "c", job().gpus(1))
    )
    state = log.accept("a").accept("b").accept("c").fold()
    wide, one = indexes.host_shape(state.jobs["a"].spec), indexes.host_shape(state.jobs["c"].spec)
    assert state.queued_by_shape == {wide: {"a": None, "b": None}, one: {"c": None}}
    # Down to its minimum, "b" is no longer elastic, which the reason a shape gives says.
    state = log.request("alice", "resize", ResizeJob(job_id="b", replicas=2)).fold()
    rigid = indexes.host_shape(state.jobs["b"].spec)
    assert rigid != wide
    assert state.queued_by_shape == {wide: {"a": None}, rigid: {"b": None}, one: {"c": None}}
    indexes.check(state)
    state = log.admit("c").fold()
    assert state.queued_by_shape == {wide: {"a": None}, rigid: {"b": None}}
    indexes.check(state)


def _forms(state: State) -> dict[str, list[str]]:
    indexes.check(state)
    return {key: [i for _, _, i in places] for key, places in state.queued_by_form.items()}


def test_queued_jobs_are_indexed_by_form_in_their_queues_order() -> None:
    one, eight = job().gpus(1), job().gpus(8).pack("nvlink")
    log = base()
    # The runtime estimate is not part of a form; the queue is.
    log.submit("alice", "a", one).submit("alice", "b", one.queue("team-b").replicas(4, minimum=1))
    log.submit("alice", "c", eight)
    log.submit("alice", "d", msgspec.structs.replace(one.build(), runtime_estimate_s=60.0))
    state = log.accept("a").accept("b").accept("c").accept("d", priority=5).fold()
    a, b, c = (indexes.form_key(state.jobs[j].spec) for j in "abc")
    assert len({a, b, c}) == 3 and indexes.form_key(state.jobs["d"].spec) == a
    # Highest priority first, then submission: the queue's own order.
    assert _forms(state) == {a: ["d", "a"], b: ["b"], c: ["c"]}
    # A change of priority moves a job within its form, a resize to another form, and a job
    # that leaves the queue leaves its form.
    body = JobPriorityChanged(job_id="a", priority=9, reason=Reason("aged", "waited long"))
    state = (
        log.event(subj.job("a"), body).request("alice", "resize", ResizeJob(job_id="b", replicas=2)).fold()
    )
    b2 = indexes.form_key(state.jobs["b"].spec)
    assert b2 != b and _forms(state) == {a: ["a", "d"], b2: ["b"], c: ["c"]}
    state = log.admit("c").fold()
    assert _forms(state) == {a: ["a", "d"], b2: ["b"]}


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(job().gpus(2), id="ask"),
        pytest.param(job().replicas(2), id="replicas"),
        pytest.param(job().replicas(2, minimum=1), id="minimum"),
        pytest.param(job().pack("nvlink"), id="topology"),
        pytest.param(job().select(zone="a"), id="selector"),
        pytest.param(job("team-b"), id="queue"),
    ],
)
def test_a_form_differs_in_what_the_preemptor_reads(other: Any) -> None:
    assert indexes.form_key(job().build()) != indexes.form_key(other.build())


def test_a_form_key_leaves_out_what_equals_its_default() -> None:
    plain = job().build()
    spelt = msgspec.json.decode(msgspec.json.encode(plain), type=JobSpec)  # fields decoded anew
    assert indexes.form_key(spelt) == indexes.form_key(plain)
    assert indexes.form_key(job().select(zone="a").build()) == indexes.form_key(
        job().select(zone="a").build()
    )


def test_letting_finished_jobs_go_keeps_the_indexes() -> None:
    nodes = Cluster(1).nodes
    jobs = [SimJob(f"j{i}", "alice", job().gpus(1 + i % 4).build(), float(i), 50.0 + i) for i in range(40)]
    setup = [_queue("team-a"), ApplyRetention(retention=RetentionSpec(finished_s=0.0))]
    sim = Simulation(nodes, setup, jobs, SimConfig())
    sim.run(until=60.0)
    view(sim.state)
    sim.run()
    view(sim.state)  # every index as the jobs say, after jobs were let go through ``indexes.forget``
    assert sim.state.let_go >= 39 and len(sim.state.jobs) <= 1 and len(sim.unfinished()) == 0


def _queue(name: str) -> ApplyQueue:
    return ApplyQueue(queue=QueueSpec(name, quotas={"*": Quota(64)}))


class _Unwalkable(dict[str, Any]):
    """``State.jobs`` that may be asked for a job by id, never walked."""

    def _walked(self, *_: Any) -> Any:
        raise AssertionError("State.jobs was walked")

    __iter__ = keys = values = items = _walked  # type: ignore[assignment]


def test_no_decision_and_no_node_event_walks_every_job() -> None:
    log = base().submit("alice", "v", job().gpus(8).preemptible()).accept("v").admit("v")
    log.place(on(N0, *range(8), job_id="v")).started(N0, "v")
    log.submit("alice", "r", job().gpus(4)).accept("r").admit("r").place(on(N1, 0, 1, 2, 3, job_id="r"))
    log.submit("bob", "hi", job("team-b").gpus(8)).accept("hi", priority=10)
    for i in range(3):
        log.submit("alice", f"done-{i}").accept(f"done-{i}").request(
            "alice", "cancel", CancelJob(job_id=f"done-{i}")
        )
    log.submit("carol", "new", job("team-b").gpus(1))
    state = log.fold()
    state.jobs = _Unwalkable(state.jobs)
    now = state.time + 1
    assert admission_decide(state, now)
    placer_decide(state, now)
    preemptor_decide(state, now)
    # (Node agents read their node's view, which the assignments service keeps per node.)
    state = log.gpu_health(N1, 5, False).condition(N0, "lost").cordon(N1, drain=True).fold(state)
    state = log.admin("delete-queue", DeleteQueue(name="team-b")).fold(state)
    assert state.faults == 0 and state.jobs["v"].phase == "interrupted"
    assert state.rejections[-1].message == "queue team-b still has jobs not finished: hi, new"


@pytest.mark.parametrize(
    "stored",
    [
        b'{"gpus":1,"gpu_milli":1000}',
        b'{"gpus":1,"gpu_milli":1000,"cpu_milli":1000,"memory_mib":1024,"gpu_models":[]}',
        b'{"gpus":1}',
    ],
    ids=["a-default-written-out", "every-default-written-out", "defaults-left-out"],
)
def test_equal_asks_are_keyed_alike_however_they_were_made(stored: bytes) -> None:
    """A decoded default is a fresh object that msgspec's ``omit_defaults`` writes out, where the
    constructed one is left out: the keys must not tell the two apart."""
    decoded = msgspec.json.decode(stored, type=Resources)
    made = Resources(gpus=1)
    assert indexes.ask_key(decoded) == indexes.ask_key(made) == '{"gpus":1}'
    assert indexes.ask_of(indexes.ask_key(decoded)) == made
    spec = msgspec.json.decode(
        b'{"queue":"q","resources":' + stored + b',"topology":{"pack":"none","required":false}}', type=JobSpec
    )
    made_spec = JobSpec(queue="q", resources=made, topology=Topology())
    assert indexes.host_shape(spec) == indexes.host_shape(made_spec)
