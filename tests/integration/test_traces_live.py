"""What an operator sees in a trace viewer, from a live corral exporting to a real OTLP receiver.

One live corral (real nats-server, every service, a node agent running ``examples/train.py`` as
real processes) plays a plain job, a gang, a job that fails and is restarted, a job no node
could host (rejected), a job preempted by an urgent one and resumed, and a job whose GPU falls
off the bus (XID 79). The spans the receiver was given must show, for every job, exactly one
trace with a single root (the job), every other span's parent in it, each span once; spans
from admission, placer and agent (and the preemptor where it acted) under their own service
names; real durations where a job waited; errors where it failed; links between the urgent job
and its victim and from the interrupted job to the XID in the node's trace; the job's own spans
under its worker's run; and cycles as spans only when they decided something.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import msgspec

from corral.events.queues import PriorityClassSpec
from corral.projections.lifecycle import FINAL
from corral.services.runtime import tracing
from tests.integration import polling
from tests.integration.test_cluster_failures import LONG, cancel, checkpointed, job_spec, live, phase, train
from tests.otlp import Receiver, Span, tree

CLASSES = (PriorityClassSpec("batch", 10), PriorityClassSpec("urgent", 1000, preemptible=False))
JOBS = ("plain", "gang", "fails", "huge", "low", "urgent", "xid")
# Fails on its first attempt, succeeds on its restart.
FAILS_ONCE = (
    sys.executable,
    "-c",
    "import os, sys; sys.exit(3 if os.environ['CORRAL_ATTEMPT'] == '0' else 0)",
)


def by_job(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        job = s.attributes.get("corral.job.id") or s.resource.get("corral.job.id")
        if job:
            out.setdefault(str(job), []).append(s)
    return out


def named(spans: list[Span], name: str, **attrs: object) -> list[Span]:
    return [s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())]


async def test_every_job_is_one_trace_an_operator_can_read(tmp_path: Path, collector: Receiver) -> None:
    async with live(tmp_path, nodes=1, classes=CLASSES) as it:
        await it.submit("plain", job_spec(train(200)))
        await it.submit("gang", msgspec.structs.replace(job_spec(train(200)), replicas=2))
        await it.submit("fails", job_spec(FAILS_ONCE))
        await it.submit("huge", job_spec(train(1), gpus=64))
        await it.until(lambda s: all(phase(s, j) in FINAL for j in ("plain", "gang", "fails", "huge")))

        batch = job_spec(
            train(1000, every=100, pace=0.002), gpus=8, priority_class="batch", checkpointable=True
        )
        await it.submit("low", batch)
        await it.until(checkpointed("low", 100))
        await it.submit("urgent", job_spec(train(100), gpus=8, priority_class="urgent"))
        await it.until(lambda s: phase(s, "low") == "succeeded" and phase(s, "urgent") == "succeeded")

        await it.submit("xid", job_spec(LONG))
        s = await it.until(checkpointed("xid", 100))
        placement = s.jobs["xid"].placement
        assert placement is not None
        gpu = placement.workers[0].gpus[0].gpu
        it.cluster.agents["node-00"].inject_xid(gpu, 79)  # fallen off the bus: its node drains
        await it.until(lambda s: s.jobs["xid"].attempt == 1)  # requeued; no node left to run it
        await cancel(it, "xid")
        final = {j: it.state.jobs[j].phase for j in JOBS}

        def arrived() -> bool:
            names = {s.name for s in collector.snapshot()}
            return all(f"job {j}" in names for j in JOBS) and f"GPU {gpu} unhealthy" in names

        await polling.until(arrived, 30.0)
    assert final == dict.fromkeys(JOBS, "succeeded") | {"huge": "rejected", "xid": "cancelled"}
    tracing.shutdown()  # what the agent and the jobs still had queued
    spans = collector.snapshot()
    jobs = by_job(spans)
    ids = {s.span_id for s in spans}

    for job in JOBS:
        mine = jobs[job]
        # One trace, one root (the job), every parent present, every span once.
        [trace_id] = {s.trace_id for s in mine}
        in_trace = [s for s in spans if s.trace_id == trace_id]
        [root] = [s for s in in_trace if not s.parent]
        assert root.name == f"job {job}" and root.service == "corral-admission"
        assert {s.parent for s in in_trace if s.parent} <= {s.span_id for s in in_trace}, tree(
            spans, trace_id
        )
        assert len({s.span_id for s in in_trace}) == len(in_trace), "a span was emitted twice"
        assert root.attributes["corral.queue"] == "team-a" and root.attributes["corral.tenant"] == "team-a"
        services = {s.service for s in in_trace}
        if job == "huge":
            assert root.error and "64 GPUs" in root.message, root.message  # rejected, and why
            assert services == {"corral-admission"}
            continue
        assert {"corral-admission", "corral-placer", "corral-agent"} <= services, services
        assert not root.error
        running = named(in_trace, "running")
        assert running and all(s.duration > 0 for s in running)
        [placed] = named(in_trace, "waiting for placement", **{"corral.attempt": 0})
        assert placed.service == "corral-placer"
        assert [e for e, _ in placed.events] == ["placed"] * (2 if job == "gang" else 1)
        [queued] = named(in_trace, "queued", **{"corral.attempt": 0})
        assert queued.service == "corral-admission" and [e for e, _ in queued.events] == ["admitted"]
        [attempt] = named(in_trace, "attempt 0")
        assert attempt.start == queued.start >= root.start  # queued from its acceptance on

    # The gang: both ranks ran, each a worker span of the agent, started behind one barrier.
    gang = jobs["gang"]
    assert sorted(
        s.attributes["corral.rank"] for s in named(gang, "worker rank 0") + named(gang, "worker rank 1")
    ) == [0, 1]
    assert named(gang, "start on node-00")[0].attributes["corral.rank"] == [0, 1]

    # Failed, then restarted: the first attempt's run failed (error, exit code 3), the second ran.
    fails = jobs["fails"]
    [first] = named(fails, "attempt 0")
    assert first.error and "exited with code 3" in first.message
    [run0] = named(fails, "running", **{"corral.attempt": 0})
    assert run0.error and ("exited", {"corral.rank": 0, "corral.exit_code": 3}) in run0.events
    [worker0] = named(fails, "worker rank 0", **{"corral.attempt": 0})
    assert worker0.error and worker0.attributes["corral.exit_code"] == 3
    [interrupted] = named(fails, "interrupted")
    assert [e for e, _ in interrupted.events] == ["requeued"]
    assert not named(fails, "attempt 1")[0].error

    # The preemption: the victim's run ended by the preemptor, linked to the urgent job's trace;
    # the urgent job's preemption span links to the victim's attempt; the victim waited in its
    # queue for its second attempt while the urgent job ran.
    low, urgent = jobs["low"], jobs["urgent"]
    [ended] = [s for s in named(low, "running", **{"corral.attempt": 0})]
    assert ended.service == "corral-preemptor"
    assert ("preempted", {"corral.preempted_for": "urgent"}) in ended.events
    assert [(t, sid) for t, sid, _ in ended.links] == [
        (urgent[0].trace_id, named(urgent, "job urgent")[0].span_id)
    ]
    [preemption] = named(urgent, "preemption")
    assert preemption.service == "corral-preemptor"
    assert [(t, sid) for t, sid, _ in preemption.links] == [
        (low[0].trace_id, named(low, "attempt 0")[0].span_id)
    ]
    [checkpointing] = named(low, "checkpointing")
    assert checkpointing.duration > 0 and any(e == "checkpoint" for e, _ in checkpointing.events)
    # It waited for its GPUs until the urgent job was done with them.
    [waited] = named(low, "waiting for placement", **{"corral.attempt": 1})
    [urgent_run] = named(urgent, "running")
    assert waited.duration > 0 and waited.end >= urgent_run.end
    assert any(e == "checkpoint" for s in named(low, "running", **{"corral.attempt": 0}) for e, _ in s.events)

    # The XID: a span of the node's trace, which the interrupted run links to.
    xid = jobs["xid"]
    [bad] = [s for s in spans if s.name == f"GPU {gpu} unhealthy"]
    assert bad.service == "corral-health" and bad.error and bad.attributes["corral.gpu.signal"] == "xid:79"
    assert bad.parent in ids and bad.trace_id != xid[0].trace_id
    [cut] = named(xid, "running", **{"corral.attempt": 0})
    assert cut.error and (bad.trace_id, bad.span_id) in [(t, sid) for t, sid, _ in cut.links]
    assert named(xid, "job xid")[0].attributes["corral.phase"] == "cancelled"
    assert [s for s in spans if s.name == "draining" and s.trace_id == bad.trace_id]

    # The job's own spans (examples/train.py) hang under its worker's run, in its trace.
    [trained] = [s for s in jobs["plain"] if s.service == "corral-job" and s.name == "train"]
    [worker] = named(jobs["plain"], "worker rank 0")
    assert trained.parent == worker.span_id and trained.trace_id == worker.trace_id

    # Cycles are spans only when they decided something, linked to the jobs they moved.
    cycles = [s for s in spans if s.name.endswith(" cycle")]
    assert cycles and all(s.attributes["corral.decisions"] > 0 for s in cycles)
    assert Counter(s.service for s in cycles)["corral-placer"] >= 1
    assert all(s.links for s in cycles if s.service in ("corral-placer", "corral-preemptor"))

    if os.environ.get("CORRAL_PRINT_TRACE"):
        print(tree(spans, low[0].trace_id))
