"""Decision family: the placer's and preemptor's proposals, on ``corral.ev.decision.<role>``.

Each is a proposal the fold checks against the state at its position in the log; one event may
carry a whole cycle's worth of them, so a busy cycle costs one append.
"""

from __future__ import annotations

import msgspec

from corral.events.base import Decision, Index, Int, Reason


class MigSlot(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """A MIG GPU instance: ``profile`` (e.g. ``"3g.40gb"``) at memory slice ``start``."""

    profile: str
    start: Int


class GpuClaim(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """A share of one GPU: the whole GPU (1000 milli), a fraction of it, or one MIG slot."""

    gpu: Int
    milli: Int = 1000
    mig: MigSlot | None = None


class WorkerSlot(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    rank: Index
    node: str
    gpus: tuple[GpuClaim, ...] = ()


class Placement(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """The whole gang of one job, one slot per worker rank."""

    job_id: str
    attempt: Index
    workers: tuple[WorkerSlot, ...]


class JobsPlaced(Decision, frozen=True, kw_only=True):
    placements: tuple[Placement, ...]


class Unschedulable(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    job_id: str
    attempt: Index
    reasons: tuple[Reason, ...]


class JobsUnschedulable(Decision, frozen=True, kw_only=True):
    jobs: tuple[Unschedulable, ...]


class Victim(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    job_id: str
    attempt: Index


class PreemptionRequested(Decision, frozen=True, kw_only=True):
    """Ask ``victims`` to checkpoint by ``deadline`` (a log time) and stop, for ``beneficiary``.

    With ``moves``, a consolidation: the victims are stopped only to run elsewhere, so that an
    admitted beneficiary's gang fits where they were; ``moves`` is the layout that shows it (the
    beneficiary's placement first, then one per victim), which the fold checks against the
    nodes as they stand. The victims are requeued and placed again as any stopped job is.

    ``key``: the GPU model whose quota the stops are for, where a queued beneficiary names
    several (Kueue's flavor its preemption is on); empty for its first."""

    beneficiary: str
    victims: tuple[Victim, ...]
    deadline: float
    moves: tuple[Placement, ...] = ()
    key: str = ""


class ShrinkRequested(Decision, frozen=True, kw_only=True):
    """Ask elastic job ``job_id`` (at ``attempt``) to keep ranks ``0..replicas-1`` and stop the
    ones above by ``deadline`` (a log time), so that ``beneficiary`` gets their GPUs. The job goes
    on running: its admission shrinks to ``replicas`` at once, and each leaving rank gives its
    GPUs back when its worker has exited. ``key``: as ``PreemptionRequested``'s."""

    job_id: str
    attempt: Index
    replicas: Int
    beneficiary: str
    deadline: float
    key: str = ""
