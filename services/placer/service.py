"""The placer service: the shared shell (``corral.services.runtime.shell``) around ``decide``.

It folds the log, and once per cycle places each admitted job's whole gang on GPUs (topology, MIG,
fractions), holds a reservation for the head of the queue and backfills around it. Its decisions
go out fenced on ``corral.ev.decision.placer``; of any number of replicas, the one holding the
role's lease decides and the others fold the log and stand by.
"""

from __future__ import annotations

from typing import Any

from corral.events.log import EventLog
from corral.services.placer.decide import decide
from corral.services.runtime.shell import Service

ROLE = "placer"


def service(log: EventLog, **options: Any) -> Service:
    """The service on ``log``; ``options`` go to ``Service`` (clock, tick, snapshots, lease)."""
    return Service(ROLE, decide, log, **options)
