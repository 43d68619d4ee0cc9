"""The fold's handling of what nodes report: registrations, workers started and exited,
checkpoints, shutdowns, and health: conditions, GPU health and cordons. A job gives its GPUs back
only when its last live worker is gone; a lost node, a bad GPU or a node shut down interrupts the
jobs on it without counting against their restarts.

An agent speaks for its node only: a worker's exit must name a rank placed on the node it is
reported from, so that no agent can end (or spare) the work of another node's jobs.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import msgspec

from corral.events import subjects as subj
from corral.events.base import Event, Reason
from corral.events.decisions import Placement, WorkerSlot
from corral.events.jobs import said_reason
from corral.events.nodes import (
    MAX_GPU_NAME,
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    NodeShutdown,
    WorkerExited,
    WorkerStarted,
    labels_problem,
    location_problem,
)
from corral.projections import claims, gpu_time, indexes, preemption, runtimes, xids
from corral.projections.fold_moves import (
    Ctx,
    Handler,
    Refused,
    find_node,
    move,
    move_twice,
    release,
    stop_holding,
)
from corral.projections.lifecycle import (
    FINAL,
    IllegalTransition,
    Phase,
)
from corral.projections.state import (
    Checkpoint,
    GpuState,
    JobState,
    NodeState,
    State,
)

# -- nodes and workers --------------------------------------------------------------------------


# The most GPUs one node registers: more than any server holds (an HGX board has 8, the largest
# systems 16 to 72 in one NVLink domain). One registration of 9,000 made the cluster's GPU grid
# larger than a message, for every reader, and drew every tenant's work to a node that lied.
MAX_GPUS_PER_NODE = 256
# The most workers a node may say it runs at once (``NodeInventory.max_workers``): a kubelet
# allows at most a few hundred pods; more, and one node's agent would run a process per job.
MAX_WORKERS_PER_NODE = 4096
# The reason code of a job a planned shutdown of its node stopped (``NodeShutdown``): an
# interruption the job is not charged for, which traces and operators tell from a fault.
SHUT_DOWN = "shut-down"


def _registered(state: State, ctx: Ctx, ev: NodeRegistered) -> None:
    if not subj.is_token(ev.node):
        raise Refused("malformed", f"node name {ev.node!r} is not a valid name")
    inv = ev.inventory
    if len(inv.gpus) > MAX_GPUS_PER_NODE:
        raise Refused(
            "malformed", f"node {ev.node}: {len(inv.gpus)} GPUs, more than a node has ({MAX_GPUS_PER_NODE})"
        )
    if inv.cpu_milli < 0 or inv.memory_mib < 0:
        raise Refused("malformed", f"node {ev.node}: negative CPU or memory")
    if not 1 <= inv.max_workers <= MAX_WORKERS_PER_NODE:
        raise Refused("malformed", f"node {ev.node}: max_workers must be 1..{MAX_WORKERS_PER_NODE}")
    for g in inv.gpus:
        if g.memory_mib < 0 or g.nvlinks < 0 or not -1 <= g.island < MAX_GPUS_PER_NODE:
            raise Refused(
                "malformed", f"node {ev.node}: GPU {g.index} has negative memory or NVLinks, or no island"
            )
        if not (0 < len(g.model) <= MAX_GPU_NAME and len(g.uuid) <= MAX_GPU_NAME) or not (
            g.model.isprintable() and g.uuid.isprintable()
        ):
            raise Refused(
                "malformed",
                f"node {ev.node}: GPU {g.index}'s model and UUID must be printable and at most "
                f"{MAX_GPU_NAME} characters",
            )
    why = labels_problem(inv.labels)
    if why is not None:
        raise Refused("malformed", f"node {ev.node}: labels: {why}")
    indices = [g.index for g in inv.gpus]
    if indices != list(range(len(indices))):
        raise Refused("malformed", f"node {ev.node}: GPU indices must be 0..{len(indices) - 1}")
    uuids = [g.uuid for g in ev.inventory.gpus]
    if len(set(uuids)) != len(uuids):
        raise Refused("malformed", f"node {ev.node}: two GPUs with one UUID")
    old = state.nodes.get(ev.node)
    # A GPU is its UUID, not its index: NVML numbers GPUs anew when one falls off the bus. What
    # work holds follows the GPU to its new index, or leaves with it.
    held = {g.info.uuid: g for g in old.gpus if g.holders} if old is not None else {}
    # A GPU found failed stays failed across its agent's restart, held or not, as the health
    # monitor keeps its verdict: it says when the GPU is well again.
    sick = {g.info.uuid: g for g in old.gpus if not g.healthy} if old is not None else {}
    now_at = {g.uuid: g.index for g in ev.inventory.gpus}
    moved = {g.info.index: now_at.get(u) for u, g in held.items() if now_at.get(u) != g.info.index}
    # Every GPU's, held or not: a place kept across a shutdown names GPUs the work gave back.
    renumbered = {
        g.info.index: now_at.get(g.info.uuid)
        for g in (old.gpus if old is not None else ())
        if now_at.get(g.info.uuid) != g.info.index
    }
    gpus = []
    switched = set()  # held GPUs now in or out of MIG mode, or another model: their work may not go on
    for info in ev.inventory.gpus:
        prev = held.get(info.uuid)
        if prev is not None:
            if prev.info.mig != info.mig or prev.info.model != info.model:
                switched.add(info.index)
            prev.info = info  # work still holds it: keep what it holds
            gpus.append(prev)
        elif info.uuid in sick:
            gpus.append(GpuState(info=info, healthy=False, signal=sick[info.uuid].signal))
        else:
            gpus.append(GpuState(info=info))
    if old is None:
        state.nodes[ev.node] = NodeState(name=ev.node, inventory=ev.inventory, gpus=gpus)
    else:
        old.inventory = ev.inventory
        old.gpus = gpus
        old.shut_down = 0  # its agent is back
    if moved:
        _gpus_moved(state, ctx, ev.node, moved)
    if renumbered:
        _kept_places_moved(state, ev.node, renumbered)
    if switched:
        # Their claims name what they no longer are (and their quota another model's): the jobs
        # hold them until their workers are gone (in the other mode, ``GpuState.held_in_other_mode``:
        # nothing new is placed on them meanwhile).
        which = ", ".join(str(i) for i in sorted(switched))
        why = f"GPU {which} it held on node {ev.node} changed MIG mode or model"
        interrupt_on(state, ctx, ev.node, switched, why, node_gone=False)


def _gpus_moved(state: State, ctx: Ctx, node: str, moved: dict[int, int | None]) -> None:
    """Jobs holding a GPU of ``node`` that is at another index now (``moved``: old index → new,
    None if it left the node): their claims follow it, so that what they give back is what they
    hold, and they are interrupted, since their workers were placed by indices that now name
    other GPUs (not one whose only ranks there a shrink already took away: they are leaving
    anyway, as ``interrupt_on`` has it)."""
    for job in indexes.holding_on(state, node):
        held = job.held
        hit = [w.rank for w in held.workers if w.node == node and _on(w, moved)] if held is not None else []
        if held is None or not hit:
            continue
        indexes.hold(state, job, _renumbered(held, node, moved))
        if job.placement is not None and job.placement.attempt == held.attempt:
            job.placement = _renumbered(job.placement, node, moved)
        if job.phase == "running" and set(hit) <= set(job.leaving):
            continue
        if job.phase in ("placed", "starting", "running", "checkpointing"):
            move(state, job, "interrupt", ctx)
            job.reasons = (Reason("interrupted", f"a GPU it held on node {node} left or was renumbered"),)
            indexes.explain(state, job)
        stop_holding(state, job, ctx)


def _kept_places_moved(state: State, node: str, moved: dict[int, int | None]) -> None:
    """The places kept across a shutdown of ``node`` (``JobState.kept_place``) follow its GPUs
    to their new indexes (``moved``: old index → new, None if it left the node), as claims do
    (``_gpus_moved``): held by their old indexes, the placer held other GPUs for the job, and
    gave the ones it had run on to whoever came next. A worker one of whose GPUs left keeps no place
    there (the placer finds it one). A job keeps a place only while interrupted, queued or
    admitted (placing, withdrawing or ending it forgets it): the jobs a place is held for are
    looked at (``State.places_held``), not every job waiting."""
    for job in indexes.places_held(state):
        kept = job.kept_place
        if kept is None or not any(w.node == node and _on(w, moved) for w in kept.workers):
            continue
        there = tuple(w for w in kept.workers if w.node != node or _stays(w, moved))
        indexes.keep_place(state, job, _renumbered(msgspec.structs.replace(kept, workers=there), node, moved))


def _stays(worker: WorkerSlot, moved: dict[int, int | None]) -> bool:
    return all(moved.get(c.gpu, c.gpu) is not None for c in worker.gpus)


def _on(worker: WorkerSlot, moved: dict[int, int | None]) -> bool:
    return any(c.gpu in moved for c in worker.gpus)


def _renumbered(placement: Placement, node: str, moved: dict[int, int | None]) -> Placement:
    workers = []
    for w in placement.workers:
        if w.node == node:
            gpus = []
            for c in w.gpus:
                to = moved.get(c.gpu, c.gpu)
                if to is not None:
                    gpus.append(c if to == c.gpu else msgspec.structs.replace(c, gpu=to))
            w = msgspec.structs.replace(w, gpus=tuple(gpus))
        workers.append(w)
    return msgspec.structs.replace(placement, workers=tuple(workers))


def _placed_job(state: State, ev: WorkerStarted | WorkerExited | CheckpointCompleted) -> JobState:
    job = state.jobs.get(ev.job_id)
    if job is None or ev.run and ev.run != job.submitted_seq:
        raise Refused("unknown", _no_job(ev), ev.job_id)
    if ev.attempt > job.attempt:
        raise Refused("illegal", f"job {job.id} has no attempt {ev.attempt} yet", job.id)
    return job


def _no_job(ev: WorkerStarted | WorkerExited | CheckpointCompleted) -> str:
    if ev.run:
        return f"no job {ev.job_id} of run {ev.run} (an earlier job of that id, let go)"
    return f"no job {ev.job_id}"


def _worker_started(state: State, ctx: Ctx, ev: WorkerStarted) -> None:
    job = state.jobs.get(ev.job_id)  # ``_placed_job``, on the hot path
    if job is None or ev.run and ev.run != job.submitted_seq:
        raise Refused("unknown", _no_job(ev), ev.job_id)
    if ev.attempt > job.attempt:
        raise Refused("illegal", f"job {job.id} has no attempt {ev.attempt} yet", job.id)
    rank = ev.rank
    placement = job.placement
    slot = None if placement is None else claims.slot_of(placement, rank)
    if ev.attempt != job.attempt or slot is None or slot.node != ev.node:
        raise Refused("illegal", f"job {job.id} has no rank {rank} on {ev.node} now", job.id)
    if job.phase == "running" and rank not in job.started:  # a rank an elastic job grew by
        job.started.add(rank)
        job.live.add(rank)
        job.left.discard(rank)
        job.updated_seq = ctx.seq
        return
    if job.phase not in ("placed", "starting"):
        raise IllegalTransition(job.phase, "start")
    job.started.add(rank)
    job.live.add(rank)
    if len(job.started) == len(placement.workers):  # type: ignore[union-attr]
        move_twice(state, job, "start", "run", ctx)  # the gang's last worker: it runs
    else:
        move(state, job, "start", ctx)


def _worker_exited(state: State, ctx: Ctx, ev: WorkerExited) -> None:
    job = state.jobs.get(ev.job_id)  # ``_placed_job``, on the hot path
    if job is None or ev.run and ev.run != job.submitted_seq:
        raise Refused("unknown", _no_job(ev), ev.job_id)
    if ev.attempt > job.attempt:
        raise Refused("illegal", f"job {job.id} has no attempt {ev.attempt} yet", job.id)
    if ev.attempt < job.attempt or job.phase in FINAL or job.phase in ("preempted", "interrupted"):
        # A straggler of an attempt already over: it only gives back what that attempt holds.
        # A rank of the same number in a newer attempt is another process on other GPUs.
        held = job.held
        if held is not None and held.attempt == ev.attempt:
            _ran_here(held, ev, job.id)
            faulted = _faulted(state, held, ev)
            job.live.discard(ev.rank)
            stop_holding(state, job, ctx)
            if faulted:  # a gang's second rank dying of its own GPU after the first
                _fail_gpus(state, ctx, ev, job.id, faulted)
        return
    rank = ev.rank
    live = job.live
    if rank not in live or rank not in job.started:  # live may hold an older attempt's rank
        raise Refused("illegal", f"rank {rank} of job {job.id} is not running", job.id)
    if job.placement is not None:
        _ran_here(job.placement, ev, job.id)
    node_fault = bool(ev.node_fault) and ev.code != 0 and not ev.stopped
    if not node_fault:
        _count_start_faults(state, ev.node, "")
    elif len(job.fault_nodes) < NODE_FAULTS_FREE:
        _count_start_faults(state, ev.node, job.id)
    # (A node's fault charged to the job, past its free ones, is taken for the job's doing: it
    # neither counts towards the node's quarantine nor ends the node's run.)
    live.discard(rank)
    job.updated_seq = ctx.seq
    # The GPU failed under it, as its agent saw: the GPU's failure, not the job's (the health
    # monitor says so too, a heartbeat later; a restart, or a beneficiary, placed there before
    # that would fail again).
    faulted = _faulted(state, job.placement, ev)
    adm = job.admission
    if job.phase == "running" and adm is not None and rank >= adm.replicas:
        left(state, job, rank, ctx)
        _release_if_over(state, job, ctx)  # the ranks it kept may have ended
    else:
        job.exit_codes[rank] = ev.code
        if job.phase == "checkpointing":
            if not live:
                move(state, job, "stop", ctx)
        elif ev.code == 0 and not ev.stopped and job.spec.restart_policy != "always":
            _succeed_if_done(state, job, ctx)
        elif node_fault and not faulted and len(job.fault_nodes) < NODE_FAULTS_FREE:
            # The node's failure, not the job's: back to its queue, no restart counted.
            job.fault_nodes = (*job.fault_nodes, ev.node)
            move(state, job, "interrupt", ctx)
            why = f"node {ev.node} could not start rank {rank}: {said_reason(ev.node_fault)}"
            job.reasons = (Reason("interrupted", why),)
            indexes.explain(state, job)
        elif node_fault and not faulted:
            # Nodes said so of this job's starts too often: its own doing, whatever they say.
            why = f"rank {rank} could not start on {ev.node} ({said_reason(ev.node_fault)})"
            _worker_failed(state, job, ctx, f"{why}, after {len(job.fault_nodes)} starts nodes failed")
        elif not faulted and ev.start_error and not ev.stopped:
            _worker_failed(state, job, ctx, f"rank {rank} could not start: {said_reason(ev.start_error)}")
        elif not faulted:
            _worker_failed(state, job, ctx, f"rank {rank} exited with code {ev.code}")
        _release_if_over(state, job, ctx)
    if faulted:
        _fail_gpus(state, ctx, ev, job.id, faulted)


# Starts of one job that nodes may fail for their own fault (``WorkerExited.node_fault``) before
# the next is charged to the job: an honest node's fault costs a job nothing, but a job that
# makes every node it lands on fail its start (links planted in its own directories) is not
# requeued for ever, free, on node after node.
NODE_FAULTS_FREE = 3
# The jobs a node's run of failed starts is counted in (``NodeState.start_faults``).
START_FAULTS_KEPT = 8


def _count_start_faults(state: State, node: str, job_id: str) -> None:
    """A worker's exit on ``node``: a start it failed for its own fault, of job ``job_id``, or
    (``job_id`` empty) a worker that ran there, which ends the run of faults. The run counts
    each job once: the health monitor takes a node out of placement where ``QUARANTINE_AFTER``
    jobs' starts failed in a row, which one job, failing its own starts, cannot make."""
    ns = state.nodes.get(node)
    if ns is None:
        return
    if not job_id:
        ns.start_faults = ()
    elif job_id not in ns.start_faults:
        ns.start_faults = (*ns.start_faults[-(START_FAULTS_KEPT - 1) :], job_id)


def _fail_gpus(state: State, ctx: Ctx, ev: WorkerExited, job_id: str, faulted: dict[int, str]) -> None:
    """As the monitor's verdict does: the GPUs are failed, the jobs on them interrupted (the one
    whose worker died of it too, without counting a restart; one only leaving them runs on)."""
    node = state.nodes[ev.node]
    for i, signal in faulted.items():
        node.gpus[i].healthy, node.gpus[i].signal = False, signal
    which = ", ".join(f"GPU {i} ({s})" for i, s in sorted(faulted.items()))
    why = f"{which} of {ev.node} failed: a worker of {job_id} died of it"
    interrupt_on(state, ctx, ev.node, set(faulted), why, node_gone=False)


def _faulted(state: State, placement: Placement | None, ev: WorkerExited) -> dict[int, str]:
    """The GPUs of the exited rank in ``placement`` on its node that an XID its agent saw says
    are at fault (``xids.hardware``), by index, with the signal: for a failed exit corral did not
    stop, an XID named by the UUID of one of the rank's GPUs as the node has them (a report
    about another GPU is not taken from an exit)."""
    if not ev.xids or ev.code == 0 or ev.stopped:  # every exit asks: the common answer first
        return {}
    node = state.nodes.get(ev.node)
    if node is None or placement is None:
        return {}
    slot = claims.slot_of(placement, ev.rank)
    mine = {c.gpu for c in slot.gpus} if slot is not None else set()
    out: dict[int, str] = {}
    for x in ev.xids:
        if xids.hardware(x.xid):
            i = next((i for i in mine if 0 <= i < len(node.gpus) and node.gpus[i].info.uuid == x.uuid), None)
            if i is not None and i not in out:
                out[i] = f"xid:{x.xid}"
    return out


# The phases a job whose workers have all exited may still be in only because some of its ranks
# are yet to start (the gang's others, or ranks a growth added): its GPUs are theirs.
_TO_START: frozenset[Phase] = frozenset({"placed", "starting", "running"})


def _release_if_over(state: State, job: JobState, ctx: Ctx) -> None:
    """Give back the GPUs of a job whose last worker has gone, unless ranks of its placement are
    still to start there: a gang's rank that ended before another started, or a grown job's
    kept ranks ending before the added ones started, leave their GPUs held for those."""
    if job.held is not None and not job.live and job.phase not in _TO_START:
        release(state, job, ctx)


def _ran_here(placement: Placement, ev: WorkerExited, job_id: str) -> None:
    """An exit is its node's to report: a rank placed on another node is not this agent's."""
    w = claims.slot_of(placement, ev.rank)
    if w is not None and w.node != ev.node:
        raise Refused("illegal", f"rank {ev.rank} of job {job_id} is not on {ev.node}", job_id)


def _succeed_if_done(state: State, job: JobState, ctx: Ctx) -> None:
    """A job whose every rank has exited 0 has succeeded."""
    codes = job.exit_codes
    n = len(job.placement.workers) if job.placement is not None else 0
    if len(codes) == n and not any(codes.values()):
        move(state, job, "succeed", ctx)
        runtimes.learn(state, job)


def left(state: State, job: JobState, rank: int, ctx: Ctx) -> None:
    """A rank an elastic job shrank away from is gone: its GPUs are free, whatever its code;
    once the last of them is gone, the shrink is over, and a job whose kept ranks had all ended
    has succeeded and gives the rest back."""
    claims.release_rank(state, job, rank)
    gpu_time.track(state, job, ctx.time)
    job.exit_codes.pop(rank, None)
    job.started.discard(rank)
    job.left.add(rank)  # its agent may forget the process: a growth starts the rank anew
    if job.placement is not None and job.held is not None:
        job.placement = job.held
    if not job.leaving:
        indexes.name(state, job, "")
        job.preempt_deadline = 0.0
        if job.exit_codes and job.spec.restart_policy != "always":  # the ranks it kept had ended
            _succeed_if_done(state, job, ctx)
            _release_if_over(state, job, ctx)


def _worker_failed(state: State, job: JobState, ctx: Ctx, why: str) -> None:
    """A gang with a dead worker is broken: restart it whole, or fail it when out of restarts."""
    if job.spec.restart_policy != "never" and job.restarts < job.spec.max_restarts:
        job.restarts += 1
        move(state, job, "interrupt", ctx)
        job.reasons = (Reason("restarting", f"{why}; restart {job.restarts}"),)
        indexes.explain(state, job)
    else:
        move(state, job, "fail", ctx)
        job.reasons = (Reason("failed", f"{why}; no restarts left"),)
        indexes.explain(state, job)


def _checkpointed(state: State, ctx: Ctx, ev: CheckpointCompleted) -> None:
    job = _placed_job(state, ev)
    # The agent checks what its workers wrote; the fold checks what any agent sent.
    why = location_problem(ev.location)
    if why is not None:
        raise Refused("malformed", f"job {job.id}: {why}", job.id)
    # A checkpoint is its node's to report, as an exit is: the attempt must have a worker there,
    # or any agent could point another node's job at a location of its choosing. Its workers
    # report their last checkpoint before their exits, so the attempt still holds its GPUs when
    # a late one (a worker saving as it is stopped) is folded.
    where = job.placement if job.placement is not None and job.placement.attempt == ev.attempt else None
    if where is None and job.held is not None and job.held.attempt == ev.attempt:
        where = job.held
    if where is None and ev.attempt < job.attempt:
        # A straggler of an attempt over and holding nothing (its node lost, a worker still
        # saving until its agent stopped it): a late fact about work the job has moved on from,
        # taken as a straggler's exit is, changing nothing; not a node's report out of turn.
        return
    if where is None or all(w.node != ev.node for w in where.workers):
        raise Refused("illegal", f"job {job.id} has no worker of attempt {ev.attempt} on {ev.node}", job.id)
    # A late checkpoint, after the job ended, is a late fact, not a wrong one, and is kept; the
    # job's phase does not change.
    if job.checkpoint is None or ev.step >= job.checkpoint.step:
        job.checkpoint = Checkpoint(ev.location, ev.step, ev.attempt, ctx.seq, ctx.time)
        job.updated_seq = ctx.seq


def interrupt_on(
    state: State,
    ctx: Ctx,
    node: str,
    gpus: AbstractSet[int] | None,
    why: str,
    node_gone: bool = True,
    code: str = "interrupted",
) -> None:
    """Jobs holding GPUs on ``node`` (only those of ``gpus`` if given) lost them: their workers
    there are gone, and the job goes back to its queue (not counted against its restarts). It
    costs the jobs on the node, in submission order (``indexes.holding_on``). ``code`` is their
    reason's: ``SHUT_DOWN`` where a planned shutdown stopped them."""
    for job in indexes.holding_on(state, node):
        if job.held is None:
            continue
        hit = [
            w.rank
            for w in job.held.workers
            if w.node == node and (gpus is None or any(c.gpu in gpus for c in w.gpus))
        ]
        if not hit:
            continue
        gone = gpus is None and node_gone  # the node is lost: its workers are gone with it
        if job.phase == "running" and set(hit) <= set(job.leaving):
            # Only ranks a shrink already took away: the job runs on without them. Lost with
            # their node, they have left; else their exits, on their way, give the GPUs back.
            for rank in hit if gone else ():
                job.live.discard(rank)
                left(state, job, rank, ctx)
            continue
        if gone:
            for rank in hit:
                job.live.discard(rank)
        if job.phase in ("placed", "starting", "running", "checkpointing"):
            move(state, job, "interrupt", ctx)
            job.reasons = (Reason(code, why),)
            indexes.explain(state, job)
        stop_holding(state, job, ctx)


def _shutdown(state: State, ctx: Ctx, ev: NodeShutdown) -> None:
    """The node's agent is stopping its workers because it was told to: its jobs go back to
    their queue without counting a restart and resume from their last checkpoint. Only the jobs
    holding GPUs on this node (the subject binds the agent to it); their GPUs are given back as
    the workers' exits come (the node is not gone: its processes may still be using them). An
    exit folded before it counts as ever; after it, it is a straggler of an attempt over. The
    node takes no new work until its agent registers it again (``_registered``), where the
    agent says it will (``registers_again``): its heartbeats stop only as the agent exits, and
    the health monitor calls it lost a minute later."""
    node = find_node(state, ev.node)
    # It becomes the reason of every job interrupted, whichever tenant's: kept as a tenant's is.
    reason = said_reason(ev.reason)
    why = f"node {ev.node} shut down" + (f": {reason}" if reason else "")
    # The work it ran keeps its place for the agent's return (``JobState.kept_place``): placed
    # or running, not stopping for a preemption or a drain.
    here = indexes.holding_on(state, ev.node) if ev.registers_again else []
    keep = {j.id: _place_kept(j) for j in here if _keeps(j)}
    interrupt_on(state, ctx, ev.node, None, why, node_gone=False, code=SHUT_DOWN)
    for job_id, place in keep.items():
        job = state.jobs[job_id]
        if job.phase == "interrupted":
            indexes.keep_place(state, job, place)
    if ev.registers_again:
        node.shut_down = ctx.seq


def _keeps(job: JobState) -> bool:
    return job.phase in ("placed", "starting", "running") and job.placement is not None


def _place_kept(job: JobState) -> Placement:
    """Its placement, less the ranks a shrink took away (they were leaving)."""
    assert job.placement is not None
    leaving = job.leaving
    if not leaving:
        return job.placement
    kept = tuple(w for w in job.placement.workers if w.rank not in leaving)
    return msgspec.structs.replace(job.placement, workers=kept)


def _condition(state: State, ctx: Ctx, ev: NodeConditionChanged) -> None:
    node = find_node(state, ev.node)
    node.condition = ev.condition
    if ev.condition == "lost":
        interrupt_on(state, ctx, ev.node, None, f"node {ev.node} lost: {ev.reason}")


def _gpu_health(state: State, ctx: Ctx, ev: GpuHealthChanged) -> None:
    node = find_node(state, ev.node)
    if not 0 <= ev.gpu < len(node.gpus):
        if ev.uuid:  # judged on the node's GPUs before it registered again with fewer
            raise Refused("void", f"node {ev.node} has no GPU {ev.gpu} now (it was {ev.uuid})")
        raise Refused("unknown", f"node {ev.node} has no GPU {ev.gpu}")
    g = node.gpus[ev.gpu]
    if ev.uuid and ev.uuid != g.info.uuid:
        # Judged on the node's GPUs before it registered again: the index names another GPU now.
        raise Refused("void", f"GPU {ev.gpu} of {ev.node} is {g.info.uuid} now, not {ev.uuid}")
    g.healthy, g.signal = ev.healthy, ev.signal
    if not ev.healthy:
        interrupt_on(state, ctx, ev.node, {ev.gpu}, f"GPU {ev.gpu} of {ev.node}: {ev.signal}")


def _cordoned(state: State, ctx: Ctx, ev: NodeCordoned) -> None:
    # The health monitor only ever cordons. Lifting a cordon is the admin's (``CordonNode``):
    # a node's own agent, which may write on the node's subject too, must not undo a drain.
    if not ev.cordoned:
        raise Refused("forbidden", f"only the admin lifts the cordon of node {ev.node}: corral node uncordon")
    drain = ev.drain or find_node(state, ev.node).draining  # nor ends a drain under way
    cordon(state, ctx, ev.node, ev.cordoned, drain, ev.reason or "cordoned by the health monitor")


def cordon(state: State, ctx: Ctx, name: str, cordoned: bool, drain: bool, why: str) -> None:
    """No new work lands on a cordoned node; draining one also sends its work elsewhere
    (``drain``)."""
    node = find_node(state, name)
    node.cordoned = cordoned
    node.draining = cordoned and drain
    node.cordon_reason = said_reason(why) if cordoned else ""
    if not cordoned:
        node.start_faults = ()  # a person looked at it: its run of failed starts is forgotten
    if node.draining:
        drain_jobs(state, ctx, name, f"node {name} is draining: {why}")


def drain_jobs(state: State, ctx: Ctx, node: str, why: str) -> None:
    """The jobs on a draining node leave it as a preemption's victims do: each is asked to
    checkpoint, given its own grace, at most its queue's ``max_grace_seconds``
    (``preemption.drain_grace_s``), then stopped by its agent, and resumes elsewhere from that
    checkpoint. Stopped at once, a job that checkpoints when asked resumed from its last periodic
    checkpoint, or from the start. A drain is not one of the scheduler's preemptions
    (``JobState.preemptions``, which the anti-thrash limit counts) and stops no job for another:
    a beneficiary it named earlier is forgotten, else admission held that job back for it. A job
    already checkpointing keeps its deadline. One whose only ranks there a shrink already took
    away runs on: they are leaving anyway, as ``interrupt_on`` has it."""
    for job in indexes.holding_on(state, node):
        held = job.held
        if held is None or job.phase not in ("placed", "starting", "running"):
            continue
        here = [w.rank for w in held.workers if w.node == node]
        if not here or job.phase == "running" and set(here) <= set(job.leaving):
            continue
        move(state, job, "preempt", ctx)
        indexes.name(state, job, "")
        job.preempt_deadline = ctx.time + preemption.drain_grace_s(state, job)
        job.reasons = (Reason("drained", why),)
        indexes.explain(state, job)
        if not job.live:
            move(state, job, "stop", ctx)
            stop_holding(state, job, ctx)


HANDLERS: dict[type[Event], Handler] = {
    NodeRegistered: _registered,
    WorkerStarted: _worker_started,
    WorkerExited: _worker_exited,
    CheckpointCompleted: _checkpointed,
    NodeConditionChanged: _condition,
    GpuHealthChanged: _gpu_health,
    NodeCordoned: _cordoned,
    NodeShutdown: _shutdown,
}
