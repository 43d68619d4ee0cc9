"""The golden log: one of every kind of record the fold takes, in a life of a small cluster.

``python -m tests.golden_log`` writes it to ``tests/golden/log.jsonl`` and its state's hash to
``tests/golden/state.sha256``. Run it only when the fold's rules change on purpose, in the same
commit that bumps ``projections.rules.RULES``: the file is the record of what a log meant.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from corral.events import subjects
from corral.events.base import Reason
from corral.events.jobs import CancelJob, JobPriorityChanged, JobRejected, ResizeJob
from corral.events.log import Record
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyRetention,
    CohortSpec,
    CordonNode,
    FairShareSpec,
    PriorityClassSpec,
    RetentionSpec,
)
from corral.projections.fold import fold
from corral.projections.state import State
from corral.services.agent.inventory import h100_8x_nvswitch
from tests.builders import Cluster, LogBuilder, job, on, placement, whole, worker

GOLDEN = Path(__file__).resolve().parent / "golden"
LOG = GOLDEN / "log.jsonl"
HASH = GOLDEN / "state.sha256"


def records() -> list[Record]:
    lb = LogBuilder()
    lb.nodes(Cluster(3))
    lb.admin("priority-class", ApplyPriorityClass(priority_class=PriorityClassSpec("urgent", 100)))
    lb.admin("cohort", ApplyCohort(cohort=CohortSpec("org")))
    lb.admin("fair-share", ApplyFairShare(fair_share=FairShareSpec(half_life_s=3600.0)))
    lb.queues("team-a", "team-b")
    # a finished job is let go a minute of log time after it ends, and its id is free again
    lb.admin("retention", ApplyRetention(retention=RetentionSpec(finished_s=60.0)))
    lb.submit("bob", "nb", job("team-b").gpus(1)).accept("nb").admit("nb")
    lb.place(on("node-02", 0, job_id="nb")).started("node-02", "nb").exited("node-02", "nb", code=0)
    lb.at(lb.time + 120.0).submit("alice", "nb", job().gpus(1))
    # a job runs, checkpoints and is preempted for an urgent one, then resumes
    lb.submit("alice", "low", job().gpus(8).checkpointable()).accept("low").admit("low")
    lb.place(on("node-00", *range(8), job_id="low")).started("node-00", "low")
    lb.checkpoint("node-00", "low", 100)
    lb.submit("bob", "urgent", job("team-a").gpus(8).priority_class("urgent")).accept("urgent", priority=100)
    lb.preempt("urgent", "low").exited("node-00", "low", code=0, stopped=True)
    lb.requeue("low", 0, "preempted").admit("low", attempt=1)
    lb.admit("urgent").place(on("node-00", *range(8), job_id="urgent")).started("node-00", "urgent")
    lb.place(on("node-01", *range(8), job_id="low", attempt=1)).started("node-01", "low", attempt=1)
    # a gang of two that fails and is restarted
    lb.submit("alice", "gang", job().gpus(1).replicas(2).restarts(1))
    lb.accept("gang").admit("gang", replicas=2)
    lb.place(placement("gang", worker(0, "node-02", whole(0)), worker(1, "node-02", whole(1))))
    lb.started("node-02", "gang", 0).exited("node-02", "gang", 0, code=1)
    # a node shut down by its operator: its job goes back to its queue without counting a
    # restart; an exit reported for its rank by another node is refused
    lb.submit("alice", "svc", job().gpus(1).restarts(1)).accept("svc").admit("svc")
    lb.place(on("node-02", 3, job_id="svc")).started("node-02", "svc")
    lb.shutdown("node-02", "corral up stopped").exited("node-01", "svc", code=143, stopped=True)
    lb.exited("node-02", "svc", code=143, stopped=True)
    # an elastic job grows, then is resized
    lb.submit("bob", "elastic", job("team-b").gpus(1).replicas(4, minimum=1))
    lb.accept("elastic").admit("elastic", replicas=1)
    lb.request("bob", "resize", ResizeJob(job_id="elastic", replicas=2))
    # a scheduler whose priorities follow attained service moves the elastic job down
    down = Reason("attained-service", "ran 3600 GPU-seconds: down to the lower queue")
    lb.event(subjects.job("elastic"), JobPriorityChanged(job_id="elastic", priority=-1, reason=down))
    # refusals: a rejected job, a stranger's cancel, a malformed request, a void placement
    lb.submit("alice", "huge", job().gpus(1).replicas(5000))
    rejected = JobRejected(job_id="huge", request_seq=lb.last_seq, reason=Reason("invalid", "too big"))
    lb.event(subjects.job("huge"), rejected)
    lb.request("bob", "cancel", CancelJob(job_id="gang"))
    lb.raw(subjects.request("alice", "submit"), b'{"request_id": 7}')
    lb.place(on("node-02", 2, job_id="elastic"), on("node-00", 0, job_id="huge"))
    # hardware: a GPU falls off the bus and the node registers again, renumbered; a GPU goes bad,
    # a node is cordoned, another lost
    inv = h100_8x_nvswitch("node-02")
    left = [g for g in inv.gpus if g.index != 1]
    rest = tuple(msgspec.structs.replace(g, index=i) for i, g in enumerate(left))
    lb.node("node-02", msgspec.structs.replace(inv, gpus=rest))
    lb.gpu_health("node-01", 7, healthy=False)
    lb.admin("cordon", CordonNode(node="node-00", cordoned=True))
    lb.condition("node-01", "lost")
    lb.request("alice", "cancel", CancelJob(job_id="low"))
    # a job admitted while the lost node could host it gives its quota back, and waits
    lb.submit("bob", "wide", job("team-b").gpus(8).pack("nvlink", required=True)).accept("wide")
    lb.admit("wide").withdraw("wide", why="needs 8 GPUs in one NVLink island; the largest has 7")
    # one placed nowhere for the placement timeout gives its quota back and backs off: admitted
    # during its back-off is void, after it is not
    lb.submit("bob", "later", job("team-b").gpus(2)).accept("later").admit("later")
    lb.withdraw("later", why="no free GPU suits 2 GPUs", admit_after=lb.time + 1.5)
    lb.admit("later").admit("later")
    return lb.records


def state_hash(state: State) -> str:
    return hashlib.sha256(msgspec.msgpack.encode(state)).hexdigest()


if __name__ == "__main__":
    from corral.services.cli import logfile

    recs = records()
    logfile.write(LOG, recs)
    HASH.write_text(state_hash(fold(recs)) + "\n")
    print(f"wrote {len(recs)} records to {LOG} and the state's hash to {HASH}")
