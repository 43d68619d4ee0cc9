"""One line per log record, in an operator's words: what `corral demo` and `corral watch` print."""

from __future__ import annotations

from corral.events import codec
from corral.events.base import Event
from corral.events.codec import DecodeError
from corral.events.decisions import JobsPlaced, JobsUnschedulable, PreemptionRequested, ShrinkRequested
from corral.events.jobs import (
    AdmissionWithdrawn,
    CancelJob,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
    SubmitJob,
)
from corral.events.log import Record
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    NodeShutdown,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CordonNode,
    DeleteCohort,
    DeleteNode,
    DeletePriorityClass,
    DeleteQueue,
    RetentionSpec,
)
from corral.projections.shape import Shape


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n != 1 else "")


def describe(body: Event, tenant: str | None = None) -> str:
    match body:
        case SubmitJob(request_id=jid, job=spec):
            r = spec.resources
            worker = Shape.of(r)
            size = (
                f"MIG {r.mig}"
                if worker.kind == "mig"
                else f"{r.gpu_milli / 1000:g} GPU"
                if worker.kind == "fraction"
                else _gpus(r.gpus)
            )
            return f"{tenant} submits {jid}: {spec.replicas} × {size} in queue {spec.queue}"
        case CancelJob(job_id=jid):
            return f"{tenant} cancels {jid}"
        case ApplyQueue(queue=q):
            quota = ", ".join(f"{m}: {v.nominal}" for m, v in q.quotas.items()) or "no quota"
            return f"admin applies queue {q.name} (cohort {q.cohort or '-'}, {quota})"
        case ApplyCohort(cohort=c):
            return f"admin applies cohort {c.name}" + (f" under {c.parent}" if c.parent else "")
        case ApplyPriorityClass(priority_class=p):
            return f"admin applies priority class {p.name} = {p.value}"
        case ApplyFairShare(fair_share=f):
            lane = f", short jobs up to {f.short_job_gpu_s:g} GPU-s first" if f.short_job_gpu_s else ""
            return f"admin sets the fair-share half-life to {f.half_life_s:g} s{lane}"
        case ApplyRetention(retention=r):
            usual = r.jobs_per_tenant == RetentionSpec().jobs_per_tenant
            most = "" if usual else f", at most {r.jobs_per_tenant} jobs a tenant"
            if r.spec_bytes_per_tenant != RetentionSpec().spec_bytes_per_tenant:
                most += f", their specs at most {r.spec_bytes_per_tenant} bytes"
            return f"admin keeps finished jobs {r.finished_s:g} s in the state{most}"
        case JobAccepted(job_id=jid, priority=prio):
            return f"admission accepts {jid} (priority {prio})"
        case JobPriorityChanged(job_id=jid, priority=prio, reason=r):
            return f"{jid} moves to priority {prio}: {r.message}"
        case JobRejected(job_id=jid, reason=r):
            return f"admission rejects {jid}: {r.message}"
        case PendingReasonChanged(job_id=jid, reasons=rs):
            return f"{jid} waits: " + "; ".join(r.message for r in rs)
        case JobsAdmitted(admissions=adms, growths=grown):
            said = [f"admits {', '.join(f'{a.job_id}×{a.replicas}' for a in adms)}"] if adms else []
            said += [f"grows {', '.join(f'{a.job_id} to ×{a.replicas}' for a in grown)}"] if grown else []
            return "admission " + "; ".join(said)
        case AdmissionWithdrawn(job_id=jid, reason=r) if r.code == "growth-timeout":
            return f"admission withdraws {jid}'s growth: {r.message}"
        case AdmissionWithdrawn(job_id=jid, reason=r):
            return f"admission withdraws {jid}'s admission, back to its queue: {r.message}"
        case JobRequeued(job_id=jid, resume_from=ck):
            return f"{jid} goes back to its queue" + (f", resuming from {ck}" if ck else "")
        case JobsPlaced(placements=ps):
            return "placer places " + ", ".join(
                f"{p.job_id} on {','.join(sorted({w.node for w in p.workers}))}" for p in ps
            )
        case JobsUnschedulable(jobs=js):
            return "placer cannot place " + "; ".join(
                f"{u.job_id} ({u.reasons[0].message if u.reasons else '?'})" for u in js
            )
        case PreemptionRequested(beneficiary=b, victims=vs):
            return f"preemptor asks {', '.join(v.job_id for v in vs)} to checkpoint and stop, for {b}"
        case ShrinkRequested(job_id=jid, replicas=n, beneficiary=b):
            return f"preemptor asks {jid} to shrink to {n} workers, for {b}"
        case NodeRegistered(node=n, inventory=inv):
            models = sorted({g.model for g in inv.gpus})
            return f"node {n} registers {len(inv.gpus)} × {','.join(models) or 'no GPU'}"
        case WorkerStarted(node=n, job_id=jid, rank=rank, failed=True):
            return f"{jid} rank {rank} could not start on {n}"
        case WorkerStarted(node=n, job_id=jid, rank=rank):
            return f"{jid} rank {rank} starts on {n}"
        case WorkerExited(node=n, job_id=jid, rank=rank, code=code):
            return f"{jid} rank {rank} exits {code} on {n}"
        case CheckpointCompleted(job_id=jid, step=step, location=loc):
            return f"{jid} checkpointed step {step} to {loc}"
        case NodeShutdown(node=n, reason=why):
            return f"node {n} shuts down, its workers stopped" + (f": {why}" if why else "")
        case NodeConditionChanged(node=n, condition=c, reason=why):
            return f"node {n} is {c}" + (f": {why}" if why else "")
        case GpuHealthChanged(node=n, gpu=g, healthy=ok, signal=sig):
            return f"GPU {g} of {n} is {'healthy' if ok else 'unhealthy'}" + (f" ({sig})" if sig else "")
        case NodeCordoned(node=n, cordoned=c, drain=d) | CordonNode(node=n, cordoned=c, drain=d):
            by = " by the admin" if isinstance(body, CordonNode) else ""
            fixed = ", its GPUs repaired" if isinstance(body, CordonNode) and body.repaired else ""
            return f"node {n} {'cordoned' if c else 'uncordoned'}{by}" + (
                " and draining" if c and d else fixed
            )
        case DeleteQueue(name=name):
            return f"queue {name} deleted by the admin"
        case DeleteCohort(name=name):
            return f"cohort {name} deleted by the admin"
        case DeletePriorityClass(name=name):
            return f"priority class {name} deleted by the admin"
        case DeleteNode(node=n):
            return f"node {n} deleted by the admin"
    return type(body).__name__


def line(record: Record) -> str:
    try:
        decoded = codec.decode_body(record.subject, record.data)
        return describe(decoded.body, decoded.tenant)
    except DecodeError as e:
        return f"unreadable record on {record.subject}: {e}"
