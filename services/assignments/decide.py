"""Which nodes' views a record may change, and their new views: the assignments service's core.

The service folds every record like any service; for each it notes the jobs and the node it names
(``touched``), and marks dirty every node those jobs are, or were, placed or held on
(``Index.mark``). Once a batch is folded, ``views`` computes each dirty node's view with the one
pure ``node_view`` over only the jobs that may concern it, so a cycle costs O(the jobs the batch
touched and their nodes), never O(every job). Nothing here reads a clock or does IO.

Invariants:

- A node whose view may have changed is marked dirty: a record about a job dirties every node of
  its current and held placements (before and after the record), a record about a node dirties
  the node and the nodes of every job on it (a re-registered node may change its address, which
  every rank of a gang it leads reads).
- The index keeps, per node, a superset of the jobs in its view: a job joins when a record puts
  it on the node, leaves when the node's view no longer holds it.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.events import subjects
from corral.events.base import Event
from corral.events.routing import job_ids
from corral.projections.assignments import NodeView, node_view, nodes_of
from corral.projections.state import State

ROLE = "assignments"


_SUBMIT_FROM, _SUBMIT_VERB = f"{subjects.IN}.", ".submit"


def touches_no_view(subject: str) -> bool:
    """Whether a record on ``subject`` cannot change any node's view, whatever it holds: a
    submission makes a queued job, on no node (and one the fold refuses changes nothing). Such
    records are a deep backlog's bulk: they are not decoded a second time for ``touched``."""
    return subject.startswith(_SUBMIT_FROM) and subject.endswith(_SUBMIT_VERB)


def touched(body: Event) -> tuple[list[str], str | None]:
    """The jobs ``body`` names and the node it speaks for (None: no node)."""
    node = getattr(body, "node", None)
    return job_ids(body), node if isinstance(node, str) else None


class Index:
    """Jobs by node, and nodes by job, as far as views go."""

    def __init__(self) -> None:
        self.jobs_on: dict[str, set[str]] = {}
        self.nodes_by_job: dict[str, set[str]] = {}

    def mark(self, state: State, jobs: Iterable[str], node: str | None, dirty: set[str]) -> None:
        """Note what a folded record touched; add the nodes whose view it may change to ``dirty``."""
        for job_id in jobs:
            self._mark_job(state, job_id, dirty)
        if node is not None:
            dirty.add(node)
            for job_id in list(self.jobs_on.get(node, ())):
                self._mark_job(state, job_id, dirty)

    def _mark_job(self, state: State, job_id: str, dirty: set[str]) -> None:
        # A job on no node is not kept: an entry for every job ever named (queued and
        # cancelled, rejected, or named again after it left every view) would grow for ever.
        known = self.nodes_by_job.get(job_id)
        job = state.jobs.get(job_id)
        if job is not None:
            for n in nodes_of(job) - (known or set()):
                if known is None:
                    known = self.nodes_by_job[job_id] = set()
                known.add(n)
                self.jobs_on.setdefault(n, set()).add(job_id)
        if known:
            dirty.update(known)

    def everywhere(self, state: State) -> set[str]:
        """Every node: a service that takes the lease writes every key again."""
        for job in state.jobs.values():
            for n in nodes_of(job):
                self.nodes_by_job.setdefault(job.id, set()).add(n)
                self.jobs_on.setdefault(n, set()).add(job.id)
        return set(state.nodes) | set(self.jobs_on)

    def forget(self, node: str, job_id: str) -> None:
        self.jobs_on.get(node, set()).discard(job_id)
        nodes = self.nodes_by_job.get(job_id)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self.nodes_by_job[job_id]


def views(state: State, index: Index, dirty: Iterable[str]) -> list[NodeView]:
    """The views of the ``dirty`` nodes, by name; jobs no longer in a node's view leave its index."""
    out = []
    for node in sorted(dirty):
        candidates = index.jobs_on.get(node, set())
        view = node_view(state, node, candidates)
        kept = {a.job_id for a in view.jobs}
        for job_id in [j for j in candidates if j not in kept]:
            index.forget(node, job_id)
        out.append(view)
    return out
