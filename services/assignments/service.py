"""The assignments service's shell: fold the log, and write each node's view when it changes.

It runs under a lease like the decision services (``corral serve assignments``; ``corral up``
runs one): one replica writes, the others fold and stand by. The replica that takes the lease
(at start, or from another) writes every node's key from its own state, so keys a dead writer
left behind are made right; after that it writes a key only when the node's view differs from
what it last wrote there. It appends nothing to the log.

Invariants:

- A key's value is ``node_view`` of the folded state at some log position, the one the value
  names (``NodeView.seq``); a value is never older than one written before it by the same writer.
- A write that fails leaves its node dirty, to be written at the next cycle.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
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

GONE_KEPT = 1024


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
        # ... and of the nodes deleted lately, the newest ``GONE_KEPT``: a record naming one
        # (a refused report of its agent's, say) writes its key again only past them.
        self.gone: OrderedDict[str, bytes] = OrderedDict()
        self.writes = 0
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

    async def cycle(self) -> int:
        now = self.now()
        if not self.supervision.may_decide(now):
            return 0  # backing off after a failure; a standby holds the lease meanwhile
        if self.lease is not None and not await self.lease.hold():
            if self._writing:  # another replica writes now: what this one knew goes stale
                self.index, self.dirty = Index(), set()
            self._writing = False
            return 0
        if not self._writing:
            self.dirty |= self.index.everywhere(self.state)
            self.written.clear()
            self.gone.clear()
            self._writing = True
        if not self.dirty:
            return 0
        dirty, self.dirty = self.dirty, set()
        pending = []
        gone = set()  # nodes deleted from the cluster: their key says so, then they are forgotten
        try:
            for view in views(self.state, self.index, dirty):
                body = assignments.body(view)
                if view.node not in self.state.nodes and not view.jobs:
                    gone.add(view.node)
                if self.written.get(view.node, self.gone.get(view.node)) != body:
                    pending.append((view.node, body, assignments.encode(view)))
        except Exception as e:  # noqa: BLE001 - supervised as every service's cycle is
            self.dirty |= dirty
            self._writing = False  # the replica that takes over, or this one after its back-off, writes all
            await self._failed(e, now)
            return 0
        self.supervision.succeeded()
        results = await asyncio.gather(
            *(self.store.put(node, value) for node, _, value in pending), return_exceptions=True
        )
        for (node, body, _), result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("%s: view not written, will retry: %s", node, result)
                self.dirty.add(node)
            else:
                self.written[node] = body
                self.gone.pop(node, None)
                self.writes += 1
        for node in gone - self.dirty:
            # Its key holds a view of no node and no jobs (what an agent that comes back
            # reads before it registers): nothing more to keep of it here but among the
            # newest deleted, or every node name a cluster ever had would be.
            last = self.written.pop(node, None)
            if last is not None:
                self.gone[node] = last
                self.gone.move_to_end(node)
                while len(self.gone) > GONE_KEPT:
                    self.gone.popitem(last=False)
            self.index.jobs_on.pop(node, None)
            self.store.forget(node)
        return len(pending)


def service(log_: EventLog, store: ViewStore, **options: Any) -> AssignmentService:
    """The service on ``log_`` writing to ``store``; ``options`` go to ``Service`` (clock, tick,
    snapshots, lease)."""
    return AssignmentService(log_, store, **options)
