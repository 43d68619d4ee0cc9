"""The agent's runtime with real processes: the environment contract, logs, exit codes, stops,
the gang start barrier, checkpoint and resume with ``examples/train.py``, and bubblewrap sandboxes
with data mounts.

Nothing here sleeps: every test waits for the runtime's next report (or a process's exit) with a
timeout. Where a test runs in both modes, ``bwrap`` is skipped only when bubblewrap is missing
or cannot create namespaces on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from corral.events import subjects as subj
from corral.events.codec import decode_record
from corral.events.jobs import JobSpec, Mount
from corral.events.log import Ack, Append, EventLog, InMemoryLog, LogError, UnstorableError
from corral.events.nodes import WorkerExited, WorkerStarted
from corral.projections.assignments import GpuBinding, node_view
from corral.projections.state import State
from corral.services.agent.decide import (
    GONE_CODE,
    Action,
    Checkpointed,
    Exited,
    Report,
    ReportGone,
    RequestCheckpoint,
    Started,
    StartFailed,
    StartGang,
    StartWorker,
    StopWorker,
    WorkerKey,
    decide,
    report_events,
)
from corral.services.agent.service import NodeAgent
from corral.services.agent.worker import REQUEST, job_logs, log_path
from corral.services.agent.workers import Runtime, SandboxMode, restart_backoff
from corral.services.health.decide import sample_signals
from corral.services.runtime import output
from corral.services.runtime.views import MemoryViews
from tests.builders import Cluster, LogBuilder, job, on, placement, whole, worker
from tests.integration import polling
from tests.unit.test_worker_output import Kept

N0 = "node-00"
WAIT = 60.0  # generous: a loaded 2-core CI machine starts Python with numpy slowly
TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")
PY = sys.executable
MODES: list[SandboxMode] = ["none", "bwrap"]


def ran(report: object) -> object:
    """An exit report without the pid it carries (each run's own), to compare with an expected one."""
    return msgspec.structs.replace(report, pid=0) if isinstance(report, Exited) else report


async def bwrap_works() -> bool:
    return await Runtime("/nonexistent", sandbox="auto").sandboxed()


@pytest.fixture(params=MODES)
async def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Runtime]:
    mode: SandboxMode = request.param
    if mode == "bwrap" and not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    rt = Runtime(tmp_path / "agent", sandbox=mode, poll_interval=0.02)
    try:
        yield rt
    finally:
        await rt.close(grace=2.0)


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[Runtime]:
    rt = Runtime(tmp_path / "agent", sandbox="none", poll_interval=0.02)
    try:
        yield rt
    finally:
        await rt.close(grace=2.0)


async def until(rt: Runtime, want: Callable[[Report], bool], timeout: float = WAIT) -> list[Report]:
    """Reports up to and including the first one ``want`` accepts."""
    seen: list[Report] = []
    while True:
        r = await rt.next_report(timeout)
        seen.append(r)
        if want(r):
            return seen


def exit_of(key: WorkerKey) -> Callable[[Report], bool]:
    return lambda r: isinstance(r, Exited) and r.key == key


def spec_for(tmp: Path, job_id: str, command: list[str], rank: int = 0, **kw: object) -> StartWorker:
    ckpt = tmp / "ckpt" / job_id
    base = StartWorker(
        job_id=job_id,
        attempt=0,
        rank=rank,
        gpus=(),
        env={"CORRAL_JOB_ID": job_id, "CORRAL_CHECKPOINT_DIR": str(ckpt / f"rank-{rank}")},
        command=tuple(command),
        checkpoint_dir=str(ckpt / f"rank-{rank}"),
        job_checkpoint_dir=str(ckpt),
    )
    return msgspec.structs.replace(base, **kw)


LOOP = "import time\nwhile True: time.sleep(0.05)"  # the worker waits; the test never does


# -- the environment contract and logs ------------------------------------------------------------

DUMP = (
    "import json, os\n"
    "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',\n"
    "        'CUDA_VISIBLE_DEVICES', 'CORRAL_JOB_ID', 'CORRAL_ATTEMPT', 'CORRAL_CHECKPOINT_DIR', 'DATASET']\n"
    "print(json.dumps({'env': {k: os.environ.get(k) for k in keys}, 'cwd': os.getcwd(),\n"
    "    'ckpt_writable': os.access(os.environ['CORRAL_CHECKPOINT_DIR'], os.W_OK)}))\n"
    "print('to stderr', file=__import__('sys').stderr)\n"
)


def gang_state(spec: JobSpec, ranks: int = 2) -> State:
    log = LogBuilder().nodes(Cluster(1)).queues("team-a", "team-b")
    log.submit("alice", "g", spec).accept("g").admit("g", replicas=ranks)
    log.place(placement("g", *(worker(r, N0, whole(r + 2)) for r in range(ranks))))
    state = log.fold()
    assert state.jobs["g"].phase == "placed"
    return state


async def test_workers_get_the_rendezvous_environment_and_their_logs_are_kept(
    runtime: Runtime, tmp_path: Path
) -> None:
    spec = msgspec.structs.replace(
        job().replicas(2).build(), command=(PY, "-c", DUMP), env={"DATASET": "imagenet"}
    )
    [gang] = decide(node_view(gang_state(spec), N0), runtime.workers(), 0.0, str(tmp_path / "ckpt"))
    assert isinstance(gang, StartGang)
    result = await runtime.start_gang(gang.workers, timeout=WAIT)
    assert result.started == (WorkerKey("g", 0, 0), WorkerKey("g", 0, 1)) and result.failed is None
    reports = await until(runtime, exit_of(WorkerKey("g", 0, 0)))
    if not any(exit_of(WorkerKey("g", 0, 1))(r) for r in reports):
        reports += await until(runtime, exit_of(WorkerKey("g", 0, 1)))
    starts = [r for r in reports if isinstance(r, Started)]
    assert [r.key.rank for r in starts] == [0, 1] and all(r.pid > 0 for r in starts)
    assert sorted((r.key.rank, r.code, r.stopped) for r in reports if isinstance(r, Exited)) == [
        (0, 0, False),
        (1, 0, False),
    ]
    run = gang.workers[0].run  # the submission's log position: this job id's run (``decide.run_dir``)
    logs = job_logs(runtime.root, "g")
    assert logs == [log_path(runtime.root, WorkerKey("g", 0, r), run) for r in (0, 1)]
    assert logs[0].parent == runtime.root / "logs" / "g" / f"run-{run}"
    for rank, path in enumerate(logs):
        first, second = path.read_text().splitlines()
        seen = json.loads(first)
        assert seen["env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",  # simulated nodes advertise loopback
            "MASTER_PORT": gang.workers[0].env["MASTER_PORT"],
            "CUDA_VISIBLE_DEVICES": f"GPU-{N0}-0{rank + 2}",
            "CORRAL_JOB_ID": "g",
            "CORRAL_ATTEMPT": "0",
            "CORRAL_CHECKPOINT_DIR": f"{tmp_path}/ckpt/g/run-{run}/attempt-0/rank-{rank}",
            "DATASET": "imagenet",
        }
        assert seen["cwd"].endswith(f"work/g/run-{run}/attempt-0/rank-{rank}") and seen["ckpt_writable"]
        assert second == "to stderr"
    # The fold agrees: both ranks started, both exited 0, the job succeeded.
    log = LogBuilder().nodes(Cluster(1)).queues("team-a")
    log.submit("alice", "g", spec).accept("g").admit("g", replicas=2)
    log.place(placement("g", *(worker(r, N0, whole(r + 2)) for r in range(2))))
    for r in reports:
        for ev in report_events(N0, r):
            log.event(subj.node(N0), ev)
    assert log.fold().jobs["g"].phase == "succeeded"


_AGENT_OTLP = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example:4318",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/corral/collector-ca.pem",
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer agent-secret",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=agent-secret",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/corral/agent.key",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "/etc/corral/agent.crt",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "agent:secret@collector.example:4317",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://collector.example:4318/v1/metrics?api_key=secret",
}


async def test_a_worker_is_told_where_spans_go_but_not_the_agents_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job can send its spans where the agent sends its own; the collector's tokens and the
    agent's client key stay the agent's: any job on the node could read its environment."""
    for name in [n for n in os.environ if "OTLP" in n]:  # what this machine sets, if anything
        monkeypatch.delenv(name)
    for name, value in _AGENT_OTLP.items():
        monkeypatch.setenv(name, value)
    rt = Runtime(tmp_path / "agent", sandbox="none", poll_interval=0.02)
    dump = "import json, os\nprint(json.dumps({k: v for k, v in os.environ.items() if 'OTLP' in k}))"
    try:
        s = spec_for(tmp_path, "o", [PY, "-c", dump])
        assert (await rt.start_gang([s], timeout=WAIT)).failed is None
        await until(rt, exit_of(s.key))
        seen = json.loads(rt.log_of(s.key).read_text().splitlines()[0])
    finally:
        await rt.close(grace=2.0)
    assert seen == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example:4318",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/corral/collector-ca.pem",
    }


async def test_an_agent_ships_an_ended_workers_file_whole_before_it_reports_its_exit(tmp_path: Path) -> None:
    """The file the runtime knows the worker wrote (its job's run's) is shipped whole, its
    unfinished last line too, on its run's subject, before the exit is appended: whoever waited
    for the job to end and then reads its output finds all of it. No shipping pass runs here
    (the agent is not running): only the drain before the exit can have shipped it."""
    sink = Kept()
    work = tmp_path / "agent"
    agent = NodeAgent(N0, InMemoryLog(), MemoryViews(), work_dir=work, output=sink, sandbox="none")
    s = spec_for(tmp_path, "ended", [PY, "-c", "print('first'); print('last words', end='')"], run=7)
    try:
        assert (await agent.runtime.start_gang([s], timeout=WAIT)).failed is None
        assert await agent.runtime.wait_exited(s.key, WAIT) == 0
        assert sink.sent == {}
        assert await agent.flush() == 2  # its start and its exit
        assert sink.text(output.subject(N0, "ended", 7, 0, 0)) == "first\nlast words\n"
        assert list(sink.sent) == [output.subject(N0, "ended", 7, 0, 0)]
    finally:
        await agent.runtime.close(grace=2.0)


async def test_an_agent_reads_the_files_of_the_workers_it_knows_and_lets_go_of_the_forgotten(
    tmp_path: Path,
) -> None:
    """The shipper reads a worker's file while the runtime knows the worker, and lets it go once
    the runtime forgot it and all of it went out: an agent's passes cost its recent workers, not
    every worker its node ran."""
    sink = Kept()
    agent = NodeAgent(
        N0, InMemoryLog(), MemoryViews(), work_dir=tmp_path / "agent", output=sink, sandbox="none"
    )
    s = spec_for(tmp_path, "brief", [PY, "-c", "print('hello')"], run=4)
    assert agent.shipper is not None
    try:
        assert (await agent.runtime.start_gang([s], timeout=WAIT)).failed is None
        path = agent.runtime.log_of(s.key)
        assert await agent.runtime.wait_exited(s.key, WAIT) == 0
        assert agent._worker_files() == [path]
        await agent.shipper.ship(full=True)
        assert path in agent.shipper._files  # exited, its exit not yet in the log: still its
        agent.runtime.forget(s.key)
        await agent.shipper.ship(full=True)
        assert path not in agent.shipper._files
        assert sink.text(output.subject(N0, "brief", 4, 0, 0)) == "hello\n"
    finally:
        await agent.runtime.close(grace=2.0)


class _FailsOnce(InMemoryLog):
    """A log whose first append of a worker's start fails (a timeout, a leader change), or,
    ``hangs``, never answers (an agent's bounded last flush gives up on it)."""

    failed = False
    hangs = False
    refuses = False  # for good: larger than a message may be

    async def append(self, item: Append) -> Ack:
        if not self.failed and item.msg_id is not None and item.msg_id.startswith("started:"):
            self.failed = True
            if self.hangs:
                await asyncio.Event().wait()
            if self.refuses:
                raise UnstorableError("message size exceeds maximum allowed (10054)")
            raise LogError("timed out waiting for an acknowledgement")
        return await super().append(item)

    async def append_many(self, items: Sequence[Append]) -> list[Ack | LogError]:
        return [await self._one(item) for item in items]

    async def _one(self, item: Append) -> Ack | LogError:
        try:
            return await self.append(item)
        except LogError as e:
            return e


@contextlib.asynccontextmanager
async def _after_a_worker(tmp_path: Path, log: EventLog, **options: Any) -> AsyncIterator[NodeAgent]:
    """An agent on ``log`` whose worker has started and exited, its reports not flushed yet."""
    agent = NodeAgent(N0, log, MemoryViews(), work_dir=tmp_path / "agent", sandbox="none", **options)
    s = spec_for(tmp_path, "o", [PY, "-c", "print('bye')"], run=3)
    try:
        assert (await agent.runtime.start_gang([s], timeout=WAIT)).failed is None
        assert await agent.runtime.wait_exited(s.key, WAIT) == 0
        yield agent
    finally:
        await agent.runtime.close(grace=2.0)


async def _stored(log: EventLog) -> list[type]:
    return [type(decode_record(r.subject, r.data)[0]) async for batch in log.read() for r in batch]


async def test_a_report_the_log_refuses_for_good_holds_back_no_other(tmp_path: Path) -> None:
    """Kept in front of the others, a report the log can never store (too large) held back every
    later report of every job on the node: it is dropped, and counted."""
    log = _FailsOnce()
    log.refuses = True
    async with _after_a_worker(tmp_path, log) as agent:
        assert await agent.flush() == 2 and agent.reports_dropped == 1
        assert await agent.flush() == 0
    assert await _stored(log) == [WorkerExited]


class _Stuck(Kept):
    """An output stream that never answers."""

    async def send(self, subj: str, data: bytes, offset: int) -> None:
        await asyncio.Event().wait()


async def test_a_flush_cut_short_while_output_ships_keeps_every_report(tmp_path: Path) -> None:
    """An exit's output ships before the exit is appended; a bounded last flush cut short there
    lost every report, the node's shutdown among them."""
    async with _after_a_worker(tmp_path, InMemoryLog(), output=_Stuck()) as agent:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(agent.flush(), 0.3)
        assert [type(b) for b in agent._unsent] == [WorkerStarted, WorkerExited]


async def test_a_jobs_failed_report_holds_back_only_that_jobs_later_ones(tmp_path: Path) -> None:
    """Each job's reports go one after the other, the jobs' side by side: one job's failed start
    keeps its exit back, not another job's reports."""
    log = _FailsOnce()
    agent = NodeAgent(N0, log, MemoryViews(), work_dir=tmp_path / "agent", sandbox="none")
    a, b = (spec_for(tmp_path, j, [PY, "-c", "pass"], run=3) for j in ("a", "b"))
    try:
        for s in (a, b):  # a's start is the first the log sees, and fails
            assert (await agent.runtime.start_gang([s], timeout=WAIT)).failed is None
            assert await agent.runtime.wait_exited(s.key, WAIT) == 0
        assert await agent.flush() == 2  # b's start and exit
        assert [(type(e), e.job_id) for e in agent._unsent] == [(WorkerStarted, "a"), (WorkerExited, "a")]
        assert await agent.flush() == 2
    finally:
        await agent.runtime.close(grace=2.0)
    stored = [decode_record(r.subject, r.data)[0] async for batch in log.read() for r in batch]
    assert [(type(e), e.job_id) for e in stored] == [
        (WorkerStarted, "b"),
        (WorkerExited, "b"),
        (WorkerStarted, "a"),
        (WorkerExited, "a"),
    ]


@pytest.mark.parametrize("hangs", [False, True], ids=["fails", "cancelled"])
async def test_reports_are_stored_in_the_order_they_were_made_when_one_append_fails(
    tmp_path: Path, hangs: bool
) -> None:
    """A report whose append failed was sent again after the ones behind it were stored: an exit
    before its start, a checkpoint after its worker's exit (lost, the attempt holding nothing).
    A flush cut short while an append hangs keeps what it did not store, in order."""
    log = _FailsOnce()
    log.hangs = hangs
    async with _after_a_worker(tmp_path, log) as agent:
        if hangs:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(agent.flush(), 0.2)
        else:
            assert await agent.flush() == 0  # the start failed: nothing after it is sent
        assert log.failed
        assert await agent.flush() == 2
    assert await _stored(log) == [WorkerStarted, WorkerExited]


# -- exit codes and stops --------------------------------------------------------------------------


async def start_one(rt: Runtime, s: StartWorker) -> None:
    result = await rt.start_gang([s], timeout=WAIT)
    assert result.failed is None, result.reason
    assert await until(rt, lambda r: isinstance(r, Started))


async def last_line_of(rt: Runtime, s: StartWorker) -> Any:
    """Start ``s``, wait for it to exit 0, and read the JSON of its log's last line."""
    await start_one(rt, s)
    exited = (await until(rt, exit_of(s.key)))[-1]
    assert ran(exited) == Exited(s.key, 0), log_path(rt.root, s.key, s.run).read_text()
    return json.loads(log_path(rt.root, s.key, s.run).read_text().splitlines()[-1])


async def test_exit_codes_are_reported(runtime: Runtime, tmp_path: Path) -> None:
    s = spec_for(tmp_path, "e", [PY, "-c", "import sys; sys.exit(3)"])
    await start_one(runtime, s)
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 3, stopped=False)
    assert runtime.workers() == {s.key: "exited"}


async def test_a_worker_killed_by_a_signal_reports_128_plus_the_signal(
    runtime: Runtime, tmp_path: Path
) -> None:
    s = spec_for(tmp_path, "k", [PY, "-c", LOOP])
    await start_one(runtime, s)
    pid = runtime.pid(s.key)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # kill -9 from outside corral: a crash, not a stop
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 128 + signal.SIGKILL, stopped=False)


async def test_stop_sends_sigterm_and_reports_a_stopped_exit(runtime: Runtime, tmp_path: Path) -> None:
    s = spec_for(tmp_path, "t", [PY, "-c", LOOP])
    await start_one(runtime, s)
    await runtime.act(StopWorker(s.key, "cancelled", grace=WAIT))
    assert runtime.workers()[s.key] == "stopping"
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 128 + signal.SIGTERM, stopped=True)


# Ignores SIGTERM, then says so the only way a worker talks to the agent: a checkpoint report.
STUBBORN = (
    "import json, os, pathlib, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
    "(d / 'x.tmp').write_text(json.dumps({'step': 0, 'location': 'armed'}))\n"
    "os.replace(d / 'x.tmp', d / 'DONE')\n"
    "while True: time.sleep(0.05)\n"
)


async def test_a_worker_ignoring_sigterm_is_killed_after_its_grace(runtime: Runtime, tmp_path: Path) -> None:
    s = spec_for(tmp_path, "s", [PY, "-c", STUBBORN])
    await start_one(runtime, s)
    assert await runtime.next_report(WAIT) == Checkpointed(s.key, 0, "armed")  # SIGTERM is ignored now
    await runtime.stop(s.key, grace=0.3)
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 128 + signal.SIGKILL, stopped=True)


# Plants a link where the agent writes its request, and a FIFO where it reads DONE from; then
# says it is ready the only way a worker talks to the agent, a checkpoint of a directory of its own.
PLANTS = (
    "import json, os, pathlib, signal, sys, time\n"
    "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
    "(d / 'REQUEST.tmp').symlink_to(sys.argv[1])\n"
    "(d / 'x.tmp').write_text(json.dumps({'step': 0, 'location': 'armed'}))\n"
    "os.replace(d / 'x.tmp', d / 'DONE')\n"
    "while (d / 'DONE').exists(): time.sleep(0.02)\n"
    "os.mkfifo(d / 'DONE')\n"
    "(d / 'planted').touch()\n"
    "while True: time.sleep(0.05)\n"
)


async def test_a_worker_cannot_lead_the_agent_to_write_or_wait_on_a_file_of_its_choosing(
    runtime: Runtime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent (often root) writes ``REQUEST`` and reads ``DONE`` in a directory the worker
    owns: a link planted as ``REQUEST.tmp`` had it truncate and write the file the link named,
    and a FIFO as ``DONE`` held its loop for ever, waiting for a writer."""
    runtime.report_every = 0.5  # the FIFO is met at the poll after "armed", not 30 s later
    victim = tmp_path / "not-the-workers"
    victim.write_text("kept\n")
    s = spec_for(tmp_path, "p", [PY, "-c", PLANTS, str(victim)])
    await start_one(runtime, s)
    assert await runtime.next_report(WAIT) == Checkpointed(s.key, 0, "armed")
    ckpt = Path(s.checkpoint_dir)
    await polling.until(lambda: (ckpt / "planted").exists(), WAIT)
    await polling.until(lambda: "DONE is not a regular file" in caplog.text, WAIT)  # not opened
    await runtime.request_checkpoint(s.key, 1234.5)
    assert victim.read_text() == "kept\n"
    assert (ckpt / "REQUEST").read_text() == "1234.500\n" and not (ckpt / "REQUEST").is_symlink()
    await runtime.stop(s.key, grace=0.1)  # its polls went on past the FIFO: it still stops
    [exited] = await until(runtime, exit_of(s.key))
    assert isinstance(exited, Exited) and exited.stopped


# Writes DONEs no report can carry, each once the agent took the one before, then a good one.
BAD_DONES = (
    "import json, os, pathlib, time\n"
    "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
    'for text in (\'{"step": Infinity, "location": "/c"}\', \'{"step": true, "location": "/c"}\',\n'
    '             \'{"step": 1, "location": "/c/\\\\ud800"}\', \'{"step": 1, "location": "/c/\\\\u0000"}\',\n'
    '             \'{"step": 1, "location": 7}\', \'{"step": 12.0, "location": "/c/good"}\'):\n'
    "    (d / 'x.tmp').write_text(text)\n"
    "    os.replace(d / 'x.tmp', d / 'DONE')\n"
    "    while (d / 'DONE').exists(): time.sleep(0.02)\n"
)


async def test_a_done_no_report_can_carry_is_ignored_and_the_worker_still_watched(
    plain: Runtime, tmp_path: Path
) -> None:
    """A step of Infinity ended the watch of its worker (an OverflowError), whose exit was then
    never reported; a location with a lone surrogate made a report no codec writes, and one
    with a NUL the next attempt's CORRAL_RESUME_FROM, which no process can be given."""
    s = spec_for(tmp_path, "bad", [PY, "-c", BAD_DONES])
    assert await checkpoints_until_exit(plain, s) == [Checkpointed(s.key, 12, "/c/good")]


async def checkpoints_until_exit(rt: Runtime, s: StartWorker) -> list[Checkpointed]:
    """Run ``s`` until it exits 0; the checkpoints reported meanwhile."""
    await start_one(rt, s)
    reports = await until(rt, exit_of(s.key))
    assert ran(reports[-1]) == Exited(s.key, 0)
    return [r for r in reports if isinstance(r, Checkpointed)]


# Writes a checkpoint every 10 ms for 2 s, steps 1..200, then one behind them.
DONE_FLOOD = (
    "import json, os, pathlib, time\n"
    "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
    "def done(step):\n"
    "    (d / 'x.tmp').write_text(json.dumps({'step': step, 'location': f'/c/{step}'}))\n"
    "    os.replace(d / 'x.tmp', d / 'DONE')\n"
    "for step in range(1, 201):\n"
    "    done(step)\n"
    "    time.sleep(0.01)\n"
    "while (d / 'DONE').exists(): time.sleep(0.02)\n"
    "done(7)\n"
    "while (d / 'DONE').exists(): time.sleep(0.02)\n"
)


async def test_a_worker_writing_checkpoints_in_a_loop_is_reported_at_most_once_an_interval(
    plain: Runtime, tmp_path: Path
) -> None:
    """Every DONE the agent saw was a report, so a record of the log: a worker writing one in a
    loop (a CPU-only job needs no quota) grew the log by a record a poll, for ever. Unasked
    checkpoints go at most once in ``report_every``, each past the step before; the last one,
    as the worker ends, at once; one behind the step reported is not reported."""
    plain.report_every = 0.5
    s = spec_for(tmp_path, "flood", [PY, "-c", DONE_FLOOD])
    steps = [r.step for r in await checkpoints_until_exit(plain, s)]
    assert 1 <= len(steps) <= 2.0 / 0.5 + 2, steps  # one a poll (every 20 ms) before
    assert steps == sorted(set(steps)) and steps[-1] == 200, steps


# Watches its checkpoint directory, as a worker that takes no signals does: a periodic checkpoint
# (taken), another (waiting for its turn), then the one a request asks for; exits 3 if no
# request comes.
ASKED_AFTER_PERIODIC = (
    "import json, os, pathlib, sys, time\n"
    "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
    "def done(step, what):\n"
    "    (d / 'x.tmp').write_text(json.dumps({'step': step, 'location': f'/c/{what}-{step}'}))\n"
    "    os.replace(d / 'x.tmp', d / 'DONE')\n"
    "done(100, 'periodic')\n"
    "while (d / 'DONE').exists(): time.sleep(0.02)\n"
    "done(200, 'periodic')\n"
    "(d / 'ready').touch()\n"
    "end = time.monotonic() + 60\n"
    "while not (d / 'REQUEST').exists():\n"
    "    if time.monotonic() > end: sys.exit(3)\n"
    "    time.sleep(0.02)\n"
    "done(300, 'asked')\n"
    "while (d / 'DONE').exists(): time.sleep(0.02)\n"
)


async def test_a_checkpoint_written_before_a_request_does_not_answer_it(
    plain: Runtime, tmp_path: Path
) -> None:
    """A periodic DONE waiting for its turn when a request came was taken as the answer: the
    request's file removed before a worker that watches it saw it, the preemption going on
    with a checkpoint up to 30 s old. It is reported as the request is made; the request is
    answered by the DONE written after it."""
    s = spec_for(tmp_path, "asked", [PY, "-c", ASKED_AFTER_PERIODIC])
    await start_one(plain, s)
    await until(plain, lambda r: isinstance(r, Checkpointed))
    ready = Path(s.checkpoint_dir) / "ready"
    await polling.until(ready.exists, WAIT)
    await plain.request_checkpoint(s.key, 1234.0)
    reports = await until(plain, exit_of(s.key))
    steps = [(r.step, r.location) for r in reports if isinstance(r, Checkpointed)]
    assert steps == [(200, "/c/periodic-200"), (300, "/c/asked-300")], steps
    assert ran(reports[-1]) == Exited(s.key, 0)  # it saw the request


async def test_a_worker_still_there_long_after_sigkill_marks_its_gpu_in_heartbeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process in uninterruptible sleep (a hung driver call) survives SIGKILL and keeps its GPU;
    the agent starts nothing there while it does, so the heartbeats say so and the health monitor
    fails the GPU (``process:unkillable``) until it is gone. Here the kernel's part, a SIGKILL that
    does not take, is played by dropping it; the process, its runtime and the agent are real."""
    agent = NodeAgent(
        N0, InMemoryLog(), MemoryViews(), work_dir=tmp_path / "agent", sandbox="none", unkillable_after=0.0
    )
    gpu = agent.found.inventory.gpus[3]
    s = spec_for(tmp_path, "stuck", [PY, "-c", STUBBORN], gpus=(GpuBinding(index=3, uuid=gpu.uuid),))
    real = os.killpg

    def sigkill_does_not_take(pid: int, sig: int) -> None:
        if sig != signal.SIGKILL:
            real(pid, sig)

    pid = None
    try:
        await start_one(agent.runtime, s)
        assert await agent.runtime.next_report(WAIT) == Checkpointed(s.key, 0, "armed")  # SIGTERM ignored
        assert not any(g.unkillable for g in (await agent._heartbeat()).gpus)  # running: well
        monkeypatch.setattr(os, "killpg", sigkill_does_not_take)
        await agent.runtime.stop(s.key, grace=0.1)
        await asyncio.wait_for(asyncio.shield(agent.runtime._workers[s.key].killer), WAIT)
        assert agent.runtime.workers() == {s.key: "stopping"}
        agent.unkillable_after = 3600.0  # killed a moment ago: not yet said to be unkillable
        assert not any(g.unkillable for g in (await agent._heartbeat()).gpus)
        agent.unkillable_after = 0.0
        beat = await agent._heartbeat()
        assert [g.index for g in beat.gpus if g.unkillable] == [3]
        assert sample_signals(beat.gpus[3], gpu.nvlinks) == [("process:unkillable", "gpu")]
        # An agent shutting down waits for it a while, then leaves it to its keeper: it does not
        # hang (the next agent takes it back, still stopping).
        pid = agent.runtime.pid(s.key)
        await asyncio.wait_for(agent.runtime.close(grace=0.1, unkillable_after=0.2), WAIT)
        after = Runtime(agent.runtime.root, sandbox="none", poll_interval=0.02)
        assert after.reattach() == [s.key] and after.workers() == {s.key: "stopping"}
        assert after.unkillable(0.0) == {gpu.uuid}  # from the first kill: not a minute of health
    finally:
        monkeypatch.undo()
        if pid is not None:  # the kill that did not take, taken now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        await agent.runtime.close(grace=2.0)
    exited = (await until(after, exit_of(s.key)))[-1]
    assert ran(exited) == Exited(s.key, 128 + signal.SIGKILL, stopped=True)
    await after.close(grace=1.0)


async def test_a_command_that_does_not_exist_cannot_start(plain: Runtime, tmp_path: Path) -> None:
    s = spec_for(tmp_path, "x", ["/no/such/program"])
    result = await plain.start_gang([s], timeout=WAIT)
    assert result.failed == s.key and "/no/such/program" in result.reason
    [failed] = await until(plain, lambda r: True)
    assert isinstance(failed, StartFailed) and failed.key == s.key
    assert not failed.node_fault  # the job's command: its own fault, on any node
    # ... and its owner is told why, not only "code 127".
    _, exited = report_events("node-07", failed)
    assert isinstance(exited, WorkerExited) and exited.start_error == result.reason and not exited.node_fault
    assert plain.workers() == {s.key: "exited"}  # kept until the log has the failure


async def test_a_link_the_job_left_in_its_checkpoint_directory_fails_its_start_as_its_own_fault(
    plain: Runtime, tmp_path: Path
) -> None:
    # Its workers write below its checkpoint directory; a link there stops the agent (it never
    # follows one), and was taken for the node's fault: the job requeued free and the node
    # counted towards its quarantine, on every node the job's next start landed on.
    s = spec_for(tmp_path, "x", ["/bin/true"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(s.job_checkpoint_dir).mkdir(parents=True)
    Path(s.checkpoint_dir).symlink_to(elsewhere)
    result = await plain.start_gang([s], timeout=WAIT)
    assert result.failed == s.key and "is not a directory of its own" in result.reason
    [failed] = await until(plain, lambda r: True)
    assert failed == StartFailed(s.key, result.reason, node_fault=False)


async def test_a_command_line_too_long_to_run_fails_its_start_as_its_own_fault(
    plain: Runtime, tmp_path: Path
) -> None:
    # An argument or variable longer than the kernel runs (MAX_ARG_STRLEN, 128 KiB) is the job's
    # own: the keeper, corral's, could not be run with it on any node. Taken for the node's
    # fault, the job was requeued free and counted towards the quarantine of every node it
    # landed on, which three such jobs cordoned.
    big = "x" * 200_000
    for name, command, env in (("arg", ["/bin/true", big], {}), ("env", ["/bin/true"], {"BIG": big})):
        s = spec_for(tmp_path, name, command)
        s = msgspec.structs.replace(s, env={**s.env, **env})
        result = await plain.start_gang([s], timeout=WAIT)
        assert result.failed == s.key and result.reason.endswith("its command or environment is too long")
        [failed] = await until(plain, lambda r: True)
        assert failed == StartFailed(s.key, result.reason, node_fault=False)


async def test_a_node_whose_directories_cannot_be_made_fails_the_start_for_its_own_fault(
    tmp_path: Path,
) -> None:
    # The agent's work directory cannot be written (a full or read-only disk): every start here
    # fails, and was charged to the job placed here, its restarts used up on a node that runs
    # nothing. It is the node's fault.
    root = tmp_path / "agent"
    rt = Runtime(root, sandbox="none", node="node-07")
    root.mkdir(parents=True, exist_ok=True)
    (root / "work").write_text("not a directory")  # where every worker's directory goes
    try:
        s = spec_for(tmp_path, "x", ["/bin/true"])
        result = await rt.start_gang([s], timeout=WAIT)
        assert result.failed == s.key and result.reason == "cannot prepare directories: Not a directory"
        # The job's owner reads it: what went wrong, not where on the node's disk.
        assert str(tmp_path) not in result.reason
        [failed] = await until(rt, lambda r: True)
        assert failed == StartFailed(s.key, result.reason, node_fault=True)
        started, exited = report_events("node-07", failed)
        assert isinstance(exited, WorkerExited) and exited.node_fault == result.reason
    finally:
        await rt.close(grace=2.0)


async def test_a_worker_lost_with_an_earlier_agent_is_reported_gone_once(plain: Runtime) -> None:
    key = WorkerKey("old", 2, 1)
    await plain.act(ReportGone(key, 6))
    await plain.act(ReportGone(key, 6))
    assert await plain.next_report(WAIT) == Exited(key, GONE_CODE)
    assert plain.reports.empty() and plain.workers() == {key: "exited"}
    assert plain.log_of(key) == log_path(plain.root, key, 6)  # what it printed is shipped from there


# -- the gang start barrier ------------------------------------------------------------------------


async def test_a_gang_that_does_not_start_in_time_is_stopped_whole(runtime: Runtime, tmp_path: Path) -> None:
    never = asyncio.Event()

    async def prepare(s: StartWorker) -> None:
        if s.rank == 1:
            await never.wait()  # e.g. a MIG instance that never comes up

    rt = Runtime(runtime.root, sandbox="bwrap" if await runtime.sandboxed() else "none", prepare=prepare)
    gang = [spec_for(tmp_path, "gang", [PY, "-c", LOOP], rank=r) for r in range(3)]
    # Ranks 0 and 2 must have started (real processes) when the gang's time is up: with one
    # second, a loaded machine left rank 0 starting too, and the gang's failure was rank 0's.
    within = 5.0
    try:
        result = await rt.start_gang(gang, timeout=within)
        assert result.started == () and result.failed == gang[1].key
        assert result.reason == f"not started within {within:g}s"
        # The ranks that did start are stopped, and silently: the log never heard of them.
        for s in (gang[0], gang[2]):
            assert await rt.wait_exited(s.key, WAIT) in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
        assert await rt.next_report(WAIT) == StartFailed(gang[1].key, f"not started within {within:g}s")
        assert rt.reports.empty()
        assert set(rt.workers().values()) == {"exited"}
    finally:
        await rt.close(grace=1.0)


async def test_one_rank_failing_to_start_stops_the_others(runtime: Runtime, tmp_path: Path) -> None:
    bad = Mount(str(tmp_path / "missing"), "/data")
    gang = [spec_for(tmp_path, "gm", [PY, "-c", LOOP], rank=r) for r in range(2)]
    gang[1] = msgspec.structs.replace(gang[1], mounts=(bad,))
    result = await runtime.start_gang(gang, timeout=WAIT)
    assert result.failed == gang[1].key and "does not exist" in result.reason
    failed = await runtime.next_report(WAIT)
    assert isinstance(failed, StartFailed) and failed.key == gang[1].key
    if runtime.workers().get(gang[0].key) != "exited":
        await runtime.wait_exited(gang[0].key, WAIT)
    assert runtime.reports.empty()


# -- checkpoints -----------------------------------------------------------------------------------


class Agent:
    """The agent's loop, driven by hand: fold the log, decide, act, and append the reports."""

    def __init__(self, rt: Runtime, log: LogBuilder, ckpt: Path) -> None:
        self.rt, self.log, self.ckpt = rt, log, ckpt

    def state(self) -> State:
        state = self.log.fold()
        assert state.faults == 0
        return state

    def decide(self, now: float) -> list[Action]:
        return decide(node_view(self.state(), N0), self.rt.workers(), now, str(self.ckpt))

    async def act(self, now: float) -> list[Action]:
        actions = self.decide(now)
        for a in actions:
            await self.rt.act(a, start_timeout=WAIT)
        return actions

    def append(self, reports: list[Report]) -> None:
        for r in reports:
            for ev in report_events(N0, r):
                self.log.event(subj.node(N0), ev)

    async def until(self, want: Callable[[Report], bool]) -> Report:
        reports = await until(self.rt, want)
        self.append(reports)
        return reports[-1]


async def test_a_preempted_training_job_checkpoints_and_resumes_from_its_step(
    runtime: Runtime, tmp_path: Path
) -> None:
    command = (PY, TRAIN, "--steps", "1000000000", "--step-seconds", "0.001", "--checkpoint-every", "40")
    spec = msgspec.structs.replace(job().build(), command=command, checkpointable=True, grace_seconds=600.0)
    log = LogBuilder().nodes(Cluster(1)).queues("team-a", "team-b")
    log.submit("alice", "train", spec).accept("train").admit("train").place(on(N0, 0, job_id="train"))
    agent = Agent(runtime, log, tmp_path / "ckpt")
    key = WorkerKey("train", 0, 0)

    [start] = await agent.act(now=0.0)
    assert isinstance(start, StartGang)
    await agent.until(lambda r: isinstance(r, Started))
    first = await agent.until(lambda r: isinstance(r, Checkpointed))  # a periodic one: it trains
    assert isinstance(first, Checkpointed) and first.step == 40

    # An urgent job preempts it: the agent asks for a checkpoint, then stops it.
    log.submit("bob", "urgent", job("team-a")).accept("urgent", priority=10).preempt("urgent", "train")
    deadline = agent.state().jobs["train"].preempt_deadline  # what the preemption named
    assert await agent.act(now=deadline - 590) == [RequestCheckpoint(key, deadline)]
    assert runtime.workers()[key] == "checkpoint-requested"
    saved = await agent.until(lambda r: isinstance(r, Checkpointed) and r.step > 40)
    assert isinstance(saved, Checkpointed) and runtime.workers()[key] == "checkpointed"
    [stop] = await agent.act(now=deadline - 580)
    assert isinstance(stop, StopWorker) and stop.reason == "preempted"
    exited = await agent.until(exit_of(key))
    assert ran(exited) == Exited(key, 0, stopped=True)  # train.py exits 0 when asked to stop
    state = agent.state()
    j = state.jobs["train"]
    assert j.phase == "preempted" and j.checkpoint is not None and j.checkpoint.step == saved.step

    # Back in the queue and placed again: the next attempt gets the checkpoint back.
    log.requeue("train", 0, code="preempted").admit("train", attempt=1).place(
        on(N0, 1, job_id="train", attempt=1)
    )
    actions = agent.decide(now=deadline)
    resume = next(a for a in actions if isinstance(a, StartGang)).workers[0]
    assert resume.env["CORRAL_RESUME_FROM"] == saved.location
    # Let the resumed run finish 50 steps after the checkpoint, and a run that never stopped too.
    end = str(saved.step + 50)
    resumed = msgspec.structs.replace(resume, command=(PY, TRAIN, "--steps", end))
    straight = spec_for(tmp_path, "straight", [PY, TRAIN, "--steps", end])
    for s in (resumed, straight):
        await runtime.start_gang([s], timeout=WAIT)
        assert ran((await until(runtime, exit_of(s.key)))[-1]) == Exited(s.key, 0)
    out = log_path(runtime.root, resumed.key, resumed.run).read_text()
    assert f"resumed from step {saved.step} " in out
    done = [line for line in out.splitlines() if " done at step " in line]
    assert done and done[0].startswith(f"rank 0: done at step {end} ")
    # Same data, same per-step batches: resuming lost nothing and repeated nothing.
    straight_out = log_path(runtime.root, straight.key, straight.run).read_text()
    straight_done = [ln for ln in straight_out.splitlines() if "done at" in ln]
    assert done == straight_done


async def test_a_worker_without_a_sigusr1_handler_is_not_killed_by_a_request(
    runtime: Runtime, tmp_path: Path
) -> None:
    # It watches the REQUEST file only; SIGUSR1 would kill it, so the runtime must not send one.
    watcher = (
        "import json, os, pathlib, time\n"
        "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
        "while not (d / 'REQUEST').exists(): time.sleep(0.01)\n"
        "deadline = float((d / 'REQUEST').read_text())\n"
        "(d / 'x.tmp').write_text(json.dumps({'step': 7, 'location': f'deadline={deadline:.0f}'}))\n"
        "os.replace(d / 'x.tmp', d / 'DONE')\n"
        "while True: time.sleep(0.05)\n"
    )
    s = spec_for(tmp_path, "w", [PY, "-c", watcher])
    await start_one(runtime, s)
    await runtime.request_checkpoint(s.key, 1234.0)
    report = await runtime.next_report(WAIT)
    assert report == Checkpointed(s.key, 7, "deadline=1234")
    assert not (Path(s.checkpoint_dir) / "DONE").exists() and not (Path(s.checkpoint_dir) / REQUEST).exists()
    await runtime.stop(s.key, grace=WAIT)
    assert ran((await until(runtime, exit_of(s.key)))[-1]) == Exited(
        s.key, 128 + signal.SIGTERM, stopped=True
    )


async def test_a_worker_that_handles_sigusr1_only_after_the_request_still_hears_it(
    runtime: Runtime, tmp_path: Path
) -> None:
    # It installs its handler only once the request is there, and checkpoints only on the
    # signal: the runtime, which found no handler when it asked, must signal it once it has one.
    late = (
        "import json, os, pathlib, signal, time\n"
        "d = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'])\n"
        "def save(*_):\n"
        "    (d / 'x.tmp').write_text(json.dumps({'step': 9, 'location': 'late'}))\n"
        "    os.replace(d / 'x.tmp', d / 'DONE')\n"
        "while not (d / 'REQUEST').exists(): time.sleep(0.01)\n"
        "signal.signal(signal.SIGUSR1, save)\n"
        "while True: time.sleep(0.05)\n"
    )
    s = spec_for(tmp_path, "late", [PY, "-c", late])
    await start_one(runtime, s)
    await runtime.request_checkpoint(s.key, 1234.0)
    assert await runtime.next_report(WAIT) == Checkpointed(s.key, 9, "late")
    await runtime.stop(s.key, grace=WAIT)
    await until(runtime, exit_of(s.key))


# -- sandboxes and data mounts ---------------------------------------------------------------------

PROBE = r"""
import os, pathlib, json
out = {}
out["read"] = pathlib.Path("/data/in/words.txt").read_text().strip()
targets = [("ro", "/data/in/new.txt"), ("root", "/etc/corral-test"), ("rw", "/scratch/out/result.txt")]
for name, path in targets:
    try:
        pathlib.Path(path).write_text("written")
        out[name] = "writable"
    except OSError as e:
        out[name] = e.strerror
out["pid"] = os.getpid()
out["host_tmp_visible"] = os.path.exists(os.environ["HOST_TMP_MARKER"])
print(json.dumps(out))
"""


@pytest.fixture
async def sandboxed(tmp_path: Path) -> AsyncIterator[Runtime]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed; apt-get install -y bubblewrap")
    if not await bwrap_works():
        pytest.skip("bwrap is installed but cannot create namespaces here")
    rt = Runtime(tmp_path / "agent", sandbox="bwrap", poll_interval=0.02)
    try:
        yield rt
    finally:
        await rt.close(grace=2.0)


async def test_data_mounts_are_bound_where_the_job_asked_read_only_when_asked(
    sandboxed: Runtime, tmp_path: Path
) -> None:
    data, out = tmp_path / "dataset", tmp_path / "results"
    data.mkdir()
    out.mkdir()
    (data / "words.txt").write_text("hello from the dataset\n")
    marker = Path("/tmp") / f"corral-marker-{os.getpid()}-{tmp_path.name}"
    marker.write_text("host")
    try:
        mounts = (
            Mount(str(data), "/data/in", read_only=True),
            Mount(str(out), "/scratch/out", read_only=False),
        )
        s = spec_for(tmp_path, "m", [PY, "-c", PROBE], mounts=mounts)
        s = msgspec.structs.replace(s, env={**s.env, "HOST_TMP_MARKER": str(marker)})
        await start_one(sandboxed, s)
        assert ran((await until(sandboxed, exit_of(s.key)))[-1]) == Exited(s.key, 0)
    finally:
        marker.unlink()
    seen = json.loads(log_path(sandboxed.root, s.key, s.run).read_text())
    assert seen == {
        "read": "hello from the dataset",
        "ro": "Read-only file system",
        "root": "Read-only file system",
        "rw": "writable",
        "pid": 2,  # its own PID namespace: bwrap's init is 1, the command 2
        "host_tmp_visible": False,  # a private /tmp
    }
    assert (out / "result.txt").read_text() == "written" and not (data / "new.txt").exists()


async def test_a_mount_target_inside_the_read_only_root_is_refused_with_a_reason(
    sandboxed: Runtime, tmp_path: Path
) -> None:
    (tmp_path / "d").mkdir()
    s = spec_for(
        tmp_path, "bad", [PY, "-c", "pass"], mounts=(Mount(str(tmp_path / "d"), "/usr/corral-data"),)
    )
    result = await sandboxed.start_gang([s], timeout=WAIT)
    assert result.failed == s.key
    assert "read-only root" in result.reason and "/usr/corral-data" in result.reason


async def test_without_a_sandbox_a_job_with_mounts_cannot_start(plain: Runtime, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    s = spec_for(tmp_path, "nm", [PY, "-c", "pass"], mounts=(Mount(str(tmp_path / "d"), "/data"),))
    result = await plain.start_gang([s], timeout=WAIT)
    assert result.failed == s.key and "bubblewrap" in result.reason


async def test_an_image_job_is_refused_on_a_node_without_containers(tmp_path: Path) -> None:
    runtime = Runtime(tmp_path / "agent", sandbox="none", containers="none")
    s = spec_for(tmp_path, "img", [PY, "-c", "pass"], image="pytorch/pytorch:2.3")
    result = await runtime.start_gang([s], timeout=WAIT)
    assert result.failed == s.key and "needs podman or docker" in result.reason


async def test_mig_placeholders_resolve_to_instance_uuids(plain: Runtime) -> None:
    from corral.services.agent.discovery import MigDevice

    plain.set_mig_devices([MigDevice(0, "GPU-abc", "MIG-123", 1, 0, 40_000, start=4, profile="3g.40gb")])
    assert plain.resolve_devices("GPU-x,mig:GPU-abc/3g.40gb@4,mig:GPU-abc/3g.40gb@0") == (
        "GPU-x,MIG-123,mig:GPU-abc/3g.40gb@0"
    )


# -- restart backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restarts", "seconds"), [(0, 0.0), (1, 2.0), (2, 4.0), (3, 8.0), (8, 256.0), (9, 300.0), (10_000, 300.0)]
)
def test_restart_backoff_doubles_up_to_a_cap(restarts: int, seconds: float) -> None:
    assert restart_backoff(restarts) == seconds


SNOOP = r"""
import ctypes, json, os, pathlib, sys
secret = pathlib.Path(sys.argv[1])
out = {"secret": secret.exists(), "listing": sorted(os.listdir(secret.parent))}
libc = ctypes.CDLL(None, use_errno=True)
out["umount"] = libc.umount2(str(secret.parent).encode(), 2) == 0  # MNT_DETACH
out["own_dir"] = os.access(os.getcwd(), os.W_OK)
out["secret_after"] = secret.exists()
print(json.dumps(out))
"""


async def test_a_worker_never_sees_what_the_agent_hides(tmp_path: Path) -> None:
    """A job of one tenant must not read corral's credentials, the log's store or another
    job's files: the data directory is hidden in the sandbox, the worker's own directories bound
    back into it, and the worker cannot unmount what hides it."""
    if shutil.which("bwrap") is None or not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    data = tmp_path / "data"
    secret = data / "credentials.json"
    data.mkdir()
    secret.write_text('{"admin": "s3cret"}')
    rt = Runtime(data / "nodes" / "n0", sandbox="bwrap", poll_interval=0.02, hidden=[data])
    try:
        s = spec_for(data, "snoop", [PY, "-c", SNOOP, str(secret)])
        await start_one(rt, s)
        assert ran((await until(rt, exit_of(s.key)))[-1]) == Exited(s.key, 0)
    finally:
        await rt.close(grace=2.0)
    seen = json.loads(log_path(rt.root, s.key, s.run).read_text())
    assert seen["secret"] is False and "credentials.json" not in seen["listing"]
    assert seen["umount"] is False and seen["secret_after"] is False
    assert seen["own_dir"] is True


@pytest.mark.parametrize("where", ["itself", "inside", "above"])
async def test_a_data_mount_may_not_show_what_the_agent_hides(tmp_path: Path, where: str) -> None:
    """A mount of the data directory, of a directory in it (another job's working directory)
    or of one that holds it would bind back what the sandbox hides: such a job fails to start,
    saying why, and its command never runs. Whatever the sandbox: the check is the agent's."""
    data = tmp_path / "data"
    other_job = data / "nodes" / "n0" / "work" / "theirs"
    other_job.mkdir(parents=True)
    source = {"itself": data, "inside": other_job, "above": tmp_path}[where]
    rt = Runtime(data / "nodes" / "n0", sandbox="none", poll_interval=0.02, hidden=[data])
    try:
        mount = Mount(source=str(source), target=str(source))
        s = spec_for(tmp_path, "peek", [PY, "-c", "print('ran')"], mounts=(mount,))
        result = await rt.start_gang([s], timeout=WAIT)
    finally:
        await rt.close(grace=2.0)
    assert result.failed == s.key
    assert result.reason == f"mount source {source} would show corral's own directory {data} to the job"


PEEK = r"""
import json, os, pathlib, sys
print(json.dumps({"seen": [pathlib.Path(p).exists() for p in sys.argv[1:]],
                  "own_checkpoints": os.access(os.environ["CORRAL_CHECKPOINT_DIR"], os.W_OK)}))
"""


def _others(agent: NodeAgent) -> tuple[Path, Path]:
    """Another job's output on the agent's node and its checkpoint where the node's jobs
    checkpoint (``--work-dir`` and ``--checkpoint-dir`` apart, no ``--hide``)."""
    their_log = agent.work_dir / "logs" / "theirs" / "run-1" / "attempt-0.rank-0.log"
    their_ckpt = Path(agent.checkpoint_root) / "theirs" / "run-1" / "attempt-0" / "rank-0" / "model.pt"
    for path in (their_log, their_ckpt):
        path.parent.mkdir(parents=True)
        path.write_text("another tenant's")
    return their_log, their_ckpt


async def test_a_worker_never_sees_the_agent_s_own_directories(tmp_path: Path) -> None:
    """Whatever directories its operator names to hide, an agent hides its own work directory
    (every job's working directory, output and keeper) and where its node's jobs checkpoint
    (every tenant's checkpoints, on storage the nodes share): a job sees its own directories
    there, not another's."""
    if shutil.which("bwrap") is None or not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    agent = NodeAgent(
        N0, InMemoryLog(), MemoryViews(), work_dir=tmp_path / "agent", checkpoint_root=tmp_path / "ckpt",
        sandbox="bwrap",
    )  # fmt: skip
    their_log, their_ckpt = _others(agent)
    s = spec_for(tmp_path, "peek", [PY, "-c", PEEK, str(their_log), str(their_ckpt)])
    try:
        seen = await last_line_of(agent.runtime, s)
    finally:
        await agent.runtime.close(grace=2.0)
    assert seen == {"seen": [False, False], "own_checkpoints": True}


@pytest.mark.parametrize("whose", ["output", "checkpoints"])
async def test_a_data_mount_may_not_show_another_job_s_directories(tmp_path: Path, whose: str) -> None:
    """Nor may a job mount them (a container shows no host directory but its mounts): a mount
    of another job's output or checkpoints fails to start, saying why."""
    agent = NodeAgent(
        N0, InMemoryLog(), MemoryViews(), work_dir=tmp_path / "agent", checkpoint_root=tmp_path / "ckpt",
        sandbox="none",
    )  # fmt: skip
    their_log, their_ckpt = _others(agent)
    source = {"output": their_log.parent, "checkpoints": their_ckpt.parent}[whose]
    s = spec_for(tmp_path, "peek", [PY, "-c", "print('ran')"], mounts=(Mount(str(source), str(source)),))
    try:
        result = await agent.runtime.start_gang([s], timeout=WAIT)
    finally:
        await agent.runtime.close(grace=2.0)
    assert result.failed == s.key
    assert result.reason is not None and "would show corral's own directory" in result.reason


def test_a_data_mount_is_bound_by_the_path_it_resolved_to(tmp_path: Path) -> None:
    """A source reached through a symlink is bound by where the link pointed when it was checked:
    re-pointed at the hidden directory after the check (by the tenant's other job, say), it is not
    followed again."""
    from corral.services.agent.launch import _resolved
    from corral.services.agent.worker import StartError

    data, shown = tmp_path / "data", tmp_path / "datasets" / "imagenet"
    data.mkdir()
    shown.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(shown)
    s = spec_for(tmp_path, "m", [PY, "-c", "pass"], mounts=(Mount(str(link), "/data"),))
    resolved = _resolved(s, [str(data)])
    assert [m.source for m in resolved.mounts] == [str(shown)]
    link.unlink()
    link.symlink_to(data)  # what is bound is the path checked, not the link
    assert resolved.mounts[0].source == str(shown)
    with pytest.raises(StartError, match="would show corral's own directory"):
        _resolved(s, [str(data)])


AS_NOBODY = r"""
import json, os, pathlib
out = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups()}
try:
    (pathlib.Path(os.environ["CORRAL_CHECKPOINT_DIR"]).parent / "root-only.txt").read_text()
    out["root_only"] = "read"
except PermissionError:
    out["root_only"] = "denied"
pathlib.Path("mine.txt").write_text("ok")
ckpt = pathlib.Path(os.environ["CORRAL_CHECKPOINT_DIR"])
(ckpt / "state.bin").write_bytes(b"x")
out["own"] = "written"
print(json.dumps(out))
"""


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
async def test_a_worker_can_run_as_an_unprivileged_user(tmp_path: Path, narrow: bool) -> None:
    """Workers run as an unprivileged host user (nobody): what the host keeps for root stays
    root's, and the worker writes only its own directories, which are handed to it. bwrap opens
    what is bound as root, so the user needs no way to the interpreter (in root's home, say) or
    to its directories (in pytest's directory, root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("only a root agent starts workers as another user")
    if shutil.which("bwrap") is None or not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    s = spec_for(tmp_path, "nobody", [PY, "-c", AS_NOBODY])
    private = Path(s.job_checkpoint_dir) / "root-only.txt"  # in sight, but root's
    private.parent.mkdir(parents=True)
    private.write_text("secret")
    private.chmod(0o600)
    rt = Runtime(
        tmp_path / "agent", sandbox="bwrap", poll_interval=0.02, worker_user="nobody", narrow_view=narrow
    )
    try:
        seen = await last_line_of(rt, s)
    finally:
        await rt.close(grace=2.0)
    nobody = pwd.getpwnam("nobody").pw_uid
    assert (seen["uid"], seen["euid"], seen["groups"]) == (nobody, nobody, [])
    assert seen["root_only"] == "denied" and seen["own"] == "written"


async def test_a_worker_as_a_user_reaches_its_directories_under_a_hidden_one() -> None:
    """The worker's directories lie in the hidden data directory, which lies in one the sandbox
    shows (the command's own, under /tmp as a checkout may be): bwrap makes the directories
    leading to them under the hidden directory's empty tmpfs with their host modes, root's
    alone, and a worker run as a user could reach neither its working nor its checkpoint
    directory."""
    if os.geteuid() != 0:
        pytest.skip("only a root agent starts workers as another user")
    if shutil.which("bwrap") is None or not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    top = Path(tempfile.mkdtemp(prefix="corral-shown-"))
    try:
        top.chmod(0o755)
        script = top / "job.py"  # the command's own file: its directory is shown to the worker
        script.write_text(AS_NOBODY)
        data = top / "data"
        s = spec_for(data / "checkpoints", "nobody", [PY, str(script)])
        private = Path(s.job_checkpoint_dir) / "root-only.txt"  # in sight, but root's
        private.parent.mkdir(parents=True)
        private.write_text("secret")
        private.chmod(0o600)
        for d in (data, data / "checkpoints"):
            d.chmod(0o700)
        rt = Runtime(
            data / "nodes" / "n0", sandbox="bwrap", poll_interval=0.02, worker_user="nobody", hidden=[data]
        )
        try:
            seen = await last_line_of(rt, s)
        finally:
            await rt.close(grace=2.0)
    finally:
        shutil.rmtree(top)
    assert seen["root_only"] == "denied" and seen["own"] == "written"


NARROW = r"""
import json, os
print(json.dumps({"root": sorted(os.listdir("/")), "secret": os.path.exists(os.environ["SECRET"])}))
"""


async def test_a_narrow_sandbox_shows_the_system_and_what_the_job_runs_from(tmp_path: Path) -> None:
    """In a multi-tenant corral the sandbox shows the host's programs, libraries and settings,
    the interpreter and the command's own files: not the rest of the host, where other tenants'
    data or the operator's files may lie."""
    if shutil.which("bwrap") is None or not await bwrap_works():
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here")
    elsewhere = Path(tempfile.mkdtemp(prefix="corral-narrow-", dir="/var/tmp"))
    secret = elsewhere / "other-tenant.txt"
    secret.write_text("theirs")
    rt = Runtime(tmp_path / "agent", sandbox="bwrap", poll_interval=0.02, narrow_view=True)
    try:
        # named in its environment, not in its command: a file the command names is one it runs
        s = spec_for(tmp_path, "narrow", [PY, "-c", NARROW])
        s = msgspec.structs.replace(s, env={**s.env, "SECRET": str(secret)})
        seen = await last_line_of(rt, s)
    finally:
        await rt.close(grace=2.0)
        shutil.rmtree(elsewhere, ignore_errors=True)
    assert seen["secret"] is False
    assert "var" not in seen["root"] and "home" not in seen["root"] and "srv" not in seen["root"]
    assert {"usr", "etc", "proc", "dev", "tmp"} <= set(seen["root"])
