"""``corral queues``: each queue's quota, usage, borrowed and lent GPUs, and its fair share."""

from __future__ import annotations

from typing import Any

from projections import quota
from projections.lifecycle import FINAL
from projections.state import State


def queue_rows(state: State) -> list[dict[str, Any]]:
    usage = quota.queue_usage(state)
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for job in state.jobs.values():
        if job.phase in ("submitted", "queued", "preempted", "interrupted"):
            pending[job.spec.queue] = pending.get(job.spec.queue, 0) + 1
        elif job.phase not in FINAL:
            running[job.spec.queue] = running.get(job.spec.queue, 0) + 1
    rows = []
    for name, u in sorted(usage.items()):
        for key, k in sorted(u.keys.items()):
            rows.append(
                {
                    "queue": name,
                    "cohort": u.cohort or "-",
                    "gpu": quota.key_name(key),
                    "nominal": quota.fmt_gpus(k.nominal),
                    "used": quota.fmt_gpus(k.used),
                    "borrowed": quota.fmt_gpus(k.borrowed),
                    "lent": quota.fmt_gpus(k.lent),
                    "weight": u.weight,
                    "pending": pending.get(name, 0),
                    "admitted": running.get(name, 0),
                }
            )
    return rows
