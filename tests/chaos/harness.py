"""A corral of separate processes for the chaos tests: one real nats-server (the test's), each
role as its own ``corral serve`` process (the intake too, which the agents report through),
node agents as ``corral serve agent`` processes running real (short) workers, a steady load of
submissions, and the checks every chaos test ends with.

Leases expire ``LEASE_TTL`` seconds after their holder's last renewal (the bucket is made with
that age, as ``corral up`` makes it with its own; every replica renews on the bucket's age), so
a standby takes over within seconds of its leader's death.

The checks, on the whole log once every process has stopped:

- every job placed at most once per attempt (placements the fold accepted, not proposals);
- no GPU held by two jobs at any point of the log;
- every submission the log acknowledged is a job of the state;
- no job stopped (preempted or shrunk) for a beneficiary already placed in its attempt: the fold
  voids such a stop, and this checks it by the placements themselves, not by the fold's rule;
- ``replay --verify`` clean: every decision re-run from the log decides the same;
- each surviving replica's own state (the snapshot it saved on SIGTERM) equals the log replayed
  up to the record it had folded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from corral.events import codec, subjects
from corral.events.base import Event
from corral.events.decisions import JobsPlaced, PreemptionRequested, ShrinkRequested
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append, LogError, Record
from corral.events.nodes import WorkerStarted
from corral.events.queues import ApplyPriorityClass, ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from corral.projections.fold import apply, fold
from corral.projections.snapshot import SnapshotStore
from corral.projections.state import State
from corral.services.cli.up import service_roles
from corral.services.cli.watch import Watcher
from corral.services.replay.verify import verify
from corral.services.runtime import status, views
from corral.services.runtime.lease import ensure_bucket
from tests.integration import polling

ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL = 3.0  # seconds a lease outlives its holder's last renewal
WAIT = 60.0  # the longest any one wait may take on a loaded 2-core machine
QUEUE = "team-a"
CLASSES = (PriorityClassSpec("batch", 10), PriorityClassSpec("urgent", 1000, preemptible=False))
LEASED = ("admission", "placer", "preemptor", "health", "assignments")


def pid_of(replica: str) -> int:
    """The process id in a replica's name, ``role@host:pid``."""
    return int(replica.rsplit(":", 1)[1])


def job(
    command: tuple[str, ...], gpus: int = 1, *, replicas: int = 1, priority_class: str = "normal"
) -> JobSpec:
    return JobSpec(
        queue=QUEUE,
        resources=Resources(gpus=gpus),
        replicas=replicas,
        command=command,
        priority_class=priority_class,
    )


@dataclass
class Part:
    """One process of the corral, with its stderr in a file."""

    name: str
    proc: subprocess.Popen[bytes]
    err: Path
    snapshot: Path | None
    killed: bool = False  # by the test, with SIGKILL: its end is no failure

    @property
    def pid(self) -> int:
        return self.proc.pid

    def said(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""


@dataclass
class Corral:
    url: str
    tmp: Path
    log: JetStreamLog
    watch: Watcher
    parts: dict[str, Part] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)  # submissions the log acknowledged
    # Heartbeat interval and lost-after of the agents and the health role (None: their defaults,
    # a node lost after a minute of silence).
    heartbeat: float | None = None
    lost_after: float | None = None
    _load: asyncio.Task[None] | None = None
    _loaded: int = 0  # load jobs submitted so far

    # -- processes ----------------------------------------------------------------------------------

    def start(self, name: str, *argv: str, snapshot: bool = True) -> Part:
        err = self.tmp / f"{name}.err"
        snap = self.tmp / f"{name}.sqlite" if snapshot else None
        cmd = [sys.executable, "-m", "corral", "serve", *argv, "--server", self.url]
        if snap is not None:
            cmd += ["--snapshot", str(snap)]
        with open(err, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        part = self.parts[name] = Part(name, proc, err, snap)
        return part

    def role(self, name: str, role: str) -> Part:
        return self.start(name, role, *(self.timing() if role == "health" else ()))

    def timing(self, agent: bool = False) -> tuple[str, ...]:
        flags = () if self.heartbeat is None else ("--heartbeat-s", str(self.heartbeat))
        if not agent and self.lost_after is not None:
            flags += ("--lost-after-s", str(self.lost_after))
        return flags

    def agent(self, node: str) -> Part:
        work = self.tmp / "nodes" / node
        return self.start(
            f"agent-{node}", "agent", "--node", node, "--work-dir", str(work), "--sandbox", "none",
            "--stop-workers", *self.timing(agent=True), snapshot=False,
        )  # fmt: skip

    def by_pid(self, pid: int) -> Part:
        return next(p for p in self.parts.values() if p.pid == pid)

    async def leader(self, role: str) -> Part:
        """The replica that leads ``role`` now, as the status board shows it."""

        held: list[int] = []

        async def led_by_a_part() -> bool:
            self.check_alive()
            holders, _ = await status.read(self.log.nc)
            h = holders.get(role)
            held[:] = [pid_of(h)] if h is not None else []
            return bool(held) and held[0] in {p.pid for p in self.parts.values()}

        await polling.until_answered(led_by_a_part, WAIT)
        return self.by_pid(held[0])

    def check_alive(self) -> None:
        for p in self.parts.values():
            if p.proc.poll() is not None and not p.killed:
                raise AssertionError(f"{p.name} exited with {p.proc.returncode}: {p.said()[-2000:]}")

    def kill(self, part: Part, sig: signal.Signals = signal.SIGKILL) -> None:
        if sig == signal.SIGKILL:
            part.killed = True
        os.kill(part.pid, sig)

    async def says(self, part: Part, text: str, count: int = 1) -> None:
        """Wait until the part's stderr holds ``text`` ``count`` times (its leading and
        standing-by lines)."""
        await polling.until(lambda: part.said().count(text) >= count, WAIT)

    async def stop_all(self) -> None:
        """SIGTERM every live part (each saves its snapshot and gives its lease up), then
        SIGKILL what has not ended: the agents first, whose last reports go through the
        intake, then the rest."""
        live = [p for p in self.parts.values() if p.proc.poll() is None]
        agents = [p for p in live if p.name.startswith("agent-")]
        for wave in (agents, [p for p in live if p not in agents]):
            for p in wave:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
            for p in wave:
                try:
                    await asyncio.to_thread(p.proc.wait, 30)
                except subprocess.TimeoutExpired:
                    p.proc.kill()
                    await asyncio.to_thread(p.proc.wait)

    # -- work -----------------------------------------------------------------------------------------

    async def request(self, tenant: str, verb: str, body: Event, msg_id: str) -> int:
        return (await self.log.append(Append(subjects.request(tenant, verb), codec.encode(body), msg_id))).seq

    async def submit(self, job_id: str, spec: JobSpec) -> None:
        await self.request(QUEUE, "submit", SubmitJob(request_id=job_id, job=spec), f"submit:{job_id}")
        self.acked.add(job_id)

    def start_load(self, every: float = 0.5) -> None:
        """A steady stream of one-GPU jobs of two seconds each, one every ``every`` seconds; a
        submission the log did not acknowledge is not counted (a client would retry it)."""

        async def load() -> None:
            while True:
                i, self._loaded = self._loaded, self._loaded + 1  # a load started again goes on counting
                with contextlib.suppress(LogError):
                    await self.submit(f"load-{i:04d}", job(("sleep", "2")))
                await asyncio.sleep(every)

        self._load = asyncio.create_task(load())

    async def stop_load(self) -> None:
        if self._load is not None:
            self._load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._load

    async def until(self, predicate: Callable[[State], bool], timeout: float = WAIT) -> State:
        return await self.watch.until(predicate, timeout)

    async def decided_by(self, part: Part, after: int, timeout: float = WAIT) -> Record:
        """Wait for the first record after seq ``after`` that ``part`` wrote."""
        found: list[Record] = []

        def seen(_: State) -> bool:
            for r in reversed(self.watch.records):
                if r.seq <= after:
                    break
                if r.subject.startswith("corral.ev.") and producer(r).endswith(f":{part.pid}"):
                    found.append(r)
                    return True
            return False

        await self.until(seen, timeout)
        return found[0]

    # -- the checks every chaos test ends with ---------------------------------------------------------

    async def check(self) -> None:
        await self.stop_load()
        await self.stop_all()
        state = await self.watch.caught_up()
        records = list(self.watch.records)
        check_placed_once_and_gpus_unshared(records)
        check_no_stop_for_a_placed_job(records)
        missing = self.acked - state.jobs.keys()
        assert not missing, f"acknowledged submissions missing: {sorted(missing)[:10]}"
        report = verify(records, service_roles())
        assert report.clean, report.divergences[:3]
        assert fold(records) == state
        assert state.faults == 0
        compared = 0
        identity = await self.log.identity()
        for p in self.parts.values():
            if p.snapshot is None or p.killed or not p.snapshot.exists():
                continue
            async with await SnapshotStore.open(p.snapshot, stream=identity) as store:
                live = await store.load()
            assert live is not None, f"{p.name} saved no state"
            assert live == fold([r for r in records if r.seq <= live.seq]), f"{p.name}: live state != replay"
            compared += 1
        assert compared, "no surviving replica's state to compare"
        kill_workers(records)


def producer(r: Record) -> str:
    """Who wrote a record: a service's or an agent's envelope names it; a client's request
    (``corral.in.<tenant>.<verb>``, the request's bytes as sent) names nobody."""
    if subjects.parse_request(r.subject) is not None:
        return ""
    return codec.decode_envelope(r.data).producer


def check_placed_once_and_gpus_unshared(records: Iterable[Record]) -> None:
    """Fold the log record by record: each (job, attempt) placed by at most one accepted
    placement, and no GPU of any node in two jobs' held placements at any point."""
    state = State()
    placed: Counter[tuple[str, int]] = Counter()
    for r in records:
        proposals: list[tuple[str, int]] = []
        if r.subject == subjects.decision("placer"):
            body = codec.decode_envelope(r.data).body
            if isinstance(body, JobsPlaced):
                proposals = [(p.job_id, p.attempt) for p in body.placements]
        before = {j: state.jobs[j].placement for j, _ in proposals if j in state.jobs}
        apply(state, r)
        for j, attempt in proposals:
            now = state.jobs[j].placement if j in state.jobs else None
            if now is not None and now is not before.get(j) and now.attempt == attempt:
                placed[(j, attempt)] += 1
        holders: dict[tuple[str, int], str] = {}
        for jb in state.jobs.values():
            for w in jb.held.workers if jb.held is not None else ():
                for c in w.gpus:
                    key = (w.node, c.gpu)
                    assert key not in holders, f"seq {r.seq}: GPU {key} held by {holders[key]} and {jb.id}"
                    holders[key] = jb.id
    twice = [k for k, n in placed.items() if n > 1]
    assert not twice, f"placed more than once in one attempt: {twice}"
    assert placed, "nothing was placed"


def check_no_stop_for_a_placed_job(records: Iterable[Record]) -> None:
    """Fold the log record by record: every stop the fold accepted (a preemption, a shrink) was
    for a beneficiary with no accepted placement in its current attempt."""
    state = State()
    placed: set[tuple[str, int]] = set()  # (job, attempt) with an accepted placement
    for r in records:
        body = codec.decode_envelope(r.data).body if r.subject.startswith("corral.ev.") else None
        proposals = [(p.job_id, p.attempt) for p in body.placements] if isinstance(body, JobsPlaced) else []
        before = {j: state.jobs[j].placement for j, _ in proposals if j in state.jobs}
        refused = state.rejected_total
        beneficiary = None
        if isinstance(body, PreemptionRequested | ShrinkRequested) and body.beneficiary in state.jobs:
            beneficiary = (body.beneficiary, state.jobs[body.beneficiary].attempt)
        apply(state, r)
        for j, attempt in proposals:
            now = state.jobs[j].placement if j in state.jobs else None
            if now is not None and now is not before.get(j) and now.attempt == attempt:
                placed.add((j, attempt))
        if beneficiary is not None and state.rejected_total == refused:  # the stop was accepted
            assert beneficiary not in placed, f"seq {r.seq}: {body} accepted for a job already placed"


def kill_workers(records: Iterable[Record]) -> None:
    """Workers outlive a killed agent (their keepers run on): end those still running."""
    for r in records:
        if r.subject.startswith("corral.ev.node."):
            body = codec.decode_envelope(r.data).body
            if isinstance(body, WorkerStarted) and body.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(body.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def corral(  # type: ignore[no-untyped-def]
    url: str,
    tmp: Path,
    roles: dict[str, int],
    nodes: int = 2,
    *,
    heartbeat: float | None = None,
    lost_after: float | None = None,
):
    """A corral on the nats-server at ``url``: ``roles[r]`` replicas of each role (started one
    after the other, so the first leads), ``nodes`` agents, queue ``team-a``; ``heartbeat`` and
    ``lost_after`` shorten the health timing. Every process is stopped on the way out, however
    the test ends."""
    log = await JetStreamLog.connect(url, create=True, name="chaos")
    await ensure_bucket(log.nc, LEASE_TTL)
    await views.ensure_bucket(log.nc)
    c: Corral | None = None
    try:
        async with Watcher(log) as watch:
            c = Corral(url, tmp, log, watch, heartbeat=heartbeat, lost_after=lost_after)
            for pc in CLASSES:
                await c.request("admin", "priority-class", ApplyPriorityClass(priority_class=pc), pc.name)
            queue = QueueSpec(QUEUE, quotas={"*": Quota(nominal=1000)}, tenants=(QUEUE,))
            await c.request("admin", "queue", ApplyQueue(queue=queue), f"queue:{QUEUE}")
            for role, n in roles.items():
                for i in range(n):
                    c.role(f"{role}-{i}", role)
                    if i == 0 and n > 1:
                        await c.leader(role)  # the first replica leads; the next stands by
            c.start("intake-0", "intake", snapshot=False)  # the agents' reports come through it
            for i in range(nodes):
                c.agent(f"node-{i}")
            await c.until(lambda s: QUEUE in s.queues and len(s.nodes) == nodes)
            yield c
    finally:
        if c is not None:
            await c.stop_load()
            await c.stop_all()
        await log.close()
