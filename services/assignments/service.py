"""The assignments service's shell: fold the log, and write each node's view when it changes.

It runs under a lease like the decision services (``corral serve assignments``; ``corral up``
runs one): one replica writes, the others fold and stand by. The replica that takes the lease
(at start, or from another) writes every node's key from its own state, so keys a dead writer
left behind are made right; after that it writes a key only when the node's view differs from
what it last wrote there. A node deleted from the cluster (no jobs left on it) has its key
purged, and the replica that takes the lease purges every key of a node its state no longer
has, those deleted while no replica wrote (or before keys were purged) included: a cluster
whose nodes are replaced over months kept a key for every node it ever had. Those it purges
only once it has folded as far as the log went when it took the lease: a replica behind it
lacks the nodes registered lately, and an agent reads its key purged as its node gone from the
cluster (``views.gone``). It appends nothing to the log.

Invariants:

- A key's value is ``node_view`` of the folded state at some log position, the one the value
  names (``NodeView.seq``); a value is never older than one written before it by the same writer.
- A write that fails leaves its node dirty, to be written at the next cycle. Writes are
  conditional on the key's revision (``views.KvViewStore``): a late write of a replica that
  lost the lease is refused, not stored over this one's; one of this replica's refused so is
  written again, the key's revision read anew.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from corral.events import codec
from corral.events.base import Event
from corral.events.log import EventLog, Record
from corral.projections import assignments
from corral.projections.state import State
from corral.services.assignments.decide import ROLE as ROLE
from corral.services.assignments.decide import Index, touched, touches_no_view, views
from corral.services.runtime.lease import Lease
from corral.services.runtime.shell import Service
from corral.services.runtime.views import ViewStore

log = logging.getLogger("corral.assignments")

LIST_AGAIN_S = 30.0  # after the bucket's keys could not be listed, seconds before trying again


def _decide_nothing(state: State, now: float) -> list[Event]:
    return []  # what it writes goes to the bucket, not the log: ``AssignmentService.cycle``


class AssignmentService(Service):
    def __init__(
        self,
        log_: EventLog,
        store: ViewStore,
        *,
        lease: Lease | None = None,
        clock: Callable[[], float] | None = None,
        tick: float = 0.2,
        **options: Any,
    ) -> None:
        if clock is not None:
            options["clock"] = clock
        super().__init__(
            ROLE, _decide_nothing, log_, tick=tick, lease=lease, on_fold=self._touched, **options
        )
        self.store = store
        self.index = Index()
        self.dirty: set[str] = set()
        self.written: dict[str, bytes] = {}  # node -> the view's body last written there
        # Nodes whose key holds a view, as far as this replica knows (the bucket's keys when it
        # took the lease, and what it wrote since): a deleted node's key is purged only if it
        # has one, so a record naming a node long gone (a refused report of its agent's) writes
        # nothing.
        self.stored: set[str] = set()
        # Keys of nodes the state did not have when this replica took the lease, and the log's
        # last sequence then: they are purged once the state has folded that far, if it still
        # has no such node. A replica behind the log (a NATS failover slows its reader as it
        # takes the lease) lacks the nodes registered lately, and its agents read a purged key
        # as their node gone from the cluster, which stops their workers.
        self.orphans: set[str] = set()
        self._orphans_after = 0
        self._list_at: float | None = None  # when to list the bucket's keys (None: listed)
        self.writes = 0
        self.purges = 0
        self._writing = False  # holds the lease and has written every key since taking it

    def _touched(self, state: State, batch: list[Record]) -> None:
        if not self._writing:
            # A standby marks nothing: the replica that takes the lease writes every node from the
            # state (``Index.everywhere``), and an index kept meanwhile would only grow, with
            # every job ever placed, and cost more with each record.
            return
        for r in batch:
            if touches_no_view(r.subject):
                continue
            try:
                body, _, _ = codec.decode_record(r.subject, r.data, r.headers)
            except Exception:  # noqa: BLE001 - the fold has recorded it as refused; it touches nothing
                continue
            jobs, node = touched(body)
            self.index.mark(state, jobs, node, self.dirty)

    async def _list(self, now: float) -> None:
        """Learn the bucket's keys: those of nodes the state has not are purged once it has
        folded as far as the log went (``cycle``). Not listed (a server not answering), the
        views are written all the same, and the keys are listed again later: the views are what
        agents start workers from, the purge only tidies."""
        try:
            listed = await self.store.nodes()
            head = await self.log.last_seq()
        except Exception as e:  # noqa: BLE001 - tried again in LIST_AGAIN_S
            log.warning("the bucket's keys not listed, will retry in %g s: %s", LIST_AGAIN_S, e)
            self._list_at = now + LIST_AGAIN_S
            return
        self.orphans = listed - self.state.nodes.keys()
        self._orphans_after = head
        self.stored |= listed - self.orphans
        self._list_at = None

    async def cycle(self) -> int:
        now = self.now()
        if not self.supervision.may_decide(now):
            return 0  # backing off after a failure; a standby holds the lease meanwhile
        if self.lease is not None and not await self.lease.hold():
            if self._writing:  # another replica writes now: what this one knew goes stale
                self.index, self.dirty, self.orphans = Index(), set(), set()
            self._writing = False
            return 0
        if not self._writing:
            self.dirty |= self.index.everywhere(self.state)  # every node the state has
            self.written.clear()
            self.stored = set()
            self._list_at = now
            self._writing = True
        if self._list_at is not None and now >= self._list_at:
            await self._list(now)
        if self.orphans and self.state.seq >= self._orphans_after:
            self.stored |= self.orphans
            self.dirty |= self.orphans
            self.orphans = set()
        if not self.dirty:
            return 0
        dirty, self.dirty = self.dirty, set()
        pending = []
        gone = []  # nodes deleted from the cluster whose key holds a view: it is purged
        try:
            for view in views(self.state, self.index, dirty):
                if view.node not in self.state.nodes and not view.jobs:
                    # Nothing more to keep of it here, or every node name a cluster ever had
                    # would be.
                    self.written.pop(view.node, None)
                    self.index.jobs_on.pop(view.node, None)
                    if view.node in self.stored:
                        gone.append(view.node)
                    continue
                body = assignments.body(view)
                if self.written.get(view.node) != body:
                    pending.append((view.node, body, assignments.encode(view)))
        except Exception as e:  # noqa: BLE001 - supervised as every service's cycle is
            self.dirty |= dirty
            self._writing = False  # the replica that takes over, or this one after its back-off, writes all
            await self._failed(e, now)
            return 0
        self.supervision.succeeded()
        results = await asyncio.gather(
            *(self.store.put(node, value) for node, _, value in pending),
            *(self.store.remove(node) for node in gone),
            return_exceptions=True,
        )
        for (node, body, _), result in zip(pending, results[: len(pending)], strict=True):
            if isinstance(result, BaseException):
                log.warning("%s: view not written, will retry: %s", node, result)
                self.dirty.add(node)
            else:
                self.written[node] = body
                self.stored.add(node)
                self.writes += 1
        for node, result in zip(gone, results[len(pending) :], strict=True):
            if isinstance(result, BaseException):
                log.warning("%s: the key of a deleted node not purged, will retry: %s", node, result)
                self.dirty.add(node)
            else:
                self.stored.discard(node)
                self.purges += 1
        return len(pending) + len(gone)


def service(log_: EventLog, store: ViewStore, **options: Any) -> AssignmentService:
    """The service on ``log_`` writing to ``store``; ``options`` go to ``Service`` (clock, tick,
    snapshots, lease)."""
    return AssignmentService(log_, store, **options)
