"""The preemptor service: the shared shell (``corral.services.runtime.shell``) around ``decide``.

It folds the log, and once per cycle asks the fewest, cheapest victims to checkpoint and stop (or
elastic jobs to shrink) for a job that waits on quota or GPUs it may have. Its decisions go out
fenced on ``corral.ev.decision.preemptor``; of any number of replicas, the one holding the role's
lease decides and the others fold the log and stand by.
"""

from __future__ import annotations

from typing import Any

from corral.events.log import EventLog
from corral.services.preemptor.decide import decide, wake
from corral.services.runtime.shell import Service

ROLE = "preemptor"
# Decide at most twice a second (Volcano's and KAI's schedulers run a session a second): a
# preemption takes its victims' grace periods, seconds to minutes, to free anything, while a
# cycle reads every admitted job and, with a job to search for, builds a snapshot of the
# cluster. Deciding on every record folded, as admission and the placer do, cost a busy log
# dozens of such cycles a second for the same answers.
CADENCE_S = 0.5


def service(log: EventLog, **options: Any) -> Service:
    """The service on ``log``; ``options`` go to ``Service`` (clock, tick, snapshots, lease,
    ``cadence_s``, by default ``CADENCE_S``)."""
    return Service(ROLE, decide, log, wake=wake, **{"cadence_s": CADENCE_S, **options})
