"""A node that registers again: GPUs are who they are (UUID), not where they are (index).

NVML numbers GPUs anew after one falls off the bus, so a node's second registration may list the
same GPUs at other indices, or fewer of them. What work holds must follow each GPU to its new
index (or leave with it), the jobs on a GPU that moved or left are interrupted, and no GPU is
ever given out while a job still holds it.
"""

from __future__ import annotations

import msgspec

from corral.events.decisions import JobsPlaced
from corral.events.nodes import NodeInventory
from corral.projections.state import State
from corral.services.agent.inventory import h100_8x_nvswitch
from corral.services.placer.decide import decide
from tests.builders import LogBuilder, job, mig_slot, on, placement, share, worker

NODE = "node-00"
FULL = h100_8x_nvswitch(NODE)


def _without(gpu: int) -> NodeInventory:
    """The node as NVML lists it after GPU ``gpu`` fell off the bus: the rest, renumbered."""
    rest = [g for g in FULL.gpus if g.index != gpu]
    renumbered = tuple(msgspec.structs.replace(g, index=i) for i, g in enumerate(rest))
    return msgspec.structs.replace(FULL, gpus=renumbered)


def _running_on(gpu: int) -> LogBuilder:
    lb = LogBuilder().node(NODE, FULL).queues("team-a")
    lb.submit("alice", "j", job().gpus(1)).accept("j").admit("j")
    return lb.place(on(NODE, gpu, job_id="j")).started(NODE, "j")


def _holders(state: State) -> dict[str, list[str]]:
    return {g.info.uuid: sorted(g.holders) for g in state.nodes[NODE].gpus if g.holders}


def test_a_job_whose_gpu_left_the_bus_is_interrupted_and_holds_nothing_of_the_others() -> None:
    lb = _running_on(3).node(NODE, _without(3))
    state = lb.fold()
    job = state.jobs["j"]
    assert job.phase == "interrupted"
    assert _holders(state) == {}  # index 3 is another GPU now, and nobody holds it
    assert job.held is not None and [c.gpu for w in job.held.workers for c in w.gpus] == []
    state = lb.exited(NODE, "j", code=137).fold()
    assert state.jobs["j"].held is None and _holders(state) == {}


def test_a_held_gpu_renumbered_keeps_its_holder_at_its_new_index() -> None:
    uuid = FULL.gpus[5].uuid
    lb = _running_on(5).node(NODE, _without(3))  # GPU 5 is GPU 4 now
    state = lb.fold()
    assert state.jobs["j"].phase == "interrupted"
    assert _holders(state) == {uuid: ["j"]}
    assert state.nodes[NODE].gpus[4].info.uuid == uuid and state.nodes[NODE].gpus[4].holders == {"j": 1000}
    # Another job may have index 5 (another GPU now), never index 4 while j still holds it.
    lb.submit("alice", "k", job().gpus(1)).accept("k").admit("k")
    refused = lb.place(on(NODE, 4, job_id="k")).fold()
    assert refused.jobs["k"].phase == "admitted" and refused.rejections[-1].code == "void"
    state = lb.place(on(NODE, 5, job_id="k")).fold()
    assert state.jobs["k"].phase == "placed"
    # Once j's worker has exited, its GPU is free again, at its new index.
    state = lb.exited(NODE, "j", code=137).fold()
    assert _holders(state) == {FULL.gpus[6].uuid: ["k"]}


def test_the_same_gpus_at_the_same_indices_change_nothing() -> None:
    state = _running_on(2).node(NODE, FULL).fold()
    assert state.jobs["j"].phase == "running" and _holders(state) == {FULL.gpus[2].uuid: ["j"]}


def test_two_gpus_with_one_uuid_are_refused() -> None:
    twice = msgspec.structs.replace(FULL, gpus=(FULL.gpus[0], msgspec.structs.replace(FULL.gpus[0], index=1)))
    state = _running_on(0).node(NODE, twice).fold()
    assert state.rejections[-1].code == "malformed" and "UUID" in state.rejections[-1].message
    assert state.jobs["j"].phase == "running" and len(state.nodes[NODE].gpus) == 8


def _in_mig_mode(mig: bool) -> NodeInventory:
    """The same GPUs, the same indices, in (or out of) MIG mode."""
    return msgspec.structs.replace(FULL, gpus=tuple(msgspec.structs.replace(g, mig=mig) for g in FULL.gpus))


def test_a_held_gpu_switched_into_mig_mode_is_given_to_no_slice_while_its_job_holds_it() -> None:
    # The same GPUs re-registered in MIG mode while a whole-GPU job held them: a MIG slice was
    # placed on one of them, one GPU held by two jobs.
    lb = _running_on(0).node(NODE, _in_mig_mode(True))
    state = lb.fold()
    assert state.jobs["j"].phase == "interrupted" and "MIG mode" in state.jobs["j"].reasons[0].message
    assert state.nodes[NODE].gpus[0].holders == {"j": 1000} and state.nodes[NODE].gpus[0].held_in_other_mode
    lb.submit("bob", "s", job().mig("3g.40gb")).accept("s").admit("s")
    slice0 = placement("s", worker(0, NODE, mig_slot(0, "3g.40gb", 0)))
    refused = lb.place(slice0).fold()
    assert refused.jobs["s"].phase == "admitted" and refused.rejections[-1].code == "void"
    assert "mode it left" in refused.rejections[-1].message
    state = lb.place(placement("s", worker(0, NODE, mig_slot(1, "3g.40gb", 0)))).fold()
    assert state.jobs["s"].phase == "placed"  # another GPU of the node, nobody's
    lb.exited(NODE, "j", code=137)
    state = lb.fold()
    assert not state.nodes[NODE].gpus[0].holders and not state.nodes[NODE].gpus[0].held_in_other_mode


def test_a_gpu_switched_out_of_mig_mode_takes_no_whole_job_while_its_slices_are_held() -> None:
    mig = _in_mig_mode(True)
    lb = LogBuilder().node(NODE, mig).queues("team-a")
    lb.submit("alice", "s", job().mig("3g.40gb")).accept("s").admit("s")
    lb.place(placement("s", worker(0, NODE, mig_slot(0, "3g.40gb", 0)))).started(NODE, "s")
    lb.node(NODE, _in_mig_mode(False))
    state = lb.fold()
    assert state.jobs["s"].phase == "interrupted" and state.nodes[NODE].gpus[0].held_in_other_mode
    lb.submit("bob", "w", job().gpus(1).milli(250)).accept("w").admit("w")
    refused = lb.place(placement("w", worker(0, NODE, share(0, 250)))).fold()
    assert refused.jobs["w"].phase == "admitted" and refused.rejections[-1].code == "void"
    lb.exited(NODE, "s", code=137)
    state = lb.place(placement("w", worker(0, NODE, share(0, 250)))).fold()
    assert state.jobs["w"].phase == "placed"


def test_the_placer_offers_no_slice_of_a_gpu_held_in_the_mode_it_left() -> None:
    lb = _running_on(0).node(NODE, _in_mig_mode(True))
    lb.submit("bob", "s", job().mig("3g.40gb")).accept("s").admit("s")
    state = lb.fold()
    events = decide(state, state.time + 1)
    placed = [p for e in events if isinstance(e, JobsPlaced) for p in e.placements]
    assert [c.gpu for p in placed for w in p.workers for c in w.gpus] == [1]  # not GPU 0


def test_a_held_gpu_registered_as_another_model_interrupts_its_job() -> None:
    # The job asked for (and is charged quota of) an H100, and ran on a GPU now said to be
    # another model.
    a100s = tuple(msgspec.structs.replace(g, model="A100-80GB") for g in FULL.gpus)
    other = msgspec.structs.replace(FULL, gpus=a100s)
    state = _running_on(2).node(NODE, other).fold()
    assert state.jobs["j"].phase == "interrupted" and "model" in state.jobs["j"].reasons[0].message


def test_a_slice_given_back_after_its_gpu_became_another_model_leaves_no_slice_taken() -> None:
    # The slice was placed as an H100's 3g.40gb; the GPU is now said to be an A100-40GB, which
    # has no such profile: giving it back must still free its memory slices.
    lb = LogBuilder().node(NODE, _in_mig_mode(True)).queues("team-a")
    lb.submit("alice", "s", job().mig("3g.40gb")).accept("s").admit("s")
    lb.place(placement("s", worker(0, NODE, mig_slot(0, "3g.40gb", 0)))).started(NODE, "s")
    a100s = tuple(msgspec.structs.replace(g, model="A100-40GB") for g in _in_mig_mode(True).gpus)
    lb.node(NODE, msgspec.structs.replace(FULL, gpus=a100s))
    assert lb.fold().jobs["s"].phase == "interrupted"
    lb.exited(NODE, "s", code=137)
    gpu = lb.fold().nodes[NODE].gpus[0]
    assert not gpu.holders and not gpu.mig and gpu.mig_used == 0
    lb.submit("bob", "t", job().mig("7g.40gb")).accept("t").admit("t")
    state = lb.place(placement("t", worker(0, NODE, mig_slot(0, "7g.40gb", 0)))).fold()
    assert state.jobs["t"].phase == "placed"


def test_a_slice_given_back_after_its_gpu_became_another_model_frees_only_the_slices_it_took() -> None:
    # 1g.10gb is one memory slice on an A100-80GB and two on an A100-40GB: a's release, looked
    # up on the new model, freed b's slice too, and c was placed on it while b ran there.
    def a100(model: str) -> NodeInventory:
        gpu = msgspec.structs.replace(FULL.gpus[0], model=model, mig=True)
        return msgspec.structs.replace(FULL, gpus=(gpu,))

    lb = LogBuilder().node(NODE, a100("A100-80GB")).queues("team-a")
    for j, start in (("a", 0), ("b", 1)):
        lb.submit("alice", j, job().mig("1g.10gb")).accept(j).admit(j)
        lb.place(placement(j, worker(0, NODE, mig_slot(0, "1g.10gb", start)))).started(NODE, j)
    lb.node(NODE, a100("A100-40GB")).exited(NODE, "a", code=137)
    gpu = lb.fold().nodes[NODE].gpus[0]
    assert set(gpu.mig) == {1} and gpu.mig_used == 0b10 and gpu.holders == {"b": 125}
    lb.submit("bob", "c", job().mig("1g.5gb")).accept("c").admit("c")
    state = lb.place(placement("c", worker(0, NODE, mig_slot(0, "1g.5gb", 1)))).fold()
    assert state.jobs["c"].phase == "admitted" and state.rejections[-1].code == "void"


def test_a_failed_gpu_nobody_holds_stays_failed_when_its_node_registers_again() -> None:
    # An agent's restart registered the GPU anew, healthy, until the health monitor said again
    # what it knew: meanwhile the placer put new work on a GPU with an uncontained ECC error.
    lb = LogBuilder().node(NODE, FULL).queues("team-a").gpu_health(NODE, 0, False, "xid:95")
    gpu = lb.node(NODE, FULL).fold().nodes[NODE].gpus[0]
    assert (gpu.healthy, gpu.signal) == (False, "xid:95")
    lb.submit("bob", "s", job().gpus(1)).accept("s").admit("s")
    state = lb.fold()
    events = decide(state, state.time + 1)
    placed = [p for e in events if isinstance(e, JobsPlaced) for p in e.placements]
    assert [c.gpu for p in placed for w in p.workers for c in w.gpus] == [1]
    assert lb.gpu_health(NODE, 0, True).node(NODE, FULL).fold().nodes[NODE].gpus[0].healthy


def test_a_node_shut_down_takes_no_new_work_until_its_agent_registers_it_again() -> None:
    # Its agent stopped its workers and exited: its heartbeats end with it, and only a minute of
    # silence makes it lost. Meanwhile the placer put new jobs where no agent would start them.
    other = "node-01"
    lb = _running_on(0).node(other, h100_8x_nvswitch(other)).shutdown(NODE)
    lb.submit("bob", "k", job().gpus(8)).accept("k").admit("k")
    state = lb.fold()
    assert state.nodes[NODE].shut_down and not state.nodes[NODE].schedulable
    assert state.nodes[NODE].standing == "shut down" and state.nodes[other].standing == "ready"
    events = decide(state, state.time + 1)
    placed = [p for e in events if isinstance(e, JobsPlaced) for p in e.placements]
    assert [w.node for p in placed for w in p.workers] == [other]
    # A proposal that puts work there anyway is refused for it.
    lb.place(on(NODE, 1, 2, 3, 4, 5, 6, 7, 0, job_id="k"))
    state = lb.fold()
    assert state.jobs["k"].phase == "admitted" and f"{NODE} is shut down" in state.rejections[-1].message
    # Its agent back, the same hardware registered again: in service.
    lb.exited(NODE, "j", code=143, stopped=True).node(NODE, FULL)
    state = lb.fold()
    assert not state.nodes[NODE].shut_down and state.nodes[NODE].schedulable
    lb.place(on(NODE, 1, 2, 3, 4, 5, 6, 7, 0, job_id="k"))
    assert lb.fold().jobs["k"].phase == "placed"


def test_a_shutdown_whose_agent_does_not_say_it_registers_again_leaves_the_node_in_service() -> None:
    # An agent of an older build registers only hardware that changed: the placements its
    # logs hold after a shutdown fold as they did (a finished job does not run again).
    lb = _running_on(0).shutdown(NODE, registers_again=False).exited(NODE, "j", code=143, stopped=True)
    lb.submit("bob", "k", job().gpus(1)).accept("k").admit("k").place(on(NODE, 1, job_id="k"))
    state = lb.started(NODE, "k").exited(NODE, "k", code=0).fold()
    assert state.nodes[NODE].schedulable and state.jobs["k"].phase == "succeeded"
    assert state.rejected_total == 0
