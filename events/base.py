"""Building blocks shared by every event family.

Every event is a frozen msgspec Struct tagged with its class name in the field ``type``; the
tag is part of the wire format and is never reused or renamed. Fields are only ever added, with
defaults, so that old payloads keep decoding (the golden payloads in tests guard this).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# Every integer on the wire fits in 64 bits. JSON allows any size, and Python would carry one,
# but msgpack snapshots, SQLite and most other languages' clients cannot: a larger one is
# refused when it is decoded, as malformed, instead of crashing whoever stores it later.
Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# An attempt or a rank counts from 0: a negative one names nothing a job ever had, and is
# refused as malformed where it is decoded, not taken as a straggler of an attempt long over.
Index = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True, gc=False):
    """Base of every event and request. The tag (class name) travels as ``type``."""


class Request(Event, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a client asked for, published on ``corral.in.<tenant>.<verb>``.

    The tenant is never a field: it is taken from the subject the request arrived on, which the
    NATS account of that tenant is the only one allowed to publish to.

    A request, and every spec inside it, names only fields corral knows: an unknown one (a typo,
    or a field of a newer version) is refused with its name, never silently dropped, since a
    job run without what its owner asked for is worse than one refused.
    """


class Decision(Event, frozen=True, kw_only=True):
    """A proposal made by a decision service: it records the log position its state was folded
    up to (``based_on``) and the ``now`` it used, so ``corral replay --verify`` can re-run it."""

    based_on: Int
    now: float


class Reason(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Why something did not happen, in terms an operator can act on.

    ``code`` is stable and machine-readable; ``message`` is for people; ``preemption_helps`` says
    whether evicting lower-priority work could change the answer. ``reserved_for``, of a job the
    placer's reservation keeps off the free GPUs (code ``reservation``), is the job they are
    reserved for: the message, its owner's words, names that job only to that job's owner, so
    whoever shows the reason to a tenant shows the field only where the message names it
    (``projections/visibility.py``). None in reasons recorded before it was kept.
    """

    code: str
    message: str
    preemption_helps: bool = False
    reserved_for: str | None = None
