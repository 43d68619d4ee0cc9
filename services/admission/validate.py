"""Request validation: whether a submitted job may ever wait in its queue.

``validate`` is pure and answers with the first problem found, as a Reason a person can act on,
or None. It checks, in order: the queue exists and admits the tenant (the tenant is the one the
fold took from the request's subject, never the payload), the priority class exists, sizes and
limits are sane, the job has something to run (a command or an image), the content it carries
is bounded, the gang could ever fit the queue's quota (nominal plus what it may borrow with the
whole tree idle), and some part of the cluster could host it
(``projections.placement.inventory``: the placer's own chain and gang search over an idle copy of
the nodes registered now, cordoned ones included, lost ones not). A job that passes may still
wait; a job that fails would wait forever, so it is rejected now.

A cluster with no node registered yet (still starting) has no inventory to judge by: jobs
submitted then are not refused for it, and wait until nodes register (admission holds back a
queued job no node can host).

A queue that does not exist and one that does not admit the tenant get the same answer, so a
tenant learns nothing of other tenants' queues by probing.
"""

from __future__ import annotations

from corral.events.base import Reason
from corral.events.jobs import (
    MAX_GPU_MODELS,
    MAX_REPLICAS,
    JobSpec,
    Resources,
    image_problem,
    mount_problem,
    run_problem,
)
from corral.events.nodes import labels_problem
from corral.projections import preemption, quota
from corral.projections.placement.inventory import Inventory
from corral.projections.quota import Ledger
from corral.projections.state import WHOLE, JobState, State

DEFAULT_PRIORITY_CLASS = "normal"  # value 0, available unless defined otherwise

MAX_GPUS_PER_WORKER = 64
MAX_CPU_MILLI = 1024 * 1000  # 1024 cores
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_NAME = 253
MAX_ARGS = 4096
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV = 1024
MAX_ENV_BYTES = 64 * 1024
MAX_MOUNTS = 64
MAX_PATH = 4096
MAX_IMAGE = 1024
MAX_GRACE_S = 24 * 3600.0
MAX_RESTARTS = 1000


def priority_value(state: State, name: str) -> int | None:
    """The value of priority class ``name``; None if it does not exist."""
    pc = state.priority_classes.get(name)
    if pc is not None:
        return pc.value
    return 0 if name == DEFAULT_PRIORITY_CLASS else None


def validate(
    state: State, job: JobState, ledger: Ledger | None = None, inventory: Inventory | None = None
) -> Reason | None:
    """The first reason ``job`` can never run as submitted, or None. Pass a ``ledger`` and an
    ``inventory`` built from ``state`` when validating many jobs: only the ledger's tree (not
    its usage) is consulted, and the inventory's verdicts are shared by jobs of one shape."""
    spec = job.spec
    q = state.queues.get(spec.queue)
    if q is None or (q.tenants and job.tenant not in q.tenants):
        open_ = sorted(n for n, s in state.queues.items() if not s.tenants or job.tenant in s.tenants)
        return Reason(
            "unknown-queue",
            f"queue {spec.queue} does not exist or does not admit tenant {job.tenant}; "
            + (f"queues open to {job.tenant}: {', '.join(open_)}" if open_ else "no queue admits it"),
        )
    if priority_value(state, spec.priority_class) is None:
        known = sorted({DEFAULT_PRIORITY_CLASS, *state.priority_classes})
        return Reason(
            "unknown-priority-class",
            f"priority class {spec.priority_class} does not exist; known: {', '.join(known)}",
        )
    why = _sizes(spec) or _bounds(spec)
    if why is not None:
        return Reason("invalid", why)
    if preemption.rides(job) and not quota.may_be_preempted(spec, state.priority_classes):
        return Reason(
            "invalid",
            "a job that asks for no GPU holds no quota, and GPU work of any queue may stop it for the "
            "CPU and memory it takes: it must be one that may be preempted (preemptible, in a class "
            "that may be)",
        )
    too_big = _fits_ever(ledger if ledger is not None else Ledger(state), spec)
    if too_big is not None:
        return too_big
    return (inventory if inventory is not None else Inventory(state)).never_fits(job)


def _sizes(spec: JobSpec) -> str | None:
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        return f"replicas must be 1..{MAX_REPLICAS}, not {spec.replicas}"
    lo = spec.min_replicas
    if lo is not None and not 1 <= lo <= spec.replicas:
        return f"min_replicas must be 1..replicas ({spec.replicas}), not {lo}"
    return _resources(spec.resources)


def _resources(res: Resources) -> str | None:
    if not 0 <= res.gpus <= MAX_GPUS_PER_WORKER:
        return f"gpus per worker must be 0..{MAX_GPUS_PER_WORKER}, not {res.gpus}"
    if not 1 <= res.gpu_milli <= WHOLE:
        return f"gpu_milli must be 1..{WHOLE}, not {res.gpu_milli}"
    if res.gpu_milli < WHOLE and res.gpus != 1:
        return f"a fraction of a GPU (gpu_milli {res.gpu_milli}) needs gpus = 1, not {res.gpus}"
    if len(res.gpu_models) > MAX_GPU_MODELS:
        return f"at most {MAX_GPU_MODELS} gpu_models, not {len(res.gpu_models)}"
    if res.mig is not None:
        if res.gpus != 1 or res.gpu_milli != WHOLE:
            return f"a MIG instance ({res.mig}) needs gpus = 1 and no gpu_milli"
        models = res.gpu_models or quota.MIG_MODELS
        if quota.mig_milli(res.mig, models) is None:
            return f"MIG profile {res.mig} exists on none of {', '.join(models)}"
    if not 1 <= res.cpu_milli <= MAX_CPU_MILLI:
        return f"cpu_milli must be 1..{MAX_CPU_MILLI}, not {res.cpu_milli}"
    if not 1 <= res.memory_mib <= MAX_MEMORY_MIB:
        return f"memory_mib must be 1..{MAX_MEMORY_MIB}, not {res.memory_mib}"
    if quota.ANY in res.gpu_models:
        # ``*`` is a quota's any model, no GPU's: leave gpu_models empty for any model.
        return f"gpu_models names GPU models; {quota.ANY!r} is none (leave gpu_models out for any model)"
    if res.min_gpu_memory_mib < 0:
        return "min_gpu_memory_mib must not be negative"
    return None


def _bounds(spec: JobSpec) -> str | None:
    """What a job carries into the log and onto nodes is bounded. (Each size is summed only
    when the field is set: most jobs leave most of them empty.)"""
    if len(spec.name) > MAX_NAME:
        return f"name is {len(spec.name)} characters; at most {MAX_NAME}"
    # What tables and logs print as it is may not carry control characters (a name that clears
    # an operator's terminal, or forges a line of ``corral jobs``). Commands and environment
    # values may: they go to a process, not to a screen.
    if not spec.name.isprintable():
        return "name has control characters"
    problem = run_problem(spec)
    if problem:
        return problem
    cmd = spec.command
    if cmd and (len(cmd) > MAX_ARGS or sum(map(len, cmd)) > MAX_COMMAND_BYTES):
        return f"command is too long: at most {MAX_ARGS} arguments and {MAX_COMMAND_BYTES} bytes"
    # What the node hands the kernel (arguments, environment, paths) cannot hold a NUL, nor a
    # variable's name an "=": such a job would be admitted, placed and hold its GPUs only to fail
    # to start on every node, restart after restart.
    if cmd and any("\0" in a for a in cmd):
        return "command: an argument has a NUL character, which no process can be given"
    if spec.image is not None:
        if not 0 < len(spec.image) <= MAX_IMAGE:
            return f"image must be 1..{MAX_IMAGE} characters"
        problem = image_problem(spec.image)
        if problem:
            return problem
    env = spec.env
    if env and (len(env) > MAX_ENV or sum(len(k) + len(v) for k, v in env.items()) > MAX_ENV_BYTES):
        return f"env is too large: at most {MAX_ENV} variables and {MAX_ENV_BYTES} bytes"
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            return (
                f"env: {k[:64]!r} is not a variable a process can be given (a name, without '=', and no NUL)"
            )
    for what, labels in (("labels", spec.labels), ("node_selector", spec.node_selector)):
        why = labels_problem(labels) if labels else None
        if why is not None:
            return f"{what}: {why}"
    mounts = spec.mounts
    if mounts and (
        len(mounts) > MAX_MOUNTS
        or any(not 0 < len(m.source) <= MAX_PATH or not 0 < len(m.target) <= MAX_PATH for m in mounts)
    ):
        return f"mounts: at most {MAX_MOUNTS}, each path 1..{MAX_PATH} characters"
    if mounts and any("\0" in m.source or "\0" in m.target for m in mounts):
        return "mounts: a path has a NUL character"
    for m in mounts:
        problem = mount_problem(m, container=spec.image is not None)
        if problem:
            return problem
    if not 0 <= spec.grace_seconds <= MAX_GRACE_S:
        return f"grace_seconds must be 0..{MAX_GRACE_S:.0f}, not {spec.grace_seconds}"
    if not 0 <= spec.max_restarts <= MAX_RESTARTS:
        return f"max_restarts must be 0..{MAX_RESTARTS}, not {spec.max_restarts}"
    if spec.runtime_estimate_s is not None and not spec.runtime_estimate_s > 0:
        return "runtime_estimate_s must be positive when given"
    return None


def _fits_ever(ledger: Ledger, spec: JobSpec) -> Reason | None:
    """A gang larger than anything its queue could hold, even with the whole tree idle, would
    wait forever: reject it and say how large it may be."""
    q = ledger.spec(spec.queue)
    lo = quota.min_replicas(spec)
    demands = quota.worker_demands(q, spec.resources)
    borrow = ledger.may_be_preempted(spec)  # a new job: preempted never yet
    if not demands or any(w * lo <= ledger.ceiling(spec.queue, k, borrow) for k, w in demands):
        return None
    res = spec.resources
    keys = [k for k, _ in demands]
    best = max((ledger.ceiling(spec.queue, k, borrow), -i, k) for i, k in enumerate(keys))
    ceiling, _, key = best
    name = quota.key_name(key)
    need = quota.fmt_gpus(quota.worker_milli(res, key) * lo)
    gang = f"{lo} workers need" if lo > 1 else "1 worker needs"
    if not ledger.listed(spec.queue, key):
        listed = sorted(q.quotas)
        hint = (
            f"set gpu_models to one of {', '.join(k for k in listed if k != quota.ANY)}"
            if any(k != quota.ANY for k in listed)
            else "ask an admin to give the queue a quota"
        )
        return Reason("no-quota", f"queue {spec.queue} has no quota for any GPU model ('*'); {hint}")
    nominal = ledger.nominal(spec.queue, key)
    limit = ledger.quota(spec.queue, key).borrowing_limit
    if not borrow:
        part = ledger.fixed_limit(spec.queue, key) - nominal
        share = f" + its part {quota.fmt_gpus(part)} of its cohort's own quota" if part else ""
        how = f"nominal {quota.fmt_gpus(nominal)}{share}: a job that may not be preempted does not borrow"
    elif ledger.cohort(spec.queue) is None:
        how = f"nominal {quota.fmt_gpus(nominal)}, no cohort to borrow from"
    elif limit is not None:
        how = f"nominal {quota.fmt_gpus(nominal)} + borrowing limit {limit}, as its cohort allows"
    else:
        how = f"nominal {quota.fmt_gpus(nominal)} + what its cohort can lend"
    return Reason(
        "never-fits",
        f"{gang} {need} {name} but queue {spec.queue} can hold at most "
        f"{quota.fmt_gpus(ceiling)} {name} ({how}); ask for at most {quota.fmt_gpus(ceiling)} "
        f"{name} in all, or use a queue with more quota",
    )
