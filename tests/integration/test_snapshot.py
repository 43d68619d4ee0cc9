"""Snapshots in SQLite: round trip, what is discarded, and restore (snapshot + tail) equals the
fold of the whole log, at any cut, on generated logs of a busy cluster."""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import msgspec
import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events import codec, subjects
from corral.events.base import Event, Reason
from corral.events.decisions import (
    GpuClaim,
    JobsPlaced,
    JobsUnschedulable,
    MigSlot,
    Placement,
    PreemptionRequested,
    Unschedulable,
    Victim,
    WorkerSlot,
)
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import (
    Admission,
    CancelJob,
    JobAccepted,
    JobRejected,
    JobRequeued,
    JobsAdmitted,
    JobSpec,
    PendingReasonChanged,
    ResizeJob,
    Resources,
    SubmitJob,
)
from corral.events.log import Append, InMemoryLog
from corral.events.nodes import (
    CheckpointCompleted,
    GpuHealthChanged,
    NodeCondition,
    NodeConditionChanged,
    NodeCordoned,
    NodeRegistered,
    WorkerExited,
    WorkerStarted,
)
from corral.events.queues import ApplyPriorityClass, ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from corral.events.server import EmbeddedServer
from corral.projections import mig
from corral.projections.fold import apply, fold
from corral.projections.snapshot import KEEP, SnapshotStore, restore
from corral.projections.state import JobState, State
from corral.services.agent.inventory import cluster
from tests.builders import TRAIN, LogBuilder, job

TENANTS = ("alpha", "beta")
SHAPES = (
    Resources(gpus=1),
    Resources(gpus=2),
    Resources(gpus=8),
    Resources(gpus=1, gpu_milli=500),
    Resources(mig="3g.40gb"),
    Resources(mig="1g.10gb"),
)


class Cluster:
    """A log of a busy cluster, written the way the services would write it: each step looks at
    the State folded so far and says something plausible, sometimes stale or wrong, as live
    services racing each other do."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.log = InMemoryLog()
        self.state = State()
        self.jobs = 0

    def _append(self, subject: str, data: bytes) -> None:
        self.log.now += self.rng.choice((0.0, 0.5, 3.0))
        self.log.append_sync(Append(subject, data))
        apply(self.state, self.log.records[-1])

    def event(self, subject: str, body: Event) -> None:
        env = codec.seal(body, event_id=f"ev-{len(self.log.records)}", time=self.log.now, producer="sim")
        self._append(subject, codec.encode(env))

    def request(self, tenant: str, verb: str, body: Event) -> None:
        self._append(subjects.request(tenant, verb), codec.encode(body))

    def _pick(self, *phases: str) -> JobState | None:
        jobs = [j for j in self.state.jobs.values() if j.phase in phases]
        return self.rng.choice(jobs) if jobs else None

    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        for name, inv in cluster(self.rng.randint(2, 6)):
            self.event(subjects.node(name), NodeRegistered(node=name, inventory=inv))
        for q in ("team-a", "team-b"):
            spec = QueueSpec(name=q, quotas={"*": Quota(nominal=16)}, tenants=TENANTS)
            self.request(subjects.ADMIN, "queue", ApplyQueue(queue=spec))
        pc = PriorityClassSpec(name="high", value=100, preemptible=False)
        self.request(subjects.ADMIN, "priority-class", ApplyPriorityClass(priority_class=pc))

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> None:
        actions = (
            (self.submit, 4),
            (self.accept, 5),
            (self.admit, 4),
            (self.place, 6),
            (self.start, 8),
            (self.exit, 6),
            (self.checkpoint, 1),
            (self.preempt, 1),
            (self.requeue, 3),
            (self.cancel, 1),
            (self.resize, 1),
            (self.pending, 1),
            (self.node_health, 1),
            (self.garbage, 1),
        )
        action = self.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
        action()

    def submit(self) -> None:
        self.jobs += 1
        job_id = f"job-{self.jobs}" if self.rng.random() > 0.03 else "bad id!"
        shape = self.rng.choice(SHAPES)
        spec = JobSpec(
            queue=self.rng.choice(("team-a", "team-b")),
            replicas=self.rng.choice((1, 1, 2, 3)),
            min_replicas=self.rng.choice((None, 1)),
            resources=shape,
            priority_class=self.rng.choice(("normal", "high")),
            checkpointable=self.rng.random() < 0.5,
            restart_policy=self.rng.choice(("never", "on-failure")),
            command=TRAIN,
        )
        self.request(self.rng.choice(TENANTS), "submit", SubmitJob(request_id=job_id, job=spec))

    def accept(self) -> None:
        job = self._pick("submitted")
        if job is None:
            return
        if self.rng.random() < 0.1:
            body: Event = JobRejected(
                job_id=job.id, request_seq=job.submitted_seq, reason=Reason("quota", "no")
            )
        else:
            body = JobAccepted(job_id=job.id, priority=self.rng.choice((0, 10, 100)))
        self.event(subjects.job(job.id), body)

    def admit(self) -> None:
        queued = [j for j in self.state.jobs.values() if j.phase == "queued"]
        chosen = self.rng.sample(queued, min(len(queued), self.rng.randint(1, 3)))
        if not chosen:
            return
        admissions = tuple(
            Admission(
                job_id=j.id,
                attempt=j.attempt if self.rng.random() > 0.1 else j.attempt + 1,
                replicas=j.spec.replicas,
                gpus={"*": j.spec.replicas * max(j.spec.resources.gpus, 1)},
            )
            for j in chosen
        )
        based_on = self.state.seq
        self.event(
            subjects.decision("admission"),
            JobsAdmitted(based_on=based_on, now=self.log.now, admissions=admissions),
        )

    def _slots(self, job: JobState) -> tuple[WorkerSlot, ...] | None:
        """A gang placement on currently free GPUs (ignoring CPU and memory, which the fold
        checks), or None if this greedy search finds none."""
        res = job.spec.resources
        want = job.admission.replicas if job.admission is not None else job.spec.replicas
        taken: dict[tuple[str, int], int] = {}
        slots = []
        nodes = list(self.state.nodes.values())
        self.rng.shuffle(nodes)
        for rank in range(want):
            slot = None
            for node in nodes:
                if not node.schedulable:
                    continue
                claims: list[GpuClaim] = []
                for g in node.gpus:
                    used = taken.get((node.name, g.info.index), g.mig_used if g.info.mig else g.used_milli)
                    if not g.healthy:
                        continue
                    if res.mig is not None:
                        starts = mig.free_starts(g.info.model, res.mig, used) if g.info.mig else []
                        if starts:
                            p = mig.profile(g.info.model, res.mig)
                            assert p is not None
                            taken[(node.name, g.info.index)] = used | mig.mask(p, starts[0])
                            claims = [GpuClaim(gpu=g.info.index, mig=MigSlot(res.mig, starts[0]))]
                            break
                    elif not g.info.mig and res.gpus == 1 and res.gpu_milli < 1000:
                        if used + res.gpu_milli <= 1000:
                            taken[(node.name, g.info.index)] = used + res.gpu_milli
                            claims = [GpuClaim(gpu=g.info.index, milli=res.gpu_milli)]
                            break
                    elif not g.info.mig and used == 0:
                        taken[(node.name, g.info.index)] = 1000
                        claims.append(GpuClaim(gpu=g.info.index))
                        if len(claims) == res.gpus:
                            break
                want_claims = 1 if res.mig is not None or res.gpu_milli < 1000 else res.gpus
                if len(claims) == want_claims:
                    slot = WorkerSlot(rank=rank, node=node.name, gpus=tuple(claims))
                    break
                for c in claims:  # not enough here: give back what this node's search took
                    taken.pop((node.name, c.gpu), None)
            if slot is None:
                return None
            slots.append(slot)
        return tuple(slots)

    def place(self) -> None:
        job = self._pick("admitted")
        if job is None:
            return
        slots = self._slots(job)
        now, based_on = self.log.now, self.state.seq
        subject = subjects.decision("placer")
        if slots is None:
            reasons = (Reason("gpus", "no node has the GPUs free", preemption_helps=True),)
            u = Unschedulable(job_id=job.id, attempt=job.attempt, reasons=reasons)
            self.event(subject, JobsUnschedulable(based_on=based_on, now=now, jobs=(u,)))
            return
        placements = [Placement(job_id=job.id, attempt=job.attempt, workers=slots)]
        other = self._pick("admitted")
        if other is not None and other.id != job.id and self.rng.random() < 0.5:
            # A second proposal on the same GPUs, as a racing replica would make: void.
            placements.append(Placement(job_id=other.id, attempt=other.attempt, workers=slots))
        self.event(subject, JobsPlaced(based_on=based_on, now=now, placements=tuple(placements)))

    def start(self) -> None:
        job = self._pick("placed", "starting")
        if job is None or job.placement is None:
            return
        waiting = [w for w in job.placement.workers if w.rank not in job.started]
        if not waiting:
            return
        w = self.rng.choice(waiting)
        body = WorkerStarted(node=w.node, job_id=job.id, attempt=job.attempt, rank=w.rank, pid=4000 + w.rank)
        self.event(subjects.node(w.node), body)

    def _node_of(self, job: JobState, rank: int) -> str:
        held = job.held or job.placement
        assert held is not None
        return next(w.node for w in held.workers if w.rank == rank)

    def exit(self) -> None:
        jobs = [j for j in self.state.jobs.values() if j.live and (j.held or j.placement)]
        if not jobs:
            return
        job = self.rng.choice(jobs)
        rank = self.rng.choice(sorted(job.live))
        stopped = job.phase in ("checkpointing", "preempted", "cancelled")
        code = 0 if stopped or self.rng.random() < 0.8 else 1
        body = WorkerExited(
            node=self._node_of(job, rank),
            job_id=job.id,
            attempt=job.attempt,
            rank=rank,
            code=code,
            stopped=stopped,
        )
        self.event(subjects.node(body.node), body)

    def checkpoint(self) -> None:
        job = self._pick("running", "checkpointing")
        if job is None or not job.live:
            return
        node = self._node_of(job, min(job.live))
        step = self.rng.randint(1, 1000)
        body = CheckpointCompleted(
            node=node, job_id=job.id, attempt=job.attempt, location=f"/ckpt/{job.id}/{step}", step=step
        )
        self.event(subjects.node(node), body)

    def preempt(self) -> None:
        victim = self._pick("running", "placed", "starting")
        beneficiary = self._pick("queued", "admitted")
        if victim is None or beneficiary is None:
            return
        body = PreemptionRequested(
            based_on=self.state.seq,
            now=self.log.now,
            beneficiary=beneficiary.id,
            victims=(Victim(job_id=victim.id, attempt=victim.attempt),),
            deadline=self.log.now + 30,
        )
        self.event(subjects.decision("preemptor"), body)

    def requeue(self) -> None:
        job = self._pick("interrupted", "preempted")
        if job is None:
            return
        resume = job.checkpoint.location if job.checkpoint is not None else None
        body = JobRequeued(
            job_id=job.id,
            attempt=job.attempt,
            reason=Reason("interrupted", "back in line"),
            resume_from=resume,
        )
        self.event(subjects.job(job.id), body)

    def cancel(self) -> None:
        job = self._pick("queued", "admitted", "running", "succeeded")
        if job is None:
            return
        tenant = job.tenant if self.rng.random() < 0.8 else self.rng.choice((*TENANTS, subjects.ADMIN))
        self.request(tenant, "cancel", CancelJob(job_id=job.id, reason="no longer needed"))

    def resize(self) -> None:
        job = self._pick("queued", "running")
        if job is not None:
            self.request(job.tenant, "resize", ResizeJob(job_id=job.id, replicas=self.rng.randint(0, 3)))

    def pending(self) -> None:
        job = self._pick("queued", "admitted")
        if job is not None:
            reasons = (Reason("quota", "queue team-a is at its nominal quota of 16 GPUs"),)
            self.event(subjects.job(job.id), PendingReasonChanged(job_id=job.id, reasons=reasons))

    def node_health(self) -> None:
        node = self.rng.choice(list(self.state.nodes.values()))
        subject = subjects.node(node.name)
        roll = self.rng.random()
        body: Event
        if roll < 0.3 and node.gpus:
            gpu = self.rng.randrange(len(node.gpus))
            body = GpuHealthChanged(node=node.name, gpu=gpu, healthy=self.rng.random() < 0.4, signal="xid:79")
        elif roll < 0.6:
            conditions: tuple[NodeCondition, ...] = ("ready", "suspect", "lost")
            body = NodeConditionChanged(
                node=node.name, condition=self.rng.choice(conditions), reason="heartbeats"
            )
        elif roll < 0.8:
            body = NodeCordoned(node=node.name, cordoned=self.rng.random() < 0.5, drain=True)
        else:
            body = NodeRegistered(node=node.name, inventory=node.inventory)
        self.event(subject, body)

    def garbage(self) -> None:
        subject = self.rng.choice((subjects.job("job-1"), subjects.request("alpha", "submit")))
        self._append(subject, b'{"type": "JobAccepted", "job_id": 7')


def busy_log(seed: int, steps: int) -> Cluster:
    sim = Cluster(random.Random(seed))
    sim.setup()
    for _ in range(steps):
        sim.step()
    return sim


def small_state() -> State:
    return busy_log(7, 120).state


# -- round trip and what is discarded -----------------------------------------------------------


async def test_save_load_round_trip(tmp_path: Path) -> None:
    state = small_state()
    assert state.jobs and state.nodes
    async with await SnapshotStore.open(str(tmp_path / "snap.db")) as store:
        await store.save(state)
        loaded = await store.load()
    assert loaded == state
    assert loaded is not None and loaded.seq == state.seq


async def test_load_of_an_empty_store_is_none() -> None:
    async with await SnapshotStore.open(":memory:") as store:
        assert await store.load() is None


async def test_newest_wins_and_only_the_latest_few_are_kept(tmp_path: Path) -> None:
    sim = busy_log(3, 60)
    cuts = list(range(10, 20, 2))
    async with await SnapshotStore.open(str(tmp_path / "snap.db")) as store:
        for cut in cuts:
            await store.save(fold(sim.log.records[:cut]))
        loaded = await store.load()
        assert await store.seqs() == cuts[::-1][:KEEP]
    assert loaded is not None and loaded.seq == cuts[-1]


async def test_a_reopened_store_loads_what_was_saved(tmp_path: Path) -> None:
    path = str(tmp_path / "snap.db")
    state = small_state()
    async with await SnapshotStore.open(path) as store:
        await store.save(state)
    async with await SnapshotStore.open(path) as store:
        assert await store.load() == state


async def test_a_snapshot_of_another_format_is_discarded(tmp_path: Path) -> None:
    path = str(tmp_path / "snap.db")
    async with await SnapshotStore.open(path, format_id="0:older") as store:
        await store.save(small_state())
    async with await SnapshotStore.open(path) as store:
        assert await store.load() is None


async def test_a_snapshot_another_build_wrote_is_passed_over_aloud(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After an upgrade the replica's file holds only the older build's snapshots (other rules):
    the replica folds the whole log again, and says why, naming both."""
    path = str(tmp_path / "snap.db")
    async with await SnapshotStore.open(path, format_id="1.87:older") as store:
        await store.save(small_state())
    with caplog.at_level(logging.WARNING, logger="corral.snapshot"):
        async with await SnapshotStore.open(path) as store:
            assert await store.load() is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "(1.87:older; this one reads " in said[0] and "folding the log from the start" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="corral.snapshot"):
        async with await SnapshotStore.open(str(tmp_path / "empty.db")) as store:
            assert await store.load() is None
    assert not caplog.records  # a new file is no news


async def test_a_rolled_back_build_finds_its_own_snapshots(tmp_path: Path) -> None:
    """An upgrade that is rolled back: the new build's snapshots did not take the older build's
    place in the file, so the older build starts from its own newest, not from the log's first
    record. Only the build before the newest is kept beside it: a third's are let go."""
    path = str(tmp_path / "snap.db")
    sim = busy_log(3, 60)
    assert len(sim.log.records) >= 15

    async def saved(format_id: str, cuts: range) -> None:
        async with await SnapshotStore.open(path, format_id=format_id) as store:
            for cut in cuts:
                await store.save(fold(sim.log.records[:cut]))

    await saved("1.1:old", range(4, 9))
    await saved("1.2:new", range(9, 14))
    async with await SnapshotStore.open(path, format_id="1.1:old") as store:
        loaded = await store.load()
        assert await store.seqs() == [13, 12, 11, 8, 7, 6]
    assert loaded is not None and loaded.seq == 8
    await saved("1.3:newer", range(14, 16))
    async with await SnapshotStore.open(path, format_id="1.3:newer") as store:
        assert await store.seqs() == [15, 14, 13, 12, 11]


async def test_a_corrupt_snapshot_is_discarded_for_an_older_good_one(tmp_path: Path) -> None:
    path = str(tmp_path / "snap.db")
    sim = busy_log(5, 60)
    good = fold(sim.log.records[: len(sim.log.records) // 2])
    async with await SnapshotStore.open(path) as store:
        await store.save(good)
        await store.save(sim.state)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE snapshots SET state = ? WHERE seq = ?", (b"\xc1 torn write", sim.state.seq))
    async with await SnapshotStore.open(path) as store:
        assert await store.load() == good
    with sqlite3.connect(path) as db:
        db.execute("UPDATE snapshots SET state = ?", (msgspec.msgpack.encode({"seq": "not a state"}),))
    async with await SnapshotStore.open(path) as store:
        assert await store.load() is None


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _page_overwritten(data: bytes) -> bytes:
    page = 4096  # SQLite's default page size: the header page stays, a page of the table goes
    return data[: 2 * page] + bytes(range(256)) * (page // 256) + data[3 * page :]


def _not_a_database(data: bytes) -> bytes:
    return random.Random(7).randbytes(8192)


@pytest.mark.parametrize("damage", [_truncated, _page_overwritten, _not_a_database])
async def test_a_snapshot_file_sqlite_cannot_read_is_set_aside(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    # A service stopped on such a file at every restart, until someone removed it by hand.
    path = tmp_path / "snap.db"
    sim = busy_log(5, 60)
    async with await SnapshotStore.open(str(path)) as store:
        await store.save(sim.state)
    assert path.stat().st_size > 3 * 4096
    path.write_bytes(damage(path.read_bytes()))
    async with await SnapshotStore.open(str(path)) as store:
        assert await store.load() is None  # fold from the log
        await store.save(sim.state)  # and snapshots go on, in a new file
        assert await store.load() == sim.state
    assert [p.name for p in tmp_path.iterdir() if ".unreadable-" in p.name][:1], list(tmp_path.iterdir())


async def test_a_snapshot_file_another_connection_holds_is_not_set_aside(tmp_path: Path) -> None:
    # "database is locked" is a DatabaseError too: a healthy file another writer held was renamed
    # aside as unreadable. It is waited for (SQLite's busy timeout), then the error stands.
    path = tmp_path / "snap.db"
    await (await SnapshotStore.open(str(path))).close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode=DELETE")
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await SnapshotStore.open(str(path))
    finally:
        other.execute("COMMIT")
        other.close()
    assert [p.name for p in tmp_path.iterdir() if ".unreadable-" in p.name] == []


async def test_a_snapshot_whose_seq_disagrees_with_its_data_is_discarded(tmp_path: Path) -> None:
    path = str(tmp_path / "snap.db")
    async with await SnapshotStore.open(path) as store:
        await store.save(small_state())
    with sqlite3.connect(path) as db:
        db.execute("UPDATE snapshots SET seq = seq + 1")
    async with await SnapshotStore.open(path) as store:
        assert await store.load() is None


# -- restore ------------------------------------------------------------------------------------


async def test_restore_without_a_snapshot_folds_the_whole_log() -> None:
    sim = busy_log(11, 80)
    async with await SnapshotStore.open(":memory:") as store:
        assert await restore(store, sim.log) == sim.state


async def test_restore_ignores_a_snapshot_from_a_longer_log() -> None:
    sim = busy_log(12, 80)
    shorter = InMemoryLog()
    for r in sim.log.records[:40]:
        shorter.append_sync(Append(r.subject, r.data))
    async with await SnapshotStore.open(":memory:") as store:
        await store.save(sim.state)
        assert await restore(store, shorter) == fold(shorter.records)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(0, 250), cut=st.floats(0, 1))
def test_restore_from_a_snapshot_at_any_cut_equals_the_fold_of_everything(
    seed: int, steps: int, cut: float
) -> None:
    sim = busy_log(seed, steps)
    records = sim.log.records
    at = round(cut * len(records))

    async def go() -> State:
        async with await SnapshotStore.open(":memory:") as store:
            await store.save(fold(records[:at]))
            return await restore(store, sim.log)

    restored = asyncio.run(go())
    assert restored == sim.state
    # Byte-equal too: dict order survives, so whatever iterates the state decides the same.
    assert msgspec.msgpack.encode(restored) == msgspec.msgpack.encode(sim.state)
    assert sim.state.faults == 0, sim.state.rejections[-5:]


async def test_a_snapshot_of_another_stream_is_never_loaded(tmp_path: Path) -> None:
    """A stream deleted and created again under the same name may grow longer than a snapshot
    of the old one: the sequence alone cannot tell the two histories apart, the identity does."""
    path = str(tmp_path / "snap.db")
    state = fold(LogBuilder().queues("team-a").submit("alice", "j1", job()).records)
    async with await SnapshotStore.open(path, stream="CORRAL@2026-01-01T00:00:00") as store:
        await store.save(state)
    async with await SnapshotStore.open(path, stream="CORRAL@2026-06-01T00:00:00") as other:
        assert await other.load() is None
    async with await SnapshotStore.open(path, stream="CORRAL@2026-01-01T00:00:00") as same:
        loaded = await same.load()
        assert loaded is not None and loaded.seq == state.seq


async def test_a_stream_created_again_has_another_identity(tmp_path: Path) -> None:
    async with EmbeddedServer(tmp_path / "nats") as server:
        log = await JetStreamLog.connect(server.url, create=True)
        try:
            first = await log.identity()
            assert first.startswith("CORRAL@") and first == await log.identity()
            nc = await nats.connect(server.url)
            try:
                await nc.jetstream().delete_stream("CORRAL")
            finally:
                await nc.close()
            await log.ensure_stream()
            assert await log.identity() != first
        finally:
            await log.close()
