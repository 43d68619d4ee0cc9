"""The job lifecycle: every phase a job can be in and every move between them, in one table.

The fold makes every phase change by this table (``fold_moves.MOVES`` is it, looked up by
trigger); a move not in the table is an illegal transition and is recorded as a rejection,
never applied. ``advance`` answers the same for everyone else. Every edge is taken by some
record the fold accepts (``tests/unit/test_lifecycle_edges.py`` drives each one); an edge no
record can take does not belong here.

The table, as ``diagram()`` draws it:

    submitted ─accept→ queued
    submitted ─reject→ rejected
    queued ─admit→ admitted
    admitted ─withdraw→ queued
    admitted ─place→ placed
    placed | starting ─start→ starting
    starting ─run→ running
    placed | starting | running ─preempt→ checkpointing
    checkpointing ─stop→ preempted
    placed | starting | running ─interrupt→ interrupted
    checkpointing ─interrupt→ preempted
    preempted | interrupted ─requeue→ queued
    running ─succeed→ succeeded
    starting | running ─fail→ failed
    any phase that is not final ─cancel→ cancelled

``preempted`` and ``interrupted`` are waiting points: admission's ``JobRequeued`` moves the job
to its next attempt, so restart policy and back-off stay decisions, not arithmetic in the fold.
An admitted job that no node can host any more (a node left) is withdrawn by admission's
``AdmissionWithdrawn``: back to ``queued`` at the same attempt, its quota given back.
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
    "withdraw",
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
]

PHASES: tuple[Phase, ...] = Phase.__args__  # type: ignore[attr-defined]
TRIGGERS: tuple[Trigger, ...] = Trigger.__args__  # type: ignore[attr-defined]
FINAL: frozenset[Phase] = frozenset({"succeeded", "failed", "cancelled", "rejected"})
# Phases in which the job holds GPUs (or may, while its workers wind down).
HOLDS_GPUS: frozenset[Phase] = frozenset({"placed", "starting", "running", "checkpointing"})
# Phases in which the job holds quota.
HOLDS_QUOTA: frozenset[Phase] = HOLDS_GPUS | {"admitted"}
# Phases in which a job waits to start (for a decision of some service): those a start is
# forecast for.
WAITING: frozenset[Phase] = frozenset({"submitted", "queued", "admitted", "preempted", "interrupted"})

TRANSITIONS: dict[tuple[Phase, Trigger], Phase] = {
    ("submitted", "accept"): "queued",
    ("submitted", "reject"): "rejected",
    ("queued", "admit"): "admitted",
    # No node of the cluster can host it any more: it gives its quota back and waits again.
    ("admitted", "withdraw"): "queued",
    ("admitted", "place"): "placed",
    ("placed", "start"): "starting",
    ("starting", "start"): "starting",
    # A gang's last worker to start makes it run (a worker of one, at once: start, then run).
    ("starting", "run"): "running",
    ("running", "preempt"): "checkpointing",
    ("placed", "preempt"): "checkpointing",
    ("starting", "preempt"): "checkpointing",
    # A victim with no live worker stops at once; else when its last worker has exited.
    ("checkpointing", "stop"): "preempted",
    ("preempted", "requeue"): "queued",
    ("placed", "interrupt"): "interrupted",
    ("starting", "interrupt"): "interrupted",
    ("running", "interrupt"): "interrupted",
    ("checkpointing", "interrupt"): "preempted",  # its node was lost while it checkpointed
    ("interrupted", "requeue"): "queued",
    ("running", "succeed"): "succeeded",
    # A started worker that fails with no restarts left. (While checkpointing, any exit counts
    # towards the stop: the job is preempted either way.)
    ("starting", "fail"): "failed",
    ("running", "fail"): "failed",
    **{(p, "cancel"): "cancelled" for p in PHASES if p not in FINAL},
}


class IllegalTransition(Exception):
    def __init__(self, phase: Phase, trigger: Trigger) -> None:
        super().__init__(f"cannot {trigger} a job that is {phase}")
        self.phase = phase
        self.trigger = trigger


def diagram() -> str:
    """The table drawn as text, a line per trigger and target, in the order phases and triggers
    are declared: the diagram in this module's docstring, which a test keeps equal to it."""
    live = [p for p in PHASES if p not in FINAL]
    lines = []
    for trigger in TRIGGERS:
        by_target: dict[Phase, list[Phase]] = {}
        for (phase, t), target in TRANSITIONS.items():
            if t == trigger:
                by_target.setdefault(target, []).append(phase)
        for target, sources in by_target.items():
            ordered = [p for p in PHASES if p in sources]
            text = "any phase that is not final" if ordered == live else " | ".join(ordered)
            lines.append(f"{text} ─{trigger}→ {target}")
    return "\n".join(lines)


def advance(phase: Phase, trigger: Trigger) -> Phase:
    try:
        return TRANSITIONS[(phase, trigger)]
    except KeyError:
        raise IllegalTransition(phase, trigger) from None
