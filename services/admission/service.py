"""The admission service: the shared shell (``corral.services.runtime.shell``) around ``decide``.

It folds the log, and once per cycle accepts or rejects each request, admits queued jobs against
quota in fair-share order, requeues interrupted and preempted jobs, and grows elastic jobs. Its
decisions go out fenced on ``corral.ev.decision.admission``; of any number of replicas, the one
holding the role's lease decides and the others fold the log and stand by.
"""

from __future__ import annotations

from typing import Any

from corral.events.log import EventLog
from corral.services.admission.decide import decide, wake
from corral.services.runtime.shell import Service

ROLE = "admission"


def service(log: EventLog, **options: Any) -> Service:
    """The service on ``log``; ``options`` go to ``Service`` (clock, tick, snapshots, lease)."""
    return Service(ROLE, decide, log, wake=wake, **options)
