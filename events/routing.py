"""Where each service event lives in the log, and which jobs it speaks about.

A service event sits on the subject of the entity it is about (``corral.ev.job.<id>``,
``corral.ev.node.<node>``) or on its writer role's decision subject. NATS permissions bind each
writer to its subjects; the fold checks that an event's fields agree with its subject, which binds
the writer to those entities too.
"""

from __future__ import annotations

from corral.events import subjects
from corral.events.base import Event
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
    ResizeJob,
    SubmitJob,
)
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

# event type -> (subject kind, the field naming the key, or "=<role>" for a decision subject)
HOME: dict[type[Event], tuple[str, str]] = {
    JobAccepted: ("job", "job_id"),
    JobPriorityChanged: ("job", "job_id"),
    JobRejected: ("job", "job_id"),
    PendingReasonChanged: ("job", "job_id"),
    JobRequeued: ("job", "job_id"),
    AdmissionWithdrawn: ("job", "job_id"),
    JobsAdmitted: ("decision", "=admission"),
    JobsPlaced: ("decision", "=placer"),
    JobsUnschedulable: ("decision", "=placer"),
    PreemptionRequested: ("decision", "=preemptor"),
    ShrinkRequested: ("decision", "=preemptor"),
    NodeRegistered: ("node", "node"),
    WorkerStarted: ("node", "node"),
    WorkerExited: ("node", "node"),
    CheckpointCompleted: ("node", "node"),
    NodeConditionChanged: ("node", "node"),
    GpuHealthChanged: ("node", "node"),
    NodeCordoned: ("node", "node"),
    NodeShutdown: ("node", "node"),
}


# event type -> (the subject it must be written on, None) for a decision subject, or (the subject's
# prefix, the field naming its key): the fold checks each event's subject against it.
WRITTEN_ON: dict[type[Event], tuple[str, str | None]] = {
    t: (f"{subjects.EV}.{kind}.{field[1:]}", None)
    if field.startswith("=")
    else (f"{subjects.EV}.{kind}.", field)
    for t, (kind, field) in HOME.items()
}


def home(body: Event) -> tuple[str, str] | None:
    """(kind, key) of the subject ``body`` must be written on; None for requests."""
    place = HOME.get(type(body))
    if place is None:
        return None
    kind, field = place
    return kind, field[1:] if field.startswith("=") else getattr(body, field)


def subject_of(body: Event) -> str:
    place = home(body)
    if place is None:
        raise ValueError(f"{type(body).__name__} is a request; requests go on corral.in.<tenant>.<verb>")
    return f"{subjects.EV}.{place[0]}.{place[1]}"


def job_ids(body: Event) -> list[str]:
    """Every job an event or request names, in the order it names them."""
    match body:
        case SubmitJob():
            return [body.request_id]
        case CancelJob() | ResizeJob():
            return [body.job_id]
        case JobsAdmitted():
            return [a.job_id for a in (*body.admissions, *body.growths)]
        case JobsPlaced():
            return [p.job_id for p in body.placements]
        case JobsUnschedulable():
            return [u.job_id for u in body.jobs]
        case PreemptionRequested():
            return [body.beneficiary, *(v.job_id for v in body.victims)]
        case ShrinkRequested():
            return [body.beneficiary, body.job_id]
    job_id = getattr(body, "job_id", None)
    return [job_id] if isinstance(job_id, str) else []
