"""Queue family: queues, cohorts and priority classes, all changed by admin requests.

Admin requests arrive on ``corral.in.admin.<verb>``; only the admin identity may publish there.
"""

from __future__ import annotations

import msgspec

from corral.events.base import Int, Request


class Quota(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """GPUs of one model (``"*"`` = any model): nominal, plus how many may be borrowed from and
    lent to the cohort. ``None`` limits mean unlimited."""

    nominal: Int = 0
    borrowing_limit: Int | None = None
    lending_limit: Int | None = None


class QueueSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    name: str
    cohort: str | None = None
    quotas: dict[str, Quota] = {}
    weight: float = 1.0
    tenants: tuple[str, ...] = ()
    strategy: str = "best-effort-fifo"


class CohortSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """A cohort pools its queues' unused quota; ``parent`` nests cohorts (org → team cohorts)."""

    name: str
    parent: str | None = None
    quotas: dict[str, Quota] = {}


class PriorityClassSpec(
    msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    name: str
    value: Int
    preemptible: bool = True
    min_runtime_s: float = 0.0
    cooldown_s: float = 0.0
    max_preemptions_per_hour: Int | None = None


class ApplyQueue(Request, frozen=True, kw_only=True):
    queue: QueueSpec


class ApplyCohort(Request, frozen=True, kw_only=True):
    cohort: CohortSpec


class ApplyPriorityClass(Request, frozen=True, kw_only=True):
    priority_class: PriorityClassSpec


class DeleteQueue(Request, frozen=True, kw_only=True):
    name: str


class CordonNode(Request, frozen=True, kw_only=True):
    node: str
    cordoned: bool = True
    drain: bool = False
    reason: str = ""
