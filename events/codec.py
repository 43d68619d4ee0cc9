"""Wire format: JSON, so any NATS client in any language can publish and read corral's log.

Service events travel in an :class:`Envelope`; client requests travel bare on
``corral.in.<tenant>.<verb>`` (the verb picks the type, so a curl-level client need not know our
tags), with their metadata in NATS headers. Decoders are built once at import.

Schema evolution: fields are only added with defaults. A breaking change gets a new tag and an
upcaster registered in ``UPCASTERS`` that rewrites the old payload before it is decoded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec

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
)

SCHEMA_VERSION = 1

AnyEvent = (
    SubmitJob
    | CancelJob
    | ResizeJob
    | ApplyQueue
    | ApplyCohort
    | ApplyPriorityClass
    | DeleteQueue
    | DeleteCohort
    | DeletePriorityClass
    | CordonNode
    | DeleteNode
    | ApplyFairShare
    | ApplyRetention
    | JobAccepted
    | JobPriorityChanged
    | JobRejected
    | PendingReasonChanged
    | JobsAdmitted
    | JobRequeued
    | AdmissionWithdrawn
    | JobsPlaced
    | JobsUnschedulable
    | PreemptionRequested
    | ShrinkRequested
    | NodeRegistered
    | WorkerStarted
    | WorkerExited
    | CheckpointCompleted
    | NodeConditionChanged
    | GpuHealthChanged
    | NodeCordoned
    | NodeShutdown
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
    "delete-cohort": DeleteCohort,
    "delete-priority-class": DeletePriorityClass,
    "cordon": CordonNode,
    "delete-node": DeleteNode,
    "fair-share": ApplyFairShare,
    "retention": ApplyRetention,
}


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Metadata every service event carries. ``type`` mirrors the body's tag so that a reader in
    another language can route without parsing the body; ``v`` is the body's schema version (a
    reader refuses a record of a newer one than it knows, never guesses at it); ``rules`` is the
    version of the fold's rules its writer decided under (0: not recorded).
    (Untracked by the cyclic garbage collector, like the events: it never holds a cycle.)"""

    id: str
    type: str
    time: float
    producer: str
    body: AnyEvent
    v: int = SCHEMA_VERSION
    rules: int = 0
    causation: str | None = None
    correlation: str | None = None
    traceparent: str | None = None


# What a decoder raises on bytes it cannot make one of corral's types of. RecursionError too: a
# JSON document nested a few thousand levels deep (in any field, known or not, since msgspec
# walks skipped values as well) exhausts the interpreter's recursion limit inside msgspec.
UNREADABLE: tuple[type[Exception], ...] = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


class DecodeError(ValueError):
    """A record that is not a corral event: ``code`` is ``malformed`` (does not parse) or
    ``unknown`` (a subject or verb corral does not take). The fold records it and moves on."""

    def __init__(self, message: str, code: str = "malformed") -> None:
        super().__init__(message)
        self.code = code


# Every escape of a JSON text, so that one read in order pairs each backslash with what follows it
# (``\\ud800`` in a JSON text is a backslash and "ud800", not a surrogate).
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def unreadable(exc: Exception, data: bytes) -> str:
    """What is wrong with ``data``, which did not decode (``exc``), in words its sender can act
    on. A string holding half of a UTF-16 surrogate pair (``"\\ud800"``) is no character, and
    msgspec says of one near the end that the input "was truncated": sent whole, its sender
    would look for what cut it."""
    said = str(exc)
    if "truncated" in said or "surrogate" in said:
        lone = _lone_surrogate(data)
        if lone is not None:
            at, escape = lone
            return (
                f"JSON is malformed: {escape} at byte {at} is half of a UTF-16 surrogate pair "
                "without its other half, which is no character"
            )
    return said


def _lone_surrogate(data: bytes) -> tuple[int, str] | None:
    """Where the first escape of half a surrogate pair without its other half is, and it."""
    high: re.Match[bytes] | None = None
    for m in _ESCAPE.finditer(data):
        code = int(m[1], 16) if m[1] is not None else -1
        if high is not None:
            if 0xDC00 <= code <= 0xDFFF and m.start() == high.end():
                high = None
                continue
            break
        if 0xD800 <= code <= 0xDBFF:
            high = m
        elif 0xDC00 <= code <= 0xDFFF:
            return m.start(), m[0].decode()
    return None if high is None else (high.start(), high[0].decode())


# type -> function rewriting a raw body dict of an older schema into the current one.
UPCASTERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}

_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(Envelope)
# An envelope of the current schema, with msgspec's own errors and no upcasting: for a reader that
# takes ``decode_envelope``'s path only when this one fails (the fold, once per record).
decode_current_envelope: Callable[[bytes], Envelope] = _envelope_decoder.decode
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
    rules: int = 0,
) -> Envelope:
    return Envelope(
        id=event_id,
        type=type(body).__name__,
        time=time,
        producer=producer,
        body=body,  # type: ignore[arg-type]
        rules=rules,
        causation=causation,
        correlation=correlation,
        traceparent=traceparent,
    )


# What the items of one decision event (a placer cycle's placements, the jobs it explains) may
# take, encoded: NATS carries 1 MiB a message by default, and a cycle after a burst or a
# failover decides for thousands of jobs at once. Room is left for the envelope around them.
EVENT_BYTES = 256 * 1024
T = TypeVar("T")


def by_size(items: Sequence[T], budget: int | None = None) -> Iterator[tuple[T, ...]]:
    """``items`` in order, in runs whose encodings take at most ``budget`` bytes together
    (``EVENT_BYTES`` by default; an item larger than that alone in its run): one decision event
    per run."""
    if budget is None:
        budget = EVENT_BYTES
    run: list[T] = []
    size = 0
    for item in items:
        n = len(_encoder.encode(item)) + 1
        if run and size + n > budget:
            yield tuple(run)
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield tuple(run)


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode_envelope(data: bytes) -> Envelope:
    try:
        env = _envelope_decoder.decode(data)
    except UNREADABLE as exc:
        upcast = _upcast(data)
        if upcast is None:
            raise DecodeError(unreadable(exc, data)) from None
        env = upcast
    return readable(env)


def readable(env: Envelope) -> Envelope:
    """``env``, unless a newer corral wrote it: a body of a schema version this build does not
    know is refused, never read as if it were the old one."""
    if env.v > SCHEMA_VERSION:
        raise DecodeError(f"written in schema v{env.v}; this corral reads up to v{SCHEMA_VERSION}", "unknown")
    return env


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
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError, TypeError, KeyError):
        return None


def decode_request(verb: str, data: bytes) -> Event:
    """A bare request for ``verb``; its ``type`` field may be omitted."""
    decoder = _request_decoders.get(verb)
    if decoder is None:
        raise DecodeError(f"unknown verb {verb!r}", "unknown")
    try:
        return decoder.decode(data)
    except UNREADABLE as exc:
        raise DecodeError(unreadable(exc, data)) from None


class Decoded(NamedTuple):
    body: Event
    tenant: str | None  # set for a request: the tenant its subject names
    traceparent: str | None


# A request subject corral takes -> (its tenant, the decode of its verb's type). Only subjects
# that passed the checks are kept, and only so many: any client may make subjects up.
_request_routes: dict[str, tuple[str, Callable[[bytes], Any]]] = {}
_MAX_REQUEST_ROUTES = 4096


def _request_route(subject: str) -> tuple[str, Callable[[bytes], Any]]:
    """The tenant and decoder of a request subject, or the DecodeError that refuses it.
    Requests are checked against the verbs their tenant may use (admin verbs only for ``admin``)."""
    parsed = subjects.parse_request(subject)
    if parsed is None:
        raise DecodeError(f"not a request subject: {subject}", "unknown")
    tenant, verb = parsed
    verbs = ADMIN_VERBS if tenant == subjects.ADMIN else TENANT_VERBS
    if verb not in verbs:
        raise DecodeError(f"tenant {tenant} may not {verb!r}", "unknown")
    decoder = _request_decoders.get(verb)
    if decoder is None:
        raise DecodeError(f"unknown verb {verb!r}", "unknown")
    route = (tenant, decoder.decode)
    if len(_request_routes) < _MAX_REQUEST_ROUTES:
        _request_routes[subject] = route
    return route


def decode_record(
    subject: str, data: bytes, headers: dict[str, str] | None = None
) -> tuple[Event, str | None, str | None]:
    """``decode_body`` as a plain (body, tenant, traceparent) tuple: the fold's path, once per
    record, so it does no more work than the decoder itself needs."""
    if subject.startswith("corral.ev."):
        env = decode_envelope(data)
        return env.body, None, env.traceparent
    if subject.startswith("corral.in."):
        route = _request_routes.get(subject)
        tenant, decode = _request_route(subject) if route is None else route
        trace = headers.get("traceparent") if headers else None
        try:
            return decode(data), tenant, trace
        except UNREADABLE as exc:
            raise DecodeError(unreadable(exc, data)) from None
    raise DecodeError(f"subject {subject} is not corral's", "unknown")


def decode_body(subject: str, data: bytes, headers: dict[str, str] | None = None) -> Decoded:
    """Any record's event, with the tenant of a request and the trace it belongs to.

    Requests are checked against the verbs their tenant may use (admin verbs only for ``admin``).
    """
    return Decoded._make(decode_record(subject, data, headers))
