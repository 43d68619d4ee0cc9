"""``corral whatif`` on small hand-made states: what it says for a job that starts now, one that
waits (with the smaller asks that start now, each checked), one refused; and it changes nothing
in the state it reads."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from corral.events.jobs import JobSpec, Resources
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.services.agent import inventory
from corral.services.forecast import whatif
from corral.services.sim.driver import SimJob, Simulation
from tests.builders import TRAIN


def spec(gpus: int = 1, replicas: int = 1, queue: str = "q", estimate: float = 100.0) -> JobSpec:
    return JobSpec(
        queue=queue,
        replicas=replicas,
        resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024),
        runtime_estimate_s=estimate,
        preemptible=False,
        command=TRAIN,
    )


def busy(held: int) -> Simulation:
    """One 8-GPU node, a queue of 8 GPUs, ``held`` GPUs held by a job expected to end at 1000."""
    setup = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=8)}))]
    jobs = [SimJob("running", "t", spec(held, estimate=1000.0), 0.0, 1000.0)]
    return Simulation(inventory.cluster(1, "h100-8x"), setup, jobs).run(until=0.0)


def test_a_job_that_fits_is_placed_now() -> None:
    sim = busy(4)
    o = whatif.whatif(sim.state, "t", "new", spec(2), 10.0)
    assert o.accepted and o.starts_now
    assert len(o.placed) == 1 and o.placed[0][0] == 0
    assert len(o.placed[0][2]) == 2


def test_a_job_that_waits_gets_its_start_and_smaller_asks() -> None:
    sim = busy(4)
    o = whatif.whatif(sim.state, "t", "new", spec(2, replicas=4), 10.0)
    assert o.accepted and not o.starts_now
    assert o.start == 1000.0  # when the running job is expected to end
    found = dict(whatif.suggestions(sim.state, "t", "new", spec(2, replicas=4), 10.0))
    assert "--replicas 2" in found and found["--replicas 2"].starts_now
    text = whatif.report(sim.state, "t", "new", spec(2, replicas=4), 10.0)
    assert "estimated start: in 16 min" in text and "--replicas 2" in text


def test_a_job_no_node_could_host_is_not_accepted() -> None:
    o = whatif.whatif(busy(4).state, "t", "new", spec(8, replicas=1, queue="nowhere"), 10.0)
    assert not o.accepted and o.reason


def test_whatif_changes_nothing() -> None:
    sim = busy(4)
    before = msgspec.msgpack.encode(sim.state)
    whatif.report(sim.state, "t", "new", spec(2, replicas=4), 10.0)
    assert msgspec.msgpack.encode(sim.state) == before


def test_a_question_naming_no_id_is_asked_under_one_no_job_holds() -> None:
    # Under the fixed id "whatif", a tenant owning a job of that id had every other tenant's
    # what-if answered "not accepted: job id whatif is taken".
    setup = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=8)}))]
    squat = [SimJob(job_id, "mallory", spec(1, estimate=1e6), 0.0, 1e6) for job_id in ("whatif", "whatif-1")]
    state = Simulation(inventory.cluster(1, "h100-8x"), setup, squat).run(until=0.0).state
    assert state.jobs["whatif"].tenant == "mallory"
    told = whatif.answer(state, "t", "", spec(2), 10.0)
    assert told["accepted"] and told["starts_now"], told
    assert whatif.free_id(state) not in state.jobs


def test_a_whatif_says_nothing_of_whether_another_tenant_holds_an_id() -> None:
    # Told "job id X is taken", a tenant could probe, unrecorded, for the ids others use.
    setup = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=8)}))]
    held = [
        SimJob("train-7", "mallory", spec(1, estimate=1e6), 0.0, 1e6),
        SimJob("mine", "t", spec(1), 0.0, 100),
    ]
    state = Simulation(inventory.cluster(1, "h100-8x"), setup, held).run(until=0.0).state
    told = whatif.answer(state, "t", "train-7", spec(2), 10.0)
    assert told == whatif.answer(state, "t", "no-one-has-this", spec(2), 10.0)
    assert told["accepted"] and told["starts_now"], told
    own = whatif.answer(state, "t", "mine", spec(2), 10.0)  # its own id: it knows it has it
    assert not own["accepted"] and "submitted with another spec" in own["reason"]
    admin = whatif.answer(state, "admin", "train-7", spec(2), 10.0)  # it lists every job anyway
    assert not admin["accepted"] and "taken" in admin["reason"]


def test_a_whatif_simulates_no_longer_than_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # A deep backlog made one what-if take seconds, and a client that gave up left it running.
    setup = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=8)}))]
    ending = [SimJob(f"r{i}", "t", spec(1, estimate=100.0 * i), 0.0, 100.0 * i) for i in range(1, 9)]
    state = Simulation(inventory.cluster(1, "h100-8x"), setup, ending).run(until=0.0).state
    assert whatif.whatif(state, "t", "new", spec(8), 10.0).start == 800.0  # after eight ends
    assert whatif.whatif(state, "t", "new", spec(8), 10.0, deadline=0.0).cut
    monkeypatch.setattr(whatif, "BUDGET_S", 0.0)
    told = whatif.answer(state, "t", "new", spec(8), 10.0)
    assert told["accepted"] and told["start"] is None and told["cut_s"] == 0.0
    assert told["start_now_with"] == []  # no smaller ask tried past the budget
    assert "not found in the 0 s a what-if may simulate" in whatif.text(told)
    monkeypatch.undo()
    assert whatif.answer(state, "t", "new", spec(8), 10.0)["cut_s"] is None


def test_a_job_an_elastic_jobs_shrink_makes_room_for_is_told_so() -> None:
    # The simulator ran no shrinks: the what-if said "preempts nobody, estimated start in 24 h"
    # where the preemptor at once shrank the lender's borrower and the job was placed seconds on.
    from corral.events.jobs import JobsAdmitted
    from corral.services.admission.decide import decide as admission
    from corral.services.preemptor.decide import decide as preemptor
    from tests.unit.test_preemptor import elastic_borrower

    w = elastic_borrower()
    ask = JobSpec(queue="team-b", resources=Resources(gpus=8), command=TRAIN)
    o = whatif.whatif(w.state, "bob", "b1", ask, w.time)
    assert o.stops == ["a job of queue team-a (shrunk to 8 workers)"], o.stops
    assert not o.starts_now and o.start <= w.time + 60, o.start
    w.submit("b1", ask)
    assert not [e for e in w.cycle(admission) if isinstance(e, JobsAdmitted)]
    assert [type(e).__name__ for e in w.cycle(preemptor)] == ["ShrinkRequested"]


def _four_borrowers(checkpointable: bool = True, grace_seconds: float = 30.0) -> Any:
    """Four of alice's 2-GPU jobs of team-a (no quota of its own) borrow team-b's 8 GPUs."""
    from corral.events.decisions import GpuClaim
    from tests.unit.test_preemptor import World

    w = World().cohort("ml").queue("team-a", 0, cohort="ml").queue("team-b", 8, cohort="ml")
    one = JobSpec(
        queue="team-a",
        resources=Resources(gpus=2),
        checkpointable=checkpointable,
        grace_seconds=grace_seconds,
        command=TRAIN,
    )
    for i in range(4):
        w.run(f"a{i}", one, ("node-00", (GpuClaim(2 * i), GpuClaim(2 * i + 1))))
    return w


def test_the_jobs_it_would_stop_of_one_queue_are_counted_not_listed_each() -> None:
    # Another tenant's jobs are each "a job of queue X": a lender's what-if over three of a
    # borrower's read "it would preempt 3: a job of queue team-a, a job of queue team-a, a job of
    # queue team-a".
    w = _four_borrowers()
    ask = JobSpec(queue="team-b", resources=Resources(gpus=6), command=TRAIN)
    told = whatif.answer(w.state, "bob", "b1", ask, w.time)
    assert len(told["preempts"]) == 3 and not told["starts_now"], told
    said = whatif.text(told)
    assert "it would preempt 3: 3 jobs of queue team-a (and start once they stop)" in said, said


def test_a_job_shrunk_to_one_worker_is_said_so() -> None:
    from corral.events.decisions import GpuClaim
    from tests.unit.test_preemptor import World

    w = World().cohort("ml").queue("team-a", 1, cohort="ml").queue("team-b", 1, cohort="ml")
    spec = JobSpec(
        queue="team-a",
        resources=Resources(gpus=1),
        replicas=2,
        min_replicas=1,
        checkpointable=True,
        command=TRAIN,
    )
    w.submit("elastic", spec).admit("elastic", 2)
    w.place("elastic", ("node-00", (GpuClaim(0),)), ("node-00", (GpuClaim(1),))).start("elastic")
    o = whatif.whatif(
        w.state, "bob", "b1", JobSpec(queue="team-b", resources=Resources(gpus=1), command=TRAIN), w.time
    )
    assert o.stops == ["a job of queue team-a (shrunk to 1 worker)"], o.stops


@pytest.mark.parametrize("checkpointable", [True, False], ids=["saves-a-checkpoint", "cannot-checkpoint"])
def test_a_job_that_stops_others_starts_when_their_grace_is_over_not_before(checkpointable: bool) -> None:
    # Victims given 10 minutes' grace were taken to be gone in the 30 s a simulated save takes
    # ("estimated start: in 30 s"), or at once when they could not checkpoint ("admitted and
    # placed now"); live, their GPUs are given over only once their workers have exited, which
    # they may put off until their deadline, and the placer waits for that.
    w = _four_borrowers(checkpointable=checkpointable, grace_seconds=600.0)
    ask = JobSpec(queue="team-b", resources=Resources(gpus=6), command=TRAIN)
    told = whatif.answer(w.state, "bob", "b1", ask, w.time)
    assert len(told["preempts"]) == 3 and not told["starts_now"] and not told["placed"], told
    assert told["start"] == w.time + 600.0, told  # by their deadline: their whole grace
    assert told["early"] == w.time + (30.0 if checkpointable else 0.0), told  # if they leave at once
    said = whatif.text(told)
    assert "placed now" not in said, said
    assert "estimated start: in 10 min, when the jobs it stops must have left" in said, said


def test_the_admin_is_told_which_jobs_it_would_stop() -> None:
    # The admin lists and explains every job, yet a what-if told it "a job of queue team-a" of
    # the jobs it would stop, as it tells a tenant of another's.
    w = _four_borrowers()
    ask = JobSpec(queue="team-b", resources=Resources(gpus=6), command=TRAIN)
    assert whatif.answer(w.state, "admin", "b1", ask, w.time)["preempts"] == ["a1", "a2", "a3"]
    assert whatif.answer(w.state, "alice", "b1", ask, w.time)["preempts"] == ["a1", "a2", "a3"]  # hers
    assert whatif.answer(w.state, "bob", "b1", ask, w.time)["preempts"] == ["a job of queue team-a"] * 3
