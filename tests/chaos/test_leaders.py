"""A decision role's leader dies or stalls under a steady load of submissions; its standby, a
``corral serve`` process of its own that has folded the log all along, takes over.

- kill -9 the leader of admission, placer, preemptor or health: the standby takes the lease once
  it expires (``LEASE_TTL``), says so, and decides: it admits, places, asks a preemption, or
  states a node fact;
- SIGSTOP the placer's leader past its lease, let the standby place, then SIGCONT it: the old
  leader learns it lost the lease and says so, and nothing it writes late takes effect (the
  fence on the decision subject refuses a stale cycle whole; anything stored would have to be
  voided by the fold).

Each ends with the checks of ``harness.Corral.check``. Waits are bounded waits on the record or
the line expected; how long a takeover takes is measured by ``bench/takeover.py``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.decisions import JobsPlaced, PreemptionRequested
from corral.events.jobs import JobAccepted, JobsAdmitted
from corral.events.nodes import NodeConditionChanged
from corral.projections.fold import apply
from corral.projections.state import State
from tests.chaos.harness import LEASE_TTL, LEASED, WAIT, Corral, corral, job, producer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

# The standby's first decision comes within the lease's expiry, plus what a loaded 2-core
# machine takes to expire a key, fold and run a cycle: a bound on the wait, not a measurement.
TAKEOVER = LEASE_TTL + 30.0

# What each role's standby is expected to decide once it leads.
DECIDES: dict[str, tuple[type[Event], ...]] = {
    "admission": (JobAccepted, JobsAdmitted),
    "placer": (JobsPlaced,),
    "preemptor": (PreemptionRequested,),
    "health": (NodeConditionChanged,),
}


def replicas(doubled: str) -> dict[str, int]:
    """One replica of every leased role, two of ``doubled``."""
    return {r: 2 if r == doubled else 1 for r in LEASED}


def running(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: job_id in s.jobs and s.jobs[job_id].phase == "running"


async def fill(c: Corral) -> None:
    """Both nodes taken by a preemptible batch job of 8 GPUs each, so an urgent job must stop
    one of them."""
    for i in range(2):
        await c.submit(f"batch-{i}", job(("sleep", "40"), gpus=8, priority_class="batch"))
    await c.until(lambda s: all(running(f"batch-{i}")(s) for i in range(2)))


@pytest.mark.parametrize("role", list(DECIDES))
async def test_a_killed_leader_s_standby_takes_over_and_decides(
    role: str, nats_server: str, tmp_path: Path
) -> None:
    async with corral(nats_server, tmp_path, replicas(role)) as c:
        c.start_load()
        if role == "preemptor":
            await fill(c)
        else:
            await c.until(running("load-0002"))
        leader = await c.leader(role)
        [standby] = [p for n, p in c.parts.items() if n.startswith(f"{role}-") and p is not leader]
        await c.says(standby, "stands by")
        killed_at = await c.log.last_seq()
        c.kill(leader)
        if role == "preemptor":
            await c.submit("urgent", job(("sleep", "2"), gpus=8, priority_class="urgent"))
        elif role == "health":
            c.kill(c.parts["agent-node-1"], signal.SIGSTOP)  # its heartbeats stop: suspect soon

        def decided(s: State) -> bool:
            for r in reversed(c.watch.records):
                if r.seq <= killed_at:
                    return False
                if r.subject.startswith("corral.ev.") and producer(r).endswith(f":{standby.pid}"):
                    body = codec.decode_envelope(r.data).body
                    if isinstance(body, DECIDES[role]):
                        return True
            return False

        await c.until(decided, TAKEOVER)
        await c.says(standby, "leads")
        if role == "preemptor":
            await c.until(running("urgent"))
        else:
            # The load goes on under the new leader.
            last = max(int(j.split("-")[1]) for j in c.acked if j.startswith("load-"))
            await c.until(running(f"load-{last:04d}"))
        await c.check()


async def test_a_paused_leader_resumed_past_its_lease_changes_nothing(
    nats_server: str, tmp_path: Path
) -> None:
    async with corral(nats_server, tmp_path, replicas("placer")) as c:
        c.start_load()
        await c.until(running("load-0002"))
        leader = await c.leader("placer")
        [standby] = [p for n, p in c.parts.items() if n.startswith("placer-") and p is not leader]
        paused_at = await c.log.last_seq()
        c.kill(leader, signal.SIGSTOP)
        took_over = await c.decided_by(standby, paused_at, TAKEOVER)
        await c.says(standby, "leads")
        resumed_at = await c.log.last_seq()
        c.kill(leader, signal.SIGCONT)
        await c.says(leader, "stops leading")
        # The load goes on: the standby places what came after the old leader woke up.
        await c.decided_by(standby, max(resumed_at, (await c.log.last_seq())), WAIT)
        records = list(c.watch.records)
        await c.check()

    # Whatever the old leader wrote after the standby took over was void: no placement of it
    # took GPUs, nothing else of it was accepted.
    late = {r.seq for r in records if r.seq > took_over.seq and producer(r).endswith(f":{leader.pid}")}
    state = State()
    for r in records:
        before = (state.rejected_total, {j: jb.placement for j, jb in state.jobs.items()})
        apply(state, r)
        if r.seq not in late:
            continue
        assert state.rejected_total > before[0], f"seq {r.seq} of the old leader was accepted"
        if r.subject == subjects.decision("placer"):
            body = codec.decode_envelope(r.data).body
            if isinstance(body, JobsPlaced):
                for p in body.placements:
                    assert state.jobs[p.job_id].placement is before[1].get(p.job_id), p.job_id
