"""Building blocks shared by every event family.

Every event is a frozen msgspec Struct tagged with its class name in the field ``type``; the
tag is part of the wire format and is never reused or renamed. Fields are only ever added, with
defaults, so that old payloads keep decoding (the golden payloads in tests guard this).
"""

from __future__ import annotations

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag=True, omit_defaults=True, gc=False):
    """Base of every event and request. The tag (class name) travels as ``type``."""


class Request(Event, frozen=True, kw_only=True):
    """What a client asked for, published on ``corral.in.<tenant>.<verb>``.

    The tenant is never a field: it is taken from the subject the request arrived on, which the
    NATS account of that tenant is the only one allowed to publish to.
    """


class Decision(Event, frozen=True, kw_only=True):
    """A proposal made by a decision service: it records the log position its state was folded
    up to (``based_on``) and the ``now`` it used, so ``corral replay --verify`` can re-run it."""

    based_on: int
    now: float


class Reason(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Why something did not happen, in terms an operator can act on.

    ``code`` is stable and machine-readable; ``message`` is for people; ``preemption_helps`` says
    whether evicting lower-priority work could change the answer.
    """

    code: str
    message: str
    preemption_helps: bool = False
