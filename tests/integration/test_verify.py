"""``corral replay --verify`` on a log written by a live run: embedded nats-server, the decision
services and simulated nodes (``services.cli.up.cluster``), tenants submitting more than fits. The log
verifies clean; the same log with one placement moved to another GPU, or with a decision written
by hand, does not, and the report names that decision."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from corral.events import codec, subjects
from corral.events.decisions import GpuClaim, JobsPlaced
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.log import Append, EventLog, Record
from corral.events.queues import ApplyPriorityClass, ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from corral.events.server import EmbeddedServer
from corral.projections.fold import fold
from corral.services.cli import logfile
from corral.services.cli.up import cluster, connect, service_roles
from corral.services.cli.watch import Watcher
from corral.services.replay.report import format_report
from corral.services.replay.verify import verify
from tests.builders import LogBuilder, job

NODES = 3  # 8×H100 each: 24 GPUs, less than the teams' quota, so some admitted jobs must wait
TEAMS = ("team-a", "team-b")
GOT_GPUS = ("placed", "starting", "running")
JOBS = {"team-a": (8, 4, 2, 8), "team-b": (8, 1, 8, 4)}  # GPUs per job, in submission order


async def _publish(log: EventLog, tenant: str, verb: str, body: object) -> None:
    await log.append(Append(subjects.request(tenant, verb), codec.encode(body)))


async def _read_all(log: EventLog) -> list[Record]:
    out: list[Record] = []
    async for batch in log.read(1):
        out.extend(batch)
    return out


async def live_run(data: Path) -> tuple[list[Record], set[str]]:
    """Submit work to a running cluster, wait until every job is placed or says why it waits,
    stop the services (each finishes its cycle), then read the whole log from the same store.
    Returns the log and the phases the jobs were in before the cluster stopped."""
    ids = [f"{team}-{i}" for team in TEAMS for i in range(len(JOBS[team]))]
    async with cluster(None, NODES, "h100-8x", data) as running:
        log = await connect(running.url)
        try:
            async with Watcher(log) as watch:
                await watch.until(lambda s: len(s.nodes) == NODES)
                await _publish(
                    log,
                    "admin",
                    "priority-class",
                    ApplyPriorityClass(priority_class=PriorityClassSpec("normal", 0)),
                )
                for team in TEAMS:
                    spec = QueueSpec(team, quotas={"*": Quota(nominal=20)}, tenants=(team,))
                    await _publish(log, "admin", "queue", ApplyQueue(queue=spec))
                await watch.until(lambda s: len(s.queues) == len(TEAMS))
                for team in TEAMS:
                    for i, gpus in enumerate(JOBS[team]):
                        job = JobSpec(
                            queue=team,
                            resources=Resources(gpus=gpus, cpu_milli=1000),
                            command=("sleep", "60"),
                        )
                        await _publish(log, team, "submit", SubmitJob(request_id=f"{team}-{i}", job=job))
                await watch.until(
                    lambda s: all(
                        i in s.jobs and (s.jobs[i].phase in GOT_GPUS or s.jobs[i].reasons) for i in ids
                    )
                )
                phases: set[str] = {watch.state.jobs[i].phase for i in ids}
        finally:
            await log.close()
    server = EmbeddedServer(data)
    await server.start()
    try:
        log = await connect(server.url)
        try:
            return await _read_all(log), phases
        finally:
            await log.close()
    finally:
        await server.stop()


def _a_placement(records: list[Record]) -> tuple[Record, codec.Envelope, JobsPlaced, int]:
    """The first placement event that places a worker on part of a node, and that placement's
    position in it: the one to move to a GPU it did not get."""
    for r in records:
        if r.subject == subjects.decision("placer"):
            env = codec.decode_envelope(r.data)
            if isinstance(env.body, JobsPlaced):
                for i, p in enumerate(env.body.placements):
                    if len(p.workers[0].gpus) < 8:
                        return r, env, env.body, i
    raise AssertionError("the placer placed no job on part of a node")


async def test_a_live_log_verifies_clean_and_changes_to_it_are_reported(tmp_path: Path) -> None:
    records, phases = await live_run(tmp_path / "nats")
    assert {"admitted", "queued"} <= phases and phases & set(GOT_GPUS), phases  # some ran, some waited
    state = fold(records)

    report = verify(records, service_roles())
    assert report.clean, format_report(report)
    assert report.decisions.get("admission", 0) >= 1 and report.decisions.get("placer", 0) >= 1

    # The same log through an exported file: still clean.
    path = tmp_path / "log.jsonl"
    logfile.write(path, records)
    assert verify(logfile.read(path), service_roles()).clean

    # One placement moved to another GPU, re-encoded in place.
    r, env, placed, at = _a_placement(records)
    p = placed.placements[at]
    w = p.workers[0]
    used = {c.gpu for c in w.gpus}
    other = next(g for g in range(8) if g not in used)
    moved = msgspec.structs.replace(w, gpus=(GpuClaim(other), *w.gpus[1:]))
    p2 = msgspec.structs.replace(p, workers=(moved, *p.workers[1:]))
    placements = (*placed.placements[:at], p2, *placed.placements[at + 1 :])
    tampered_body = msgspec.structs.replace(placed, placements=placements)
    tampered_env = msgspec.structs.replace(env, body=tampered_body)
    tampered = [
        x if x.seq != r.seq else msgspec.structs.replace(x, data=codec.encode(tampered_env)) for x in records
    ]
    report = verify(tampered, service_roles())
    first = report.divergences[0]
    assert (first.seq, first.role, first.based_on, first.kind) == (
        r.seq,
        "placer",
        placed.based_on,
        "differs",
    )
    assert any(c.startswith(f"job {p.job_id}: placed differently") for c in first.changes), first.changes
    assert f"seq {r.seq}: placer decision based on seq {placed.based_on}" in format_report(report)

    # A placement written by hand, by someone who is not the placer, of a job admission holds back.
    last = records[-1].seq
    waiting = next(j for j in state.jobs.values() if j.phase == "queued")
    node = next(iter(state.nodes))
    slot = msgspec.convert(
        {"rank": 0, "node": node, "gpus": [{"gpu": g} for g in range(waiting.spec.resources.gpus)]},
        type=type(w),
    )
    forged = JobsPlaced(
        based_on=last,
        now=state.time,
        placements=(msgspec.structs.replace(p, job_id=waiting.id, workers=(slot,)),),
    )
    env2 = codec.seal(forged, event_id="by-hand-1", time=state.time, producer="operator@laptop")
    extra = Record(last + 1, subjects.decision("placer"), codec.encode(env2), None, state.time)
    report = verify([*records, extra], service_roles())
    assert [(d.seq, d.role, d.based_on) for d in report.divergences] == [(last + 1, "placer", last)]
    d = report.divergences[0]
    assert d.producers == ["operator@laptop"]
    assert "written by operator@laptop, not by the placer service" in d.changes[0]
    assert any(c.startswith(f"job {waiting.id}: placed in the log") for c in d.changes), d.changes


async def _imported(tmp_path: Path, records: list[Record]) -> list[Record]:
    """``records`` written to a log file, imported into a bare nats-server, and read back."""
    from corral.services.cli.main import main

    path = tmp_path / "log.jsonl"
    logfile.write(path, records)
    async with EmbeddedServer(tmp_path / "nats") as server:
        await asyncio.to_thread(main, ["log", "import", str(path), "--server", server.url])
        log = await connect(server.url)
        try:
            return await _read_all(log)
        finally:
            await log.close()


async def test_an_exported_log_imports_into_a_server_with_no_corral(tmp_path: Path) -> None:
    """A log file from a bug report goes into a bare nats-server, stream and all, and reads back
    as it was written."""
    lb = LogBuilder().queues("team-a").submit("alice", "j1", job()).accept("j1")
    back = await _imported(tmp_path, lb.records)
    assert [(r.subject, r.data) for r in back] == [(r.subject, r.data) for r in lb.records]


async def test_records_of_one_message_id_all_import(tmp_path: Path) -> None:
    """Exported records carry their message ids, and one id may come back long after (a client
    retrying): imported with it, the later record was dropped by the server as a duplicate,
    without a word. The server's own headers stay out of what is imported."""
    lb = LogBuilder().queues("team-a").submit("alice", "j1", job()).submit("alice", "j2", job())
    headers = {"Nats-Msg-Id": "same", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    records = [Record(r.seq, r.subject, r.data, headers, r.time) for r in lb.records]
    back = await _imported(tmp_path, records)
    assert [r.data for r in back] == [r.data for r in records]
    assert all(r.headers == {"traceparent": headers["traceparent"]} for r in back)


async def test_a_log_does_not_import_into_a_server_whose_log_holds_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Imported behind a live log's own records, a file's records would be folded as if they had
    just happened (its jobs submitted again, its nodes shut down again): the import is refused,
    and the log is left as it was."""
    from corral.services.cli.main import main

    lb = LogBuilder().queues("team-a").submit("alice", "j1", job()).accept("j1")
    path = tmp_path / "log.jsonl"
    logfile.write(path, lb.records)
    async with EmbeddedServer(tmp_path / "nats") as server:
        await asyncio.to_thread(main, ["log", "import", str(path), "--server", server.url])
        try:
            await asyncio.to_thread(main, ["log", "import", str(path), "--server", server.url])
        except SystemExit as e:
            assert e.code == 2
            said = capsys.readouterr().err
            assert f"already holds records (the last at position {len(lb.records)})" in said, said
        else:
            raise AssertionError("a second import into the same log was taken")
        log = await connect(server.url)
        try:
            back = await _read_all(log)
        finally:
            await log.close()
    assert [r.data for r in back] == [r.data for r in lb.records]
