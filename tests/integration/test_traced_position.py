"""What a leased role's next holder makes of the traced position it finds (``runtime/traced.py``):
only a whole number within the log is a position. A value past the log would have every holder
after it emit none of the lease's spans, for good; one that is not a number (a node agent can
have JetStream write its acknowledgement over the key, naming it as a reply subject) is none.
The position outlives the leases: a corral stopped and started again later traces the records
written while it stopped, once. A real nats-server and the leases' bucket; the acknowledgement
is the server's own."""

from __future__ import annotations

import asyncio
from collections import Counter

import nats
import pytest
from nats.js import api
from nats.js import errors as js_errors
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.events.log import Append, InMemoryLog
from corral.projections.state import State
from corral.services.runtime import lease, output, shell, tracing
from corral.services.runtime.shell import Service
from corral.services.runtime.traced import TracedPosition, key
from tests.builders import Cluster, on
from tests.integration import polling
from tests.integration.polling import until_answered
from tests.unit.test_tracing import AsWritten

pytestmark = pytest.mark.integration

LAST = 100  # the log's last sequence, as the holder reads it


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (b"42", 42),
        (b"0", 0),
        (b"100", 100),
        (b"101", None),  # past the log
        (str(2**70).encode(), None),
        (b"9" * 5000, None),
        (b"-5", None),
        (b"+5", None),
        (b" 7 ", None),
        (b"1_0", None),
        (b"\xd9\xa1", None),  # an Arabic-Indic one
        (b"garbage", None),
        (b"", None),
    ],
)
async def test_only_a_position_in_the_log_is_read(nats_server: str, value: bytes, read: int | None) -> None:
    nc = await nats.connect(nats_server)
    try:
        await lease.ensure_bucket(nc)
        kv = await lease.bucket(nc)
        await kv.put(key("admission"), value)
        assert await TracedPosition(nc, kv, "admission").read(LAST) == read
    finally:
        await nc.close()


async def test_an_acknowledgement_written_over_the_key_is_no_position(nats_server: str) -> None:
    nc = await nats.connect(nats_server)
    try:
        await lease.ensure_bucket(nc)
        await output.ensure_stream(nc)
        kv = await lease.bucket(nc)
        position = TracedPosition(nc, kv, "admission")
        assert await position.post(LAST)
        # What an agent may publish, with the key's subject as its reply: the server acknowledges there.
        await nc.publish(
            output.subject("n0", "j", 1, 0, 0), b"x\n", reply=f"$KV.{lease.BUCKET}.{key('admission')}"
        )

        async def overwritten() -> bool:
            return bool((await kv.get(key("admission"))).value != str(LAST).encode())

        await until_answered(overwritten, 30.0, every=0.05)
        assert b"seq" in (await kv.get(key("admission"))).value
        assert await position.read(LAST) is None
    finally:
        await nc.close()


async def outlived(kv: object, probe: str) -> None:
    """Wait until the bucket's age has passed over a key written now: a lease's would be gone."""
    await kv.put(probe, b"x")  # type: ignore[attr-defined]

    async def gone() -> bool:
        try:
            await kv.get(probe)  # type: ignore[attr-defined]
        except js_errors.KeyNotFoundError:
            return True
        return False

    await until_answered(gone, 30.0, every=0.1)


async def test_the_position_outlives_the_leases(nats_server: str) -> None:
    nc = await nats.connect(nats_server)
    try:
        await lease.ensure_bucket(nc, ttl=1.0)
        kv = await lease.bucket(nc, ttl=1.0)
        assert await TracedPosition(nc, kv, "admission").post(42)
        await outlived(kv, "admission")
        assert await TracedPosition(nc, kv, "admission").read(LAST) == 42
    finally:
        await nc.close()


async def test_a_bucket_without_per_message_ttls_takes_the_position_as_a_lease_and_is_set_up_again(
    nats_server: str,
) -> None:
    """Made by an older corral: the position is posted all the same, expiring as the leases do,
    until whoever sets the corral up brings the bucket to per-message TTLs."""
    nc = await nats.connect(nats_server)
    js = nc.jetstream()
    try:
        await js.add_stream(
            api.StreamConfig(
                name=f"KV_{lease.BUCKET}",
                subjects=[f"$KV.{lease.BUCKET}.>"],
                max_age=1.0,
                max_msgs_per_subject=1,
                allow_rollup_hdrs=True,
                deny_delete=True,
                discard=api.DiscardPolicy.NEW,
            )
        )
        kv = await lease.bucket(nc)
        old = TracedPosition(nc, kv, "admission")
        assert await old.post(41) and not old.lasting
        assert await old.read(LAST) == 41
        await lease.ensure_bucket(nc)
        assert (await js.stream_info(f"KV_{lease.BUCKET}")).config.allow_msg_ttl
        assert await TracedPosition(nc, kv, "admission").post(42)
        await outlived(kv, "admission")
        assert await TracedPosition(nc, kv, "admission").read(LAST) == 42
    finally:
        await nc.close()


async def test_a_corral_started_again_traces_what_the_last_one_did_not_once(nats_server: str) -> None:
    """The admission holder stops; a worker's start and exit are written while nothing traces
    (``corral up`` stops its agents after its services); the next holder, started later than the
    leases' age, emits their spans, and none of those the first one emitted."""
    tracing.shutdown()
    got = InMemorySpanExporter()
    tracing.setup("admission", SimpleSpanProcessor(got))
    log = AsWritten().nodes(Cluster(1)).queues("team-a").submit("alice", "j1").accept("j1").admit("j1")
    log.place(on("node-00", 0, job_id="j1"))
    nc = await nats.connect(nats_server)
    memory = InMemoryLog()

    def write(records: list) -> None:  # type: ignore[type-arg]
        for r in records:
            memory.now = r.time
            memory.append_sync(Append(r.subject, r.data, headers=r.headers))

    def never(state: State, now: float) -> list:  # type: ignore[type-arg]
        return []  # only the spans are looked at: it decides nothing

    async def holder(name: str) -> tuple[Service, asyncio.Event, asyncio.Task[None]]:
        held = await lease.KvLease.open(nc, "admission", name, ttl=1.0)
        svc = Service("admission", never, memory, tick=0.05, lease=held)
        svc.producer = f"admission/{name}"
        stop = asyncio.Event()
        return svc, stop, asyncio.create_task(svc.run(stop))

    try:
        await lease.ensure_bucket(nc, ttl=1.0)
        kv = await lease.bucket(nc, ttl=1.0)
        write(log.records)
        first, stop, task = await holder("first")
        await first.caught_up.wait()
        position = TracedPosition(nc, kv, "admission")

        async def traced() -> bool:
            return await position.read(await memory.last_seq()) == log.last_seq

        await until_answered(traced, 30.0, every=0.05)
        stop.set()
        await task
        before = len(got.get_finished_spans())
        # Written while nothing runs: the worker starts and ends.
        n = len(log.records)
        log.started("node-00", "j1").exited("node-00", "j1")
        write(log.records[n:])
        await outlived(kv, "probe")
        _, stop, task = await holder("second")
        await polling.until(lambda: any(s.name == "job j1" for s in got.get_finished_spans()), 30.0)
        stop.set()
        await task
    finally:
        await nc.close()
        tracing.shutdown()
    spans = got.get_finished_spans()
    assert not [s.name for s in spans[:before] if s.name in ("starting", "running", "job j1")]
    names = Counter(s.name for s in spans)
    assert names["starting"] == names["running"] == names["job j1"] == 1, names
    assert len({s.context.span_id for s in spans}) == len(spans), "a span was emitted twice"


async def test_a_replica_starting_far_past_the_position_keeps_nothing_of_its_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A position from long ago (a corral that ran without a collector since) would have the
    replay keep every record's span since, in memory, until the lease is held: none is kept."""
    monkeypatch.setattr(shell, "RESUME_WITHIN", 2)
    memory = InMemoryLog()
    for r in AsWritten().nodes(Cluster(5)).records:
        memory.append_sync(Append(r.subject, r.data))
    svc = Service("admission", lambda state, now: [], memory)
    assert [await svc._resumable(p) for p in (3, 2, None)] == [3, None, None]
