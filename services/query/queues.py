"""``corral queues``: each queue's quota and its limits, usage, borrowed and lent GPUs, and its
fair share.

``queue_usage`` works the figures out from the quota ledger (``projections.quota``); ``queue_rows``
puts them with each queue's pending and running jobs into the rows the CLI and the read service
show, with the GPUs it held recently: the decayed GPU time fair share orders queues by
(``projections.gpu_time``), as of the last record folded. GPU figures are numbers of GPUs
(``16``, ``2.5``), so ``-o json`` gives numbers."""

from __future__ import annotations

from typing import Any

import msgspec

from corral.projections import gpu_time, indexes, quota
from corral.projections.quota import Ledger
from corral.projections.state import WHOLE, State
from corral.services.query.present import gpus


def queue_rows(state: State) -> list[dict[str, Any]]:
    usage = queue_usage(state)
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for job in indexes.unfinished(state):
        if job.phase in ("submitted", "queued", "preempted", "interrupted"):
            pending[job.spec.queue] = pending.get(job.spec.queue, 0) + 1
        else:
            running[job.spec.queue] = running.get(job.spec.queue, 0) + 1
    rows = []
    half_life = state.fair_share.half_life_s
    for name, u in sorted(usage.items()):
        held = state.gpu_time.get(name, {})
        for key, k in sorted(u.keys.items()):
            g = held.get(key)
            recent = round(gpu_time.recent(g, state.time, half_life)) if g is not None else 0
            rows.append(
                {
                    "queue": name,
                    "cohort": u.cohort or "-",
                    "gpu": quota.key_name(key),
                    "nominal": gpus(k.nominal),
                    # As the queue file set them (None: no limit), so that the admin sees what
                    # bounds its borrowing and lending, and a limit set past its nominal.
                    "borrowing_limit": k.borrowing_limit,
                    "lending_limit": k.lending_limit,
                    "used": gpus(k.used),
                    "recent": gpus(recent),
                    "borrowed": gpus(k.borrowed),
                    "lent": gpus(k.lent),
                    "weight": u.weight,
                    "pending": pending.get(name, 0),
                    "admitted": running.get(name, 0),
                }
            )
    return rows


class KeyUsage(msgspec.Struct, frozen=True):
    """One queue's standing on one quota key, in milli-GPU."""

    nominal: int
    used: int
    borrowed: int
    lent: int
    available: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


class QueueUsage(msgspec.Struct, frozen=True):
    name: str
    cohort: str | None
    weight: float
    keys: dict[str, KeyUsage]


def queue_usage(state: State) -> dict[str, QueueUsage]:
    """Every queue's nominal, used, borrowed, lent and available per key (``corral queues``).

    ``lent`` attributes what the tree's borrowers hold to the queues whose idle lendable quota
    it came from, pro rata (cohorts' own quota lends too), so the lent figures of a tree never
    add up to more than its borrowed figures.
    """
    ledger = Ledger.from_state(state)
    # Per (tree root, key): what queues borrow, and what each lender has idle and lendable.
    borrowed: dict[tuple[str, str], int] = {}
    idle: dict[tuple[str, str], int] = {}
    lendable: dict[tuple[str, str], int] = {}
    for name in state.queues:
        root = ledger.root(name)
        for key in set(ledger.usage(name)) | set(ledger.spec(name).quotas):
            used, nominal = ledger.used(name, key), ledger.nominal(name, key)
            borrowed[root, key] = borrowed.get((root, key), 0) + max(0, used - nominal)
            if ledger.cohort(name) is None:
                continue
            spare = max(0, min(nominal - ledger.guaranteed(name, key), nominal - used))
            lendable[name, key] = spare
            idle[root, key] = idle.get((root, key), 0) + spare
    for cname, c in state.cohorts.items():
        root = ledger.cohort_root(cname)
        for key, q in c.quotas.items():
            idle[root, key] = idle.get((root, key), 0) + q.nominal * WHOLE
    out: dict[str, QueueUsage] = {}
    for name in sorted(state.queues):
        spec = state.queues[name]
        root = ledger.root(name)
        keys: dict[str, KeyUsage] = {}
        for key in sorted(set(ledger.usage(name)) | set(spec.quotas)):
            used, nominal = ledger.used(name, key), ledger.nominal(name, key)
            q = ledger.quota(name, key)
            pool = idle.get((root, key), 0)
            taken = min(borrowed.get((root, key), 0), pool)
            lent = lendable.get((name, key), 0) * taken // pool if pool else 0
            keys[key] = KeyUsage(
                nominal=nominal,
                used=used,
                borrowed=max(0, used - nominal),
                lent=lent,
                available=ledger.available(name, key),
                borrowing_limit=q.borrowing_limit,
                lending_limit=q.lending_limit,
            )
        out[name] = QueueUsage(name=name, cohort=spec.cohort, weight=spec.weight, keys=keys)
    return out
