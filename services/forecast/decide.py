"""The forecast role's pure part: when to forecast again, what each tenant's key then holds, and
what a what-if question is answered with. No IO, no clock: the shell passes ``now``.

Invariants:

- forecasts are calibrated by how far the estimates of the jobs that succeeded last were off
  (``finished``; each counted once, while the fold still holds it: its retention period);
- a forecast is made again only when the state moved (a record was folded) or time alone may
  have moved a start (``REFRESH_S`` on a quiet log: a job ran past its estimate), and not more
  often than every ``EVERY_S``: on a busy log one forecast serves every record folded meanwhile;
- a tenant's value lists only that tenant's jobs (``values``); a tenant whose jobs all stopped
  waiting gets an empty value, so no stale start outlives its wait;
- a what-if is answered for the tenant of the question's subject only (``whatif_answer``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from corral.events import codec, documents
from corral.events.jobs import JobSpec
from corral.projections import indexes
from corral.projections.state import State
from corral.services.forecast import whatif
from corral.services.runtime.forecasts import MOST, MOST_BYTES, Eta, TenantForecast, entry_bytes, eta
from corral.services.runtime.spent import Spent as Spent
from corral.services.sim import eta as sim_eta
from corral.services.sim.driver import WAITING

ROLE = "forecast"
EVERY_S = 5.0  # the least time between two forecasts
REFRESH_S = 60.0  # a quiet log is forecast again this often: time alone moves starts
WHATIF = "whatif"  # the question, on corral.read.<tenant>.whatif


# The most of a core forecasts keep busy: after one that simulated for ``t`` seconds, the next
# starts no sooner than ``t * (1 / FORECAST_SHARE - 1)`` after it ended (``rest_after``). A
# tenant's deep backlog of short estimates made one forecast 81 s of simulation, and forecasts
# ran back to back, a core for good (in ``corral up``, the core every service shares).
FORECAST_SHARE = 0.5


def rest_after(ended: float, simulated_s: float, share: float = FORECAST_SHARE) -> float:
    """When the next forecast may start, one that simulated ``simulated_s`` having ended at
    ``ended``."""
    return ended + simulated_s * (1.0 / share - 1.0)


def due(last_seq: int, last_at: float | None, seq: int, now: float, rest_until: float = -math.inf) -> bool:
    """Whether to forecast at ``now`` a state folded to ``seq``, the last forecast having been of
    ``last_seq`` at ``last_at`` (None: none yet) and the role resting until ``rest_until``."""
    if now < rest_until:
        return False
    if last_at is None:
        return True
    waited = now - last_at
    return (seq != last_seq and waited >= EVERY_S) or waited >= REFRESH_S


def waiting(state: State) -> list[str]:
    """The jobs a forecast is made for: those waiting."""
    return [j.id for j in indexes.jobs_in(state, *indexes.ordered(WAITING))]


def values(
    state: State,
    bands: Mapping[str, tuple[float, float, float]],
    now: float,
    before: Iterable[str] = (),
    horizon_s: float = sim_eta.HORIZON_S,
) -> dict[str, TenantForecast]:
    """Per tenant, its waiting jobs' forecasts (``bands``: job → early, start, late), and an
    empty one for each tenant of ``before`` (those written last time) that has none now. At most
    ``MOST`` per tenant and ``MOST_BYTES`` of them, the soonest first."""
    per: dict[str, list[tuple[float, str]]] = {t: [] for t in before}
    for job_id, (_, start, _) in bands.items():
        job = state.jobs.get(job_id)
        if job is not None:
            per.setdefault(job.tenant, []).append((start, job_id))
    out = {}
    for tenant, jobs in per.items():
        jobs.sort()
        kept: dict[str, Eta] = {}
        size = 0
        for _, job_id in jobs[:MOST]:
            told = eta(*bands[job_id])
            size += entry_bytes(job_id, told)
            if size > MOST_BYTES:
                break
            kept[job_id] = told
        out[tenant] = TenantForecast(state.seq, now, horizon_s, sim_eta.ASSUMPTION, kept)
    return out


class WhatIf(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A what-if question: the job as it would be submitted, under the id it would have ("": one
    no job holds)."""

    job: JobSpec
    id: str = ""


class BadWhatIf(ValueError):
    pass


_decode_whatif = msgspec.json.Decoder(WhatIf).decode


def parse_whatif(data: bytes) -> WhatIf:
    """The question in ``data``, read by the rule the intake reads a submit by: a field given
    twice in one object is refused, not taken as one reader's guess (a what-if of the last
    ``queue`` would answer for a job the intake refuses)."""
    try:
        ask = _decode_whatif(data)
    except codec.UNREADABLE as e:
        raise BadWhatIf(f"unreadable what-if: {e}") from None
    twice = documents.given_twice(data)
    if twice is not None:
        raise BadWhatIf(f"unreadable what-if: {twice!r} given twice")
    return ask


def whatif_answer(
    state: State, asker: str, data: bytes, now: float, errors: sim_eta.Errors | None = None
) -> dict[str, Any]:
    """The answer to ``asker``'s what-if question ``data``: what corral would do with the job if
    ``asker`` submitted it at ``now`` (with jobs run by ``errors``, as forecasts are), telling
    nothing of other tenants' jobs but their queues."""
    try:
        ask = parse_whatif(data)
    except BadWhatIf as e:
        return {"seq": state.seq, "error": str(e)}
    return whatif.answer(state, asker, ask.id, ask.job, now, errors)
