"""Leader leases on a real nats-server: one replica of a role holds the lease at a time; a
standby takes it when the holder stops or stops renewing; a holder that lost it knows at its
next renewal; and of two admission replicas on one log only the holder decides."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import nats
import pytest

from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobRejected, JobSpec, Resources, SubmitJob
from corral.events.log import Append
from corral.events.server import EmbeddedServer
from corral.projections.state import State
from corral.services.admission.decide import decide as admit
from corral.services.cli.watch import Watcher
from corral.services.runtime.lease import KvLease
from corral.services.runtime.lease import bucket as lease_bucket
from corral.services.runtime.shell import Service
from tests.builders import TRAIN

WAIT = 20.0


def decided(job_id: str) -> Callable[[State], bool]:
    return lambda s: job_id in s.jobs and s.jobs[job_id].phase != "submitted"


@pytest.fixture
async def nc(nats_server: str) -> AsyncIterator[nats.NATS]:
    conn = await nats.connect(nats_server)
    yield conn
    await conn.close()


async def test_one_holder_at_a_time_and_a_standby_takes_over_when_it_stops(nc: nats.NATS) -> None:
    a = await KvLease.open(nc, "admission", "replica-a", ttl=2.0)
    b = await KvLease.open(nc, "admission", "replica-b", ttl=2.0)
    other_role = await KvLease.open(nc, "placer", "replica-b", ttl=2.0)
    assert await a.hold() and not await b.hold()
    assert await other_role.hold()  # one lease per role
    await a.release()
    assert await b.hold() and not await a.hold()


async def test_a_holder_that_stops_renewing_loses_the_lease_and_knows_it(nc: nats.NATS) -> None:
    a = await KvLease.open(nc, "placer", "replica-a", ttl=1.0)
    b = await KvLease.open(nc, "placer", "replica-b", ttl=1.0)
    status = await a.kv.status()
    assert status.ttl == 1.0  # the server drops a lease nobody renews within its ttl
    assert await a.hold() and not await b.hold()
    await a.kv.purge("placer")  # what that expiry leaves: the role's key is gone
    assert await b.hold()  # a standby takes it
    a._renewed = -1e9  # a wakes up and renews with the revision it last wrote
    assert not await a.hold() and not a.held
    assert await b.hold()


async def test_a_replica_renews_within_the_bucket_s_age_and_says_when_it_leads(nc: nats.NATS) -> None:
    """The bucket was made by whoever set the corral up: a replica opening it with another age
    in mind renews on the bucket's, and is told each time it starts or stops leading."""
    first = await KvLease.open(nc, "placer", "replica-a", ttl=1.5)
    said: list[bool] = []
    later = await KvLease.open(nc, "placer", "replica-b", ttl=30.0, on_change=said.append)
    assert first.ttl == later.ttl == 1.5
    assert await later.hold() and await later.hold()
    await later.release()
    assert said == [True, False]


async def test_of_two_admission_replicas_only_the_lease_holder_decides(nats_server: str) -> None:
    logs = [await JetStreamLog.connect(nats_server, create=True) for _ in range(3)]
    stops = [asyncio.Event(), asyncio.Event()]
    replicas = [
        Service(
            "admission",
            admit,
            logs[i],
            tick=0.05,
            lease=await KvLease.open(logs[i].nc, "admission", f"replica-{i}", ttl=2.0),
        )
        for i in range(2)
    ]
    for i, r in enumerate(replicas):
        r.producer = f"admission/replica-{i}"  # one process here: tell the replicas apart
    tasks = [asyncio.create_task(r.run(stops[i])) for i, r in enumerate(replicas)]

    async def submit(job_id: str) -> None:
        req = SubmitJob(request_id=job_id, job=JobSpec(queue="q", resources=Resources(gpus=0), command=TRAIN))
        await logs[2].append(Append(subjects.request("team-a", "submit"), codec.encode(req), job_id))

    def accepted_by(watch: Watcher, job_id: str) -> str | None:
        """Who decided on the job first (it names a queue nobody made: it is rejected)."""
        for r in watch.records:
            if r.subject == subjects.job(job_id):
                env = codec.decode_envelope(r.data)
                if isinstance(env.body, JobRejected):
                    return env.producer
        return None

    try:
        async with Watcher(logs[2]) as watch:
            await submit("j1")
            await watch.until(
                lambda s: s.jobs.get("j1") is not None and s.jobs["j1"].phase != "submitted", WAIT
            )
            first = accepted_by(watch, "j1")
            leader = next(i for i, r in enumerate(replicas) if r.producer == first)
            assert replicas[leader].lease.held and not replicas[1 - leader].lease.held  # type: ignore[union-attr]

            stops[leader].set()  # the holder stops and gives the lease up
            await tasks[leader]
            await submit("j2")
            await watch.until(
                lambda s: s.jobs.get("j2") is not None and s.jobs["j2"].phase != "submitted", WAIT
            )
            assert accepted_by(watch, "j2") == replicas[1 - leader].producer
            facts = [r for r in watch.records if r.subject.startswith(subjects.job(""))]
            assert len(facts) == 2  # each job decided once, by one replica
    finally:
        for s in stops:
            s.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for log in logs:
            with contextlib.suppress(Exception):
                await log.close()


async def test_a_renewal_nobody_answers_is_tried_again_with_the_same_revision(
    embedded_server: EmbeddedServer,
) -> None:
    # A NATS cluster electing the bucket's leader answers nothing for seconds: the holder keeps
    # its claim and renews it once answered, unless the lease would have expired meanwhile.
    back = asyncio.Event()

    async def reconnected() -> None:
        back.set()

    conn = await nats.connect(
        embedded_server.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1, reconnected_cb=reconnected
    )
    now, paused = [0.0], [0.0]  # the leases' age, and their pacing of unanswered tries
    try:
        bucket = await lease_bucket(conn, ttl=30.0)
        said: list[bool] = []
        a = KvLease(bucket, "placer", "replica-a", ttl=30.0, clock=lambda: now[0], on_change=said.append)
        b = KvLease(bucket, "placer", "replica-b", ttl=30.0, clock=lambda: now[0])
        a.pause_clock = b.pause_clock = lambda: paused[0]
        assert await a.hold()
        await embedded_server.stop()
        now[0] = 11.0  # past a third of the ttl: a renews, and nobody answers
        assert not await asyncio.wait_for(a.hold(), WAIT) and a.held
        await embedded_server.start()  # the same store: the key is still a's
        await asyncio.wait_for(back.wait(), WAIT)
        async with asyncio.timeout(WAIT):  # a few tries while JetStream comes back
            while not await a.hold():
                assert not await b.hold()
                paused[0] += 2.0  # past ttl / 20: each asks the server again
        assert a.held and not await b.hold()
        # It said once that it stopped leading while nobody answered, and that it leads again.
        assert said == [True, False, True]
    finally:
        await conn.close()
