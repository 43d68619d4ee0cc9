"""The cluster's figures for the metrics (``services/runtime/metrics.py``), from a folded state.

Pure: the read service hands this to its ``Telemetry``, which calls it once per log position a
collection finds. It costs the fold's indexes, never every job: each queue's queued and quota-holding
jobs counted by their indexes, the few jobs submitted or stopped and not queued again yet
(``indexes.jobs_in``), each queue's quota ledger (``queues.queue_usage``), each node's GPUs,
and the fragmentation measure the placer uses (``fragmentation_of``: the unfinished jobs' shapes).
"""

from __future__ import annotations

from corral.projections import indexes, quota
from corral.projections.lifecycle import Phase
from corral.projections.placement.plugins.fragmentation import fragment
from corral.projections.placement.plugins.packing import fragmentation_of
from corral.projections.state import WHOLE, NodeState, State
from corral.services.query.present import free_by_gpu
from corral.services.query.queues import queue_usage

# The jobs counted as waiting in their queue: accepted and not admitted yet, or back from a stop;
# the queued ones are counted from their queue's index, the others (few) one by one.
WAITING: tuple[Phase, ...] = ("submitted", "queued", "preempted", "interrupted")
_NOT_QUEUED: tuple[Phase, ...] = tuple(p for p in WAITING if p != "queued")

Figures = dict[str, list[tuple[float, dict[str, str]]]]


def pool_of(node: NodeState) -> str:
    """A node's pool: its ``pool`` label, else its hardware profile (simulated nodes have one)."""
    labels = node.inventory.labels
    return labels.get("pool") or labels.get("profile") or "default"


def cluster_figures(state: State) -> Figures:
    out: Figures = {}
    pending: dict[str, int] = dict.fromkeys(state.queues, 0)
    admitted: dict[str, int] = dict.fromkeys(state.queues, 0)
    for queue, places in state.queued_by_queue.items():
        pending[queue] = len(places)
    for job in indexes.jobs_in(state, *_NOT_QUEUED):
        pending[job.spec.queue] = pending.get(job.spec.queue, 0) + 1
    for queue, holders in state.holding_quota_by_queue.items():
        admitted[queue] = len(holders)
    out["corral.queue.jobs.pending"] = [(n, {"corral.queue": q}) for q, n in sorted(pending.items())]
    out["corral.queue.jobs.admitted"] = [(n, {"corral.queue": q}) for q, n in sorted(admitted.items())]
    for measure in ("nominal", "used", "borrowed", "lent"):
        out[f"corral.queue.quota.{measure}"] = []
    for name, usage in queue_usage(state).items():
        for key, k in usage.keys.items():
            attrs = {"corral.queue": name, "corral.gpu.model": quota.key_name(key)}
            for measure, milli in (
                ("nominal", k.nominal),
                ("used", k.used),
                ("borrowed", k.borrowed),
                ("lent", k.lent),
            ):
                out[f"corral.queue.quota.{measure}"].append((milli / WHOLE, attrs))
    allocated: dict[tuple[str, str], int] = {}
    free: dict[tuple[str, str], int] = {}
    unhealthy: dict[tuple[str, str], int] = {}
    for node in state.nodes.values():
        pool = pool_of(node)
        for g, spare in zip(node.gpus, free_by_gpu(node), strict=True):  # as ``corral nodes`` counts
            at = (g.info.model, pool)
            allocated[at] = allocated.get(at, 0) + g.used_milli
            unhealthy[at] = unhealthy.get(at, 0) + (0 if g.healthy else WHOLE)
            free[at] = free.get(at, 0) + spare
    for name, figures in (("allocated", allocated), ("free", free), ("unhealthy", unhealthy)):
        out[f"corral.node.gpus.{name}"] = [
            (milli / WHOLE, {"corral.gpu.model": m, "corral.node.pool": p})
            for (m, p), milli in sorted(figures.items())
        ]
    # Every model the cluster has, 0 where nothing is stranded: a series that vanished instead
    # would leave a graph at its last value once the last job of a model ended.
    stranded = dict.fromkeys(sorted({m for m, _ in allocated}), 0.0) | fragmented(state)
    out["corral.cluster.gpus.fragmented"] = [
        (milli / WHOLE, {"corral.gpu.model": m}) for m, milli in sorted(stranded.items())
    ]
    return out


def fragmented(state: State) -> dict[str, float]:
    """FGD's fragmentation per GPU model, in milli-GPU: over the schedulable nodes, the free
    capacity the workload (the unfinished jobs' shapes, as the placer weighs them) could not use."""
    frag = fragmentation_of(state)
    out: dict[str, float] = {}
    if not frag.workload.shapes:
        return out  # no workload to measure against: nothing is stranded for anyone
    for node in state.nodes.values():
        gpus = [g for g in node.gpus if g.healthy and not g.info.mig]
        if not gpus or not node.schedulable:
            continue
        model = gpus[0].info.model
        cpu_free = node.inventory.cpu_milli - node.cpu_used
        f = fragment(
            frag.workload.table(model), cpu_free, [g.free_milli for g in gpus if g.info.model == model]
        )
        out[model] = out.get(model, 0.0) + f
    return out
