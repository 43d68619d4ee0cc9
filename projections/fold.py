"""The fold: ``apply(state, record) -> state``, the one function that turns the log into state.

Every service, the CLI, replay and the simulator use it, so every reader agrees on the state at
any sequence. It is deterministic (no clock, no IO, no randomness: time comes from the log) and
total: malformed payloads, unknown types, forbidden writers, illegal transitions and proposals
that no longer hold become recorded rejections, and the fold moves on.

Proposals are arbitrated here. A placement, an admission or a preemption is checked against the
state at its position in the log; if it no longer holds it is recorded void and changes nothing,
so a GPU is never held twice whatever races happen between writers.

Before it folds a record, the fold lets go the finished jobs whose retention period has passed
by that record's log time (``projections/retention.py``).

``apply`` updates ``state`` in place and returns it.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from corral.events import codec, routing, subjects
from corral.events.base import Event
from corral.events.codec import SCHEMA_VERSION, DecodeError
from corral.events.log import Record
from corral.projections import fold_admission, fold_nodes, fold_preemption, fold_requests, retention
from corral.projections.fold_moves import (
    Ctx,
    Handler,
    Refused,
)
from corral.projections.lifecycle import (
    IllegalTransition,
)
from corral.projections.state import (
    MAX_REJECTIONS,
    MAX_REJECTIONS_LOST,
    MAX_REJECTIONS_PER_TENANT,
    Rejection,
    State,
)


def fold_refusals(state: State, records: Iterable[Record]) -> dict[int, Rejection]:
    """Fold ``records`` into ``state`` and say which the fold refused: each refused record's
    rejection, by sequence, taken as it is made (the state keeps only the latest
    ``MAX_REJECTIONS``; a reader that needs every verdict of a batch gets them here)."""
    out: dict[int, Rejection] = {}
    with collector_paused():
        for r in records:
            before = state.rejected_total
            apply(state, r)
            if state.rejected_total > before:
                out[r.seq] = state.rejections[-1]
    return out


def fold(records: Iterable[Record], state: State | None = None) -> State:
    state = State() if state is None else state
    with collector_paused():
        for r in records:
            apply(state, r)
    return state


@contextmanager
def collector_paused() -> Iterator[None]:
    """Fold a batch with Python's cycle collector paused. The fold makes no reference cycles (its
    state is trees of structs, dicts and tuples, freed by their reference counts; a test holds it
    to that), yet its allocations set the collector off again and again, to walk the young
    objects and now and then the whole state: some 6 % of the fold's time (``bench.fold``). The
    collector is resumed after the batch, so cycles made elsewhere are collected as before; if
    it was off already, it stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def apply(state: State, record: Record) -> State:
    seq = record.seq
    if seq <= state.seq:
        return state  # already folded (a redelivery, or a snapshot ahead of this record)
    state.seq = seq
    # Log time never goes back: a record stamped before the newest folded (the stream leader's
    # clock stepped back, or a failover to a server whose clock lags) is folded at the log's
    # time so far. Stamped with its own, the facts it states would lie in the log's past: a
    # preemption's grace ended before anyone read it, a job placed had run for the step.
    if record.time > state.time:
        state.time = record.time
    time = state.time
    fin, first = state.finished, state.finished_from
    if len(fin) > first and fin[first][0] + state.retention.finished_s <= state.time:
        retention.let_go(state)  # the finished jobs whose retention period has passed: O(them)
    subject = record.subject
    body: Event
    try:
        if subject.startswith("corral.ev."):
            try:  # most records: a service event of the current schema
                env = _decode_current_envelope(record.data)
                if env.v > SCHEMA_VERSION:
                    codec.readable(env)  # raises: a newer schema than this build reads
                body, tenant, trace = env.body, None, env.traceparent
            except codec.UNREADABLE:  # upcast, or refused as malformed
                body, tenant, trace = _decode_record(subject, record.data, record.headers)
        else:
            body, tenant, trace = _decode_record(subject, record.data, record.headers)
        # ``_dispatch``, for what the decoder gives: one of corral's types, its key a str.
        handler, home, key_of = _ROUTES[type(body)]
        ctx = Ctx(seq, subject, time, tenant, trace)
        if tenant is None:
            if home is None:
                raise Refused("unknown", f"{type(body).__name__} is a request, not an event")
            if subject != (home if key_of is None else home + getattr(body, key_of)):
                _check_writer(ctx, body)
        handler(state, ctx, body)
    except Exception as e:  # noqa: BLE001 - the fold must never take a service down
        _refused(state, seq, subject, e)
    return state


def apply_event(
    state: State, seq: int, subject: str, body: Event, time: float, tenant: str | None = None
) -> State:
    """Fold an already-decoded event: the simulator's path, with no bytes in between. Requests
    name their ``tenant``; service events must sit on the subject they speak for, as on the wire."""
    if seq <= state.seq:
        return state
    state.seq = seq
    if time > state.time:
        state.time = time
    if retention.is_due(state, state.time):
        retention.let_go(state)
    try:
        _dispatch(state, Ctx(seq, subject, state.time, tenant), body)  # log time never goes back
    except Exception as e:  # noqa: BLE001
        _refused(state, seq, subject, e)
    return state


_decode_record = codec.decode_record
_decode_current_envelope = codec.decode_current_envelope


def _dispatch(state: State, ctx: Ctx, body: Event) -> None:
    """Check the writer of a service event, then fold it with its type's handler."""
    route = _ROUTES.get(type(body))
    if route is None:  # not one of corral's types: refused as the general path says
        if ctx.tenant is None:
            _check_writer(ctx, body)
        HANDLERS[type(body)](state, ctx, body)
        return
    handler, subject, key_of = route
    if ctx.tenant is None:
        if subject is None:
            raise Refused("unknown", f"{type(body).__name__} is a request, not an event")
        # The common case in one comparison; anything else takes the general check.
        if key_of is None:
            if ctx.subject != subject:
                _check_writer(ctx, body)
        else:
            key = getattr(body, key_of)
            if key.__class__ is not str or ctx.subject != subject + key:
                _check_writer(ctx, body)
    handler(state, ctx, body)


def _refused(state: State, seq: int, subject: str, e: Exception) -> None:
    if isinstance(e, Refused):
        _reject(state, seq, subject, e.code, str(e), e.job_id, e.voided)
    elif isinstance(e, DecodeError):
        _reject(state, seq, subject, e.code, str(e))
    elif isinstance(e, IllegalTransition):
        _reject(state, seq, subject, "illegal", str(e))
    else:
        state.faults += 1
        _reject(state, seq, subject, "fault", f"{type(e).__name__}: {e}")


def _check_writer(ctx: Ctx, body: Event) -> None:
    """A service event must sit on the subject of the entity it speaks about: the NATS
    permissions that bind a writer to its subjects then bind it to those entities too."""
    place = routing.home(body)
    if place is None:
        raise Refused("unknown", f"{type(body).__name__} is a request, not an event")
    kind, expected = place
    # corral.ev.<kind>.<key>: the entity the subject names.
    parts = ctx.subject.split(".", 3)
    if (parts[2] if len(parts) > 2 else "") != kind or (parts[3] if len(parts) > 3 else "") != expected:
        raise Refused(
            "forbidden",
            f"{type(body).__name__} about {expected} may not be written on {ctx.subject}",
        )


# A rejection keeps a bounded record of what was refused, never the payload: a request's fields
# (an id of a megabyte, an unknown field's name) reach the message through the decoder's error.
MAX_MESSAGE = 512
MAX_SUBJECT = 256


def _reject(
    state: State,
    seq: int,
    subject: str,
    code: str,
    message: str,
    job_id: str = "",
    voided: tuple[tuple[str, str], ...] = (),
) -> None:
    state.rejected_total += 1
    if code == "void":
        state.void_total += 1
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    if len(subject) > MAX_SUBJECT:
        subject = subject[: MAX_SUBJECT - 1] + "…"
    if job_id and not subjects.is_token(job_id):
        job_id = ""  # not a name any job can have: nobody's job to be shown it
    voided = tuple((j, why if len(why) <= MAX_MESSAGE else why[: MAX_MESSAGE - 1] + "…") for j, why in voided)
    kept = state.rejections
    kept.append(Rejection(seq, subject, code, message, job_id, voided))
    # A tenant's flood of bad requests pushes out its own refusals, not the others': each keeps
    # at most ``MAX_REJECTIONS_PER_TENANT`` of the kept ones (the services' records, which no
    # tenant may write, share the rest).
    who = requester(subject)
    own = state.rejections_kept.setdefault(who, [])
    own.append(seq)
    if who and len(own) > MAX_REJECTIONS_PER_TENANT:
        # Its oldest: kept ones are in log order, so found by its position, not by a walk of
        # every tenant's that cost each service 0.2 ms a refusal of a flood.
        _forget_rejection(state, bisect_left(kept, own[0], key=_seq_of))
    while len(kept) > MAX_REJECTIONS:
        _forget_rejection(state, 0)


def _seq_of(r: Rejection) -> int:
    return r.seq


def requester(subject: str) -> str:
    """Whose request a record is, by its subject's tenant token, for the bound on refusals kept;
    "" for a service's record. Not ``subjects.parse_request``: a tenant may publish any subject
    under its own (``corral.in.T.a.b``, ``corral.in.T``), malformed but still its own, and one
    with no tenant token is nobody's request either ("." never names a tenant)."""
    if not subject.startswith(_REQUESTS):
        return ""
    return subject[len(_REQUESTS) :].split(".", 1)[0] or "."


_REQUESTS = subjects.IN + "."


def _forget_rejection(state: State, i: int) -> None:
    gone = state.rejections.pop(i)
    who = requester(gone.subject)
    lost, kept = state.rejections_lost, state.rejections_kept
    lost[who] = max(lost.get(who, 0), gone.seq)
    if len(lost) > MAX_REJECTIONS_LOST:  # a new tenant's: the oldest let go is told for all
        oldest = min(lost, key=lambda t: (lost[t], t))
        state.rejections_lost_floor = max(state.rejections_lost_floor, lost.pop(oldest))
    own = kept[who]
    del own[0]  # a tenant's refusals leave oldest first, as all do
    if not own:
        del kept[who]


HANDLERS: dict[type[Event], Handler] = {
    **fold_requests.HANDLERS,
    **fold_admission.HANDLERS,
    **fold_preemption.HANDLERS,
    **fold_nodes.HANDLERS,
}

# type -> (handler, the subject it must be written on or that subject's prefix, the field naming
# its key): one lookup per record. Requests have no subject here: they come with the tenant their
# subject names.
_ROUTES: dict[type[Event], tuple[Handler, str | None, str | None]] = {
    t: (h, *routing.WRITTEN_ON.get(t, (None, None))) for t, h in HANDLERS.items()
}
