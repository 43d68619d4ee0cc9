"""What-if: what corral would do with a job if it were submitted now, changing nothing.

The job's submission is folded into a copy of the live state, and the simulator goes on from
there with the services' own decision functions (``services/sim/eta.py``): so the answer is
exactly what corral would do if nothing else changed (no later submission; jobs end at their
runtime estimates). It says whether the job would be accepted, whether it is admitted and
placed at once (on which nodes and NVLink islands), and its forecast start. A job that needs
others stopped or shrunk is not placed at once: the preemptor only asks them to checkpoint and
leave by their grace deadline, and the fold gives their GPUs over once their workers have
exited. So its start is that deadline (where the admission, the placer and the preemptor
themselves expect those GPUs back, ``holds.expected_end``, and past which the agents stop what is
left), and the soonest it could start (``early``) is when the simulated agents, saving a
checkpoint in the time one takes, have stopped them. When it would not start soon, it tries the
smallest changes, each by running the same what-if: fewer workers, another queue open to the
tenant, a relaxed topology, a share of a GPU in place of a whole one or a MIG slice where a
node's GPUs are in MIG mode, and lists those that start at once.

Tenancy: the jobs it would stop are named only where the asker sees them, as ``corral jobs`` and
``explain`` do (its own; the admin, every job); another tenant's is "a job of queue X", or "a job
of another queue" where X is not open to the tenant; the reasons it waits name no other tenant's
job (``projections/visibility.py``). ``answer`` is what the forecast role sends the asker
(``corral whatif`` prints it with ``text``), plain data with nothing else of other tenants in it.
A question that names no id is asked under one no job holds (``free_id``): under a fixed one, a
tenant owning a job of that id would have every other tenant's what-if answered "not accepted:
the id is taken". One that names another tenant's id is asked the same way, as ``explain``
answers of another's job as of one never submitted: the answer is of the job, and says nothing of
whether some other tenant holds that id (a submission under it is refused, and the refusal is in
the log). The admin, who sees every job, is told the id is taken.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from corral.events import subjects
from corral.events.decisions import PreemptionRequested, ShrinkRequested
from corral.events.jobs import JobSpec, SubmitJob, Topology
from corral.projections import mig
from corral.projections.fold import apply_event
from corral.projections.shape import workers_text
from corral.projections.state import State
from corral.projections.visibility import queue_named, sees_job
from corral.services.forecast.present import SOON_S, text
from corral.services.sim import eta
from corral.services.sim.driver import SimConfig, SimRecord

HORIZON_S = eta.HORIZON_S
# The host seconds one what-if may simulate, its smaller asks included: a deep backlog made one
# take seconds, and a client that had given up left it running, holding one of the role's few
# places for questions (``forecast.service.MAX_WHATIFS``). Past it, the start is "not found".
BUDGET_S = 20.0


@dataclass
class Outcome:
    accepted: bool
    reason: str = ""
    start: float = math.inf
    early: float = math.inf  # the soonest it could start: its stops done sooner than their deadline
    now: float = 0.0
    placed: list[tuple[int, str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    why_waiting: str = ""
    cut: bool = False  # the simulation ran out of its host time (``BUDGET_S``) before the start

    @property
    def starts_now(self) -> bool:
        """Placed at once: stopping nobody, since a stop is only asked for now and its GPUs are
        given over once its workers have exited."""
        return self.accepted and not self.stops and self.start <= self.now + 1e-6


def whatif(
    state: State,
    tenant: str,
    job_id: str,
    spec: JobSpec,
    now: float,
    horizon_s: float = HORIZON_S,
    errors: eta.Errors | None = None,
    deadline: float | None = None,
) -> Outcome:
    """What corral would do with ``spec`` submitted by ``tenant`` at ``now``, every job run by
    ``errors`` as forecasts run them (``eta.Errors``); its start is looked for ``horizon_s``
    ahead (0: only whether it starts at once), until the host's ``perf_counter`` passes
    ``deadline``."""
    copy = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)
    now = max(now, copy.time)
    before = copy.rejected_total
    apply_event(
        copy,
        copy.seq + 1,
        subjects.request(tenant, "submit"),
        SubmitJob(request_id=job_id, job=spec),
        now,
        tenant,
    )
    if copy.rejected_total != before:
        return Outcome(False, copy.rejections[-1].message, now=now)
    # the same assumptions as every forecast (``eta.resumed``), from the state with the job in it
    sim = eta.resumed(copy, now, SimConfig(), until=now + horizon_s, errors=errors)
    sim.records = []
    sim.until_started = {job_id}  # the others' starts are not asked for
    sim.deadline = deadline
    sim.run(until=now)
    job = sim.state.jobs.get(job_id)
    if job is None or job.phase == "rejected":
        why = "; ".join(r.message for r in job.reasons) if job is not None else "let go"
        return Outcome(False, why, now=now)
    out = Outcome(True, now=now)
    out.why_waiting = "; ".join(r.message for r in job.reasons)

    def called(victim_id: str) -> str:  # by its id where the asker sees the job, else by its queue
        victim = state.jobs.get(victim_id)
        if victim is not None and sees_job(tenant, victim):
            return victim_id
        return f"a job of {_queue_called(state, victim.spec.queue if victim is not None else '', tenant)}"

    for r in sim.records:
        body = r.body
        if isinstance(body, PreemptionRequested) and body.beneficiary == job_id:
            out.stops.extend(called(v.job_id) for v in body.victims)
        elif isinstance(body, ShrinkRequested) and body.beneficiary == job_id:
            out.stops.append(f"{called(body.job_id)} (shrunk to {workers_text(body.replicas)})")
    if job.placement is not None and not out.stops:
        for w in job.placement.workers:
            node = sim.state.nodes[w.node]
            islands = tuple(sorted({node.gpus[c.gpu].info.island for c in w.gpus}))
            out.placed.append((w.rank, w.node, tuple(c.gpu for c in w.gpus), islands))
    first = sim.stats[job_id].first_start
    if first is None:
        sim.run(until=now + horizon_s)
        first = sim.stats[job_id].first_start
    out.early = math.inf if first is None else first
    stopped_by = max((_left_by(r, job_id) for r in sim.records), default=-math.inf)
    # The simulated agents stop a victim once it has saved a checkpoint in the time one takes
    # (at once if it cannot): a guess at how fast another's job checkpoints. Live, its workers
    # may take their whole grace, and its GPUs are given over only once they have exited.
    out.start = max(out.early, stopped_by)
    out.cut = sim.cut and out.start == math.inf
    return out


def changes(state: State, tenant: str, spec: JobSpec) -> Iterator[tuple[str, JobSpec]]:
    """Smaller asks, smallest change first: fewer workers, another queue, relaxed topology, a
    share of one GPU."""
    if spec.replicas > 1:
        n = spec.replicas
        while n > 1:
            n //= 2
            yield f"--replicas {n}", msgspec.structs.replace(spec, replicas=n, min_replicas=None)
    for name, q in sorted(state.queues.items()):
        if name != spec.queue and (not q.tenants or tenant in q.tenants):
            yield f"--queue {name}", msgspec.structs.replace(spec, queue=name)
    if spec.topology != Topology():
        yield "no topology constraint", msgspec.structs.replace(spec, topology=Topology())
    res = spec.resources
    if res.gpus > 1 and res.mig is None:
        yield (
            f"--gpus {res.gpus // 2}",
            msgspec.structs.replace(spec, resources=msgspec.structs.replace(res, gpus=res.gpus // 2)),
        )
    if res.gpus == 1 and res.mig is None and res.gpu_milli == 1000:
        half = msgspec.structs.replace(res, gpu_milli=500)
        yield "--gpu-milli 500 (half a GPU)", msgspec.structs.replace(spec, resources=half)
        for model, name in mig_slices(state, res.gpu_models):
            one = msgspec.structs.replace(res, mig=name, gpu_models=(model,))
            yield f"--mig {name} (a MIG slice of a {model})", msgspec.structs.replace(spec, resources=one)


def mig_slices(state: State, models: tuple[str, ...] = (), most: int = 2) -> list[tuple[str, str]]:
    """The largest MIG profiles (``most`` per model) of the GPU models some node has in MIG mode,
    of ``models`` when the job names some: a slice a whole-GPU job could make do with."""
    found = sorted(
        {
            g.info.model
            for n in state.nodes.values()
            for g in n.gpus
            if g.info.mig and (not models or g.info.model in models)
        }
    )
    out = []
    for model in found:
        named = sorted(mig.profiles(model).items(), key=lambda kv: (-kv[1].size, -kv[1].compute, kv[0]))
        out += [(model, name) for name, p in named if "+me" not in name][:most]
    return out


def suggestions(
    state: State,
    tenant: str,
    job_id: str,
    spec: JobSpec,
    now: float,
    most: int = 3,
    errors: eta.Errors | None = None,
    deadline: float | None = None,
) -> list[tuple[str, Outcome]]:
    """The changes that let the job start at once, each checked by running it, as many as the
    host's ``perf_counter`` before ``deadline`` allows."""
    out = []
    for what, changed in changes(state, tenant, spec):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        o = whatif(state, tenant, job_id, changed, now, 0.0, errors, deadline)  # does it start now?
        if o.starts_now:
            out.append((what, o))
            if len(out) >= most:
                break
    return out


def free_id(state: State) -> str:
    """An id for a what-if that names none: ``whatif``, or one like it, that no job holds."""
    job_id = "whatif"
    while job_id in state.jobs:
        job_id = f"whatif-{secrets.token_hex(4)}"
    return job_id


def answer(
    state: State, tenant: str, job_id: str, spec: JobSpec, now: float, errors: eta.Errors | None = None
) -> dict[str, Any]:
    """What the asker is told, as plain data: ``text`` turns it into what ``corral whatif`` prints.
    ``job_id`` "", or one another tenant holds: asked under one no job holds (``free_id``); the
    admin, who sees every job, is told the id is taken. It simulates ``BUDGET_S`` at most."""
    held = state.jobs.get(job_id)
    if not job_id or (held is not None and held.tenant != tenant and tenant != subjects.ADMIN):
        job_id = free_id(state)
    deadline = time.perf_counter() + BUDGET_S
    o = whatif(state, tenant, job_id, spec, now, errors=errors, deadline=deadline)
    told: dict[str, Any] = {"seq": state.seq, "now": o.now, "accepted": o.accepted}
    if not o.accepted:
        return {**told, "reason": o.reason}
    told |= {
        "starts_now": o.starts_now,
        "start": None if math.isinf(o.start) else o.start,
        "early": None if math.isinf(o.early) else o.early,
        "horizon_s": HORIZON_S,
        "cut_s": BUDGET_S if o.cut else None,
        "placed": [
            {"rank": rank, "node": node, "gpus": list(gpus), "islands": list(islands)}
            for rank, node, gpus, islands in o.placed
        ],
        "preempts": o.stops,
        "why_waiting": o.why_waiting,
        "assumption": eta.ASSUMPTION,
        "start_now_with": [],
    }
    if not o.starts_now and o.start > o.now + SOON_S:
        found = suggestions(state, tenant, job_id, spec, now, errors=errors, deadline=deadline)
        told["start_now_with"] = [what for what, _ in found]
    return told


def report(state: State, tenant: str, job_id: str, spec: JobSpec, now: float) -> str:
    """What ``corral whatif`` prints, from the state at hand (``corral whatif --log FILE``), run
    by the errors of the jobs it holds that succeeded."""
    return text(answer(state, tenant, job_id, spec, now, eta.Calibration.of(state).errors()))


def _left_by(record: SimRecord, job_id: str) -> float:
    """When the jobs ``record`` stops or shrinks for ``job_id`` must have left, in log time as the
    fold reads it (``fold_preemption.log_deadline``): the record asks for its victims' longest
    grace, and the fold gives each its own at most. ``-inf`` for any other record."""
    body = record.body
    if not isinstance(body, PreemptionRequested | ShrinkRequested) or body.beneficiary != job_id:
        return -math.inf
    return record.time + max(0.0, body.deadline - body.now)


def _queue_called(state: State, name: str, tenant: str) -> str:
    """``queue NAME`` where the queue is open to ``tenant``, else "another queue"."""
    called = queue_named(state.queues, name, tenant)
    return f"queue {called}" if called == name else called
