"""Wire format: JSON, so any NATS client in any language can publish and read corral's log.

Service events travel in an :class:`Envelope`; client requests travel bare on
``corral.in.<tenant>.<verb>`` (the verb picks the type, so a curl-level client need not know our
tags), with their metadata in NATS headers. Decoders are built once at import.

Schema evolution: fields are only added with defaults. A breaking change gets a new tag and an
upcaster registered in ``UPCASTERS`` that rewrites the old payload before it is decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from events import subjects
from events.base import Event
from events.decisions import JobsPlaced, JobsUnschedulable, PreemptionRequested
from events.jobs import (
    CancelJob,
    JobAccepted,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    PendingReasonChanged,
    ResizeJob,
    SubmitJob,
)
from events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from events.queues import ApplyCohort, ApplyPriorityClass, ApplyQueue, CordonNode, DeleteQueue

SCHEMA_VERSION = 1

AnyEvent = (
    SubmitJob
    | CancelJob
    | ResizeJob
    | ApplyQueue
    | ApplyCohort
    | ApplyPriorityClass
    | DeleteQueue
    | CordonNode
    | JobAccepted
    | JobRejected
    | PendingReasonChanged
    | JobsAdmitted
    | JobRequeued
    | JobsPlaced
    | JobsUnschedulable
    | PreemptionRequested
    | NodeRegistered
    | WorkerStarted
    | WorkerExited
    | CheckpointCompleted
    | NodeConditionChanged
    | GpuHealthChanged
    | NodeCordoned
)

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__

# The request type for each verb a client may publish on corral.in.<tenant>.<verb>.
TENANT_VERBS: dict[str, type[Event]] = {
    "submit": SubmitJob,
    "cancel": CancelJob,
    "resize": ResizeJob,
}
ADMIN_VERBS: dict[str, type[Event]] = {
    **TENANT_VERBS,
    "queue": ApplyQueue,
    "cohort": ApplyCohort,
    "priority-class": ApplyPriorityClass,
    "delete-queue": DeleteQueue,
    "cordon": CordonNode,
}


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Metadata every service event carries. ``type`` mirrors the body's tag so that a reader in
    another language can route without parsing the body; ``v`` is the body's schema version."""

    id: str
    type: str
    time: float
    producer: str
    body: AnyEvent
    v: int = SCHEMA_VERSION
    causation: str | None = None
    correlation: str | None = None
    traceparent: str | None = None


class DecodeError(ValueError):
    """A record that is not a corral event: ``code`` is ``malformed`` (does not parse) or
    ``unknown`` (a subject or verb corral does not take). The fold records it and moves on."""

    def __init__(self, message: str, code: str = "malformed") -> None:
        super().__init__(message)
        self.code = code


# type -> function rewriting a raw body dict of an older schema into the current one.
UPCASTERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}

_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(Envelope)
_raw_decoder = msgspec.json.Decoder(dict[str, Any])
_request_decoders = {verb: msgspec.json.Decoder(t) for verb, t in ADMIN_VERBS.items()}


def seal(
    body: Event,
    *,
    event_id: str,
    time: float,
    producer: str,
    causation: str | None = None,
    correlation: str | None = None,
    traceparent: str | None = None,
) -> Envelope:
    return Envelope(
        id=event_id,
        type=type(body).__name__,
        time=time,
        producer=producer,
        body=body,  # type: ignore[arg-type]
        causation=causation,
        correlation=correlation,
        traceparent=traceparent,
    )


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode_envelope(data: bytes) -> Envelope:
    try:
        return _envelope_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        upcast = _upcast(data)
        if upcast is None:
            raise DecodeError(str(exc)) from None
        return upcast


def _upcast(data: bytes) -> Envelope | None:
    try:
        raw = _raw_decoder.decode(data)
        body = raw.get("body")
        if not isinstance(body, dict):
            return None
        upcaster = UPCASTERS.get(str(body.get("type")))
        if upcaster is None:
            return None
        raw["body"] = upcaster(body)
        return msgspec.convert(raw, Envelope)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, KeyError):
        return None


def decode_request(verb: str, data: bytes) -> Event:
    """A bare request for ``verb``; its ``type`` field may be omitted."""
    decoder = _request_decoders.get(verb)
    if decoder is None:
        raise DecodeError(f"unknown verb {verb!r}", "unknown")
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(str(exc)) from None


class Decoded(NamedTuple):
    body: Event
    tenant: str | None  # set for a request: the tenant its subject names
    traceparent: str | None


def decode_body(subject: str, data: bytes, headers: dict[str, str] | None = None) -> Decoded:
    """Any record's event, with the tenant of a request and the trace it belongs to.

    Requests are checked against the verbs their tenant may use (admin verbs only for ``admin``).
    """
    if subject.startswith("corral.in."):
        parsed = subjects.parse_request(subject)
        if parsed is None:
            raise DecodeError(f"not a request subject: {subject}", "unknown")
        tenant, verb = parsed
        verbs = ADMIN_VERBS if tenant == subjects.ADMIN else TENANT_VERBS
        if verb not in verbs:
            raise DecodeError(f"tenant {tenant} may not {verb!r}", "unknown")
        trace = headers.get("traceparent") if headers else None
        return Decoded(decode_request(verb, data), tenant, trace)
    if subject.startswith("corral.ev."):
        env = decode_envelope(data)
        return Decoded(env.body, None, env.traceparent)
    raise DecodeError(f"subject {subject} is not corral's", "unknown")
