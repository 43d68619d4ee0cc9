"""The job lifecycle: every phase a job can be in and every move between them, in one table.

The fold makes every phase change by this table (``fold_moves.MOVES`` is it, looked up by
trigger); a move not in the table is an illegal transition and is recorded as a rejection,
never applied. ``advance`` answers the same for everyone else.

    submitted ─accept→ queued ─admit→ admitted ─place→ placed ─start→ starting ─run→ running
    submitted ─reject→ rejected
    running ─preempt→ checkpointing ─stop→ preempted ─requeue→ queued (next attempt)
    placed | starting | running ─interrupt→ interrupted ─requeue→ queued (next attempt)
    running ─succeed→ succeeded;  placed | starting | running ─fail→ failed
    any phase that is not final ─cancel→ cancelled
"""

from __future__ import annotations

from typing import Literal

Phase = Literal[
    "submitted",
    "queued",
    "admitted",
    "placed",
    "starting",
    "running",
    "checkpointing",
    "preempted",
    "interrupted",
    "succeeded",
    "failed",
    "cancelled",
    "rejected",
]
Trigger = Literal[
    "accept",
    "reject",
    "admit",
    "place",
    "start",
    "run",
    "preempt",
    "stop",
    "interrupt",
    "requeue",
    "succeed",
    "fail",
    "cancel",
    "unadmit",
]

PHASES: tuple[Phase, ...] = Phase.__args__  # type: ignore[attr-defined]
TRIGGERS: tuple[Trigger, ...] = Trigger.__args__  # type: ignore[attr-defined]
FINAL: frozenset[Phase] = frozenset({"succeeded", "failed", "cancelled", "rejected"})
# Phases in which the job holds GPUs (or may, while its workers wind down).
HOLDS_GPUS: frozenset[Phase] = frozenset({"placed", "starting", "running", "checkpointing"})
# Phases in which the job holds quota.
HOLDS_QUOTA: frozenset[Phase] = HOLDS_GPUS | {"admitted"}

TRANSITIONS: dict[tuple[Phase, Trigger], Phase] = {
    ("submitted", "accept"): "queued",
    ("submitted", "reject"): "rejected",
    ("queued", "admit"): "admitted",
    # Admission withdrawn before placement (the quota was needed back, or the job shrank to 0).
    ("admitted", "unadmit"): "queued",
    ("admitted", "place"): "placed",
    ("placed", "start"): "starting",
    ("starting", "start"): "starting",
    ("placed", "run"): "running",
    ("starting", "run"): "running",
    ("running", "preempt"): "checkpointing",
    ("placed", "preempt"): "checkpointing",
    ("starting", "preempt"): "checkpointing",
    ("checkpointing", "stop"): "preempted",
    ("preempted", "requeue"): "queued",
    ("placed", "interrupt"): "interrupted",
    ("starting", "interrupt"): "interrupted",
    ("running", "interrupt"): "interrupted",
    ("checkpointing", "interrupt"): "preempted",
    ("interrupted", "requeue"): "queued",
    ("running", "succeed"): "succeeded",
    ("checkpointing", "succeed"): "succeeded",
    ("placed", "fail"): "failed",
    ("starting", "fail"): "failed",
    ("running", "fail"): "failed",
    ("checkpointing", "fail"): "failed",
    ("interrupted", "fail"): "failed",
    **{(p, "cancel"): "cancelled" for p in PHASES if p not in FINAL},
}


class IllegalTransition(Exception):
    def __init__(self, phase: Phase, trigger: Trigger) -> None:
        super().__init__(f"cannot {trigger} a job that is {phase}")
        self.phase = phase
        self.trigger = trigger


def advance(phase: Phase, trigger: Trigger) -> Phase:
    try:
        return TRANSITIONS[(phase, trigger)]
    except KeyError:
        raise IllegalTransition(phase, trigger) from None
