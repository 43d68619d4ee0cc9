"""Quota: what each queue holds, may still take, borrows and lends, derived from the State.

Units. Quotas are whole GPUs per GPU model key (``"*"`` = any model); the arithmetic here counts
milli-GPU (1000 per GPU) so that fractional and MIG workers are charged exactly: a worker of
``gpus`` whole GPUs costs ``gpus * 1000``, a fractional worker its ``gpu_milli``, a MIG worker
its profile's share of the GPU's memory slices. ``Admission.gpus`` records the whole GPUs of the
charge rounded up per job (what people read); the exact charge is always recomputed from the
job's resources and admitted replicas, so a gang of ten 0.1-GPU workers holds exactly one GPU.

Keys. A job with no ``gpu_models`` counts against ``"*"``. A job constrained to models counts
against one of them, in its own order, that its queue lists a quota for (admission takes the first
it fits; order and holds read the one ``Ledger.key_for`` names), else against ``"*"``. A
queue uses only the keys it lists; list a key with nominal 0 to let a queue borrow it and nothing
more.

The cohort tree (Kueue's hierarchical cohorts). Queues are leaves; a queue names its cohort, a
cohort names its parent (organisation → team cohorts → queues, any depth). Per key, for a node n:

    subtree(n)    = own nominal (cohorts may hold quota too) + Σ children (subtree − guaranteed)
    guaranteed(n) = subtree(n) − lending_limit, never below 0  (0 without a lending limit)
    usage(queue)  = what its admitted jobs hold;  usage(cohort) = Σ children max(0, usage − guaranteed)
    available(root) = subtree − usage
    available(n)  = max(0, guaranteed − usage) + min(available(parent),
                                                     subtree − guaranteed − max(0, usage − guaranteed)
                                                     + borrowing_limit)      (no limit: no min)

So a queue keeps ``nominal − lending_limit`` for itself whatever others do (it never lends more
than its lending limit), its usage never exceeds ``nominal + borrowing_limit``, and a cohort never
lends more than its members' lendable quota plus its own. Admitting a demand that fits keeps every
one of these true, which is what the fold relies on when it arbitrates ``JobsAdmitted``.

Cost: building the tree is O(queues + cohorts); charging the jobs that hold quota is O(jobs);
each fit check and each charge walk the tree's depth. Nothing here reads a clock or mutates State.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from corral.events.base import Reason
from corral.events.jobs import Admission, JobSpec, Resources
from corral.events.queues import CohortSpec, PriorityClassSpec, QueueSpec, Quota
from corral.projections import mig
from corral.projections.lifecycle import HOLDS_QUOTA
from corral.projections.shape import kind_of
from corral.projections.state import WHOLE, JobState, State
from corral.projections.thrash import capped

ANY = "*"

# MIG-capable models, for charging a MIG worker whose model is not pinned: the largest memory
# share its profile name has on any of them (a profile name means different slices on different
# models, e.g. 1g.10gb is one slice of an A100-80GB and two of an A100-40GB).
MIG_MODELS: tuple[str, ...] = ("A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL", "H200-141GB")

_NO_QUOTA = Quota()
_NOTHING: Mapping[str, int] = {}


# -- what a job costs ------------------------------------------------------------------------------


def mig_milli(profile: str, models: Iterable[str]) -> int | None:
    """A MIG instance's charge: its memory slices' share of one GPU, the largest over ``models``;
    None if the profile exists on none of them."""
    sizes = [p.size for m in models if (p := mig.profile(m, profile)) is not None]
    return max(sizes) * WHOLE // mig.SLICES if sizes else None


# (profile, gpu_models, key) -> a MIG worker's charge. The fold asks several times per job; the
# answers depend on the MIG tables alone, and only so many are kept: profiles come from tenants.
_mig_charges: dict[tuple[str, tuple[str, ...], str], int] = {}
_MAX_MIG_CHARGES = 4096


def _mig_worker_milli(profile: str, gpu_models: tuple[str, ...], key: str) -> int:
    models = (key,) if key != ANY else (gpu_models or MIG_MODELS)
    found = mig_milli(profile, models)
    if found is None and key != ANY:
        found = mig_milli(profile, gpu_models or MIG_MODELS)
    return WHOLE if found is None else found


def _gpu_milli(res: Resources) -> int:
    """Milli-GPU of one worker that is not a MIG slice: the one reading of the shape, without
    building a ``Shape`` (this is on the fold's and admission's hot paths)."""
    k = kind_of(res.gpus, res.gpu_milli, res.mig)
    return res.gpu_milli if k == "fraction" else (res.gpus * WHOLE if k == "whole" else 0)


def worker_milli(res: Resources, key: str = ANY) -> int:
    """What one worker costs against quota key ``key``, in milli-GPU."""
    if res.mig is not None:
        if type(res.gpu_models) is not tuple:
            return _mig_worker_milli(res.mig, res.gpu_models, key)
        known = (res.mig, res.gpu_models, key)
        milli = _mig_charges.get(known)
        if milli is None:
            milli = _mig_worker_milli(res.mig, res.gpu_models, key)
            if len(_mig_charges) < _MAX_MIG_CHARGES:
                _mig_charges[known] = milli
        return milli
    return _gpu_milli(res)


def candidate_keys(queue: QueueSpec, res: Resources) -> tuple[str, ...]:
    """The quota keys a job may count against in ``queue``, in order of preference."""
    if res.gpu_models:
        keys = tuple(m for m in res.gpu_models if m in queue.quotas)
        if keys:
            return keys
    return (ANY,)


def worker_demands(queue: QueueSpec, res: Resources) -> tuple[tuple[str, int], ...]:
    """(key, milli-GPU per worker) for each key the job may count against, in order of
    preference; empty when a worker needs no GPU. Called per pending job per cycle: the common
    shape (no model, no MIG) takes the short path."""
    if res.mig is None and not res.gpu_models:
        if res.gpus <= 0:
            return ()
        return ((ANY, _gpu_milli(res)),)
    return tuple((k, worker_milli(res, k)) for k in candidate_keys(queue, res) if worker_milli(res, k) > 0)


def min_replicas(spec: JobSpec) -> int:
    return spec.min_replicas if spec.min_replicas is not None else spec.replicas


def whole_gpus(milli: int) -> int:
    """The whole GPUs a charge is recorded as in ``Admission.gpus`` (rounded up)."""
    return -(-milli // WHOLE)


def admission_gpus(key: str, milli: int) -> dict[str, int]:
    return {key: whole_gpus(milli)} if milli > 0 else {}


def fmt_gpus(milli: int) -> str:
    """Milli-GPU for people: ``16``, ``2.5``, ``0.125``."""
    if milli % WHOLE == 0:
        return str(milli // WHOLE)
    return f"{milli / WHOLE:.3f}".rstrip("0")


def key_name(key: str) -> str:
    return "GPUs" if key == ANY else key


def gpus_text(milli: int, key: str = ANY) -> str:
    """``milli`` milli-GPU of quota ``key`` for people: ``1 GPU``, ``2.5 GPUs``, ``4 H100-80GB``."""
    if key != ANY:
        return f"{fmt_gpus(milli)} {key}"
    return f"{fmt_gpus(milli)} GPU{'' if milli == WHOLE else 's'}"


# -- the cohort tree -------------------------------------------------------------------------------


class _Node:
    """A queue (leaf) or a cohort of the tree, with its per-key arithmetic in milli-GPU."""

    __slots__ = (
        "name", "is_queue", "parent", "children", "quotas", "subtree", "guaranteed", "usage",
    )  # fmt: skip

    def __init__(self, name: str, is_queue: bool, quotas: Mapping[str, Quota]) -> None:
        self.name = name
        self.is_queue = is_queue
        self.parent: _Node | None = None
        self.children: list[_Node] = []
        self.quotas = quotas
        self.subtree: dict[str, int] = {}
        self.guaranteed: dict[str, int] = {}
        self.usage: dict[str, int] = {}

    def root(self) -> _Node:
        n = self
        while n.parent is not None:
            n = n.parent
        return n


@dataclass(frozen=True, slots=True)
class Branch:
    """A queue, or a cohort with every queue and cohort under it: one side of the tree below
    the cohort two queues meet in (Kueue's "almost lowest common ancestor"), or one step of the
    way down from a tree's root to a queue. Fair sharing compares branches' shares."""

    name: str
    queues: tuple[str, ...]  # the queue itself, or every queue under the cohort
    cohorts: tuple[str, ...] = ()  # the cohort and every cohort under it; none for a queue

    @property
    def is_queue(self) -> bool:
        return not self.cohorts


def _branch(n: _Node) -> Branch:
    if n.is_queue:
        return Branch(n.name, (n.name,))
    queues: list[str] = []
    cohorts: list[str] = []
    todo = [n]
    while todo:
        m = todo.pop()
        if m.is_queue:
            queues.append(m.name)
        else:
            cohorts.append(m.name)
            todo.extend(m.children)
    return Branch(n.name, tuple(sorted(queues)), tuple(sorted(cohorts)))


def _height(n: _Node) -> int:
    """How far ``n``'s furthest queue is below it: 0 for a queue, 1 for a cohort of queues, one
    more for each level of cohorts under it."""
    if n.is_queue:
        return 0
    return max([1, *(_height(c) + 1 for c in n.children if not c.is_queue)])


def may_be_preempted(spec: JobSpec, classes: Mapping[str, PriorityClassSpec]) -> bool:
    """Whether a job's spec and its priority class let it be preempted at all."""
    pc = classes.get(spec.priority_class)
    return spec.preemptible and (pc is None or pc.preemptible)


def stoppable(job: JobState, classes: Mapping[str, PriorityClassSpec]) -> bool:
    """Whether ``job`` could still be stopped to give quota back: it may be preempted at all
    (``may_be_preempted``) and its class's lifetime cap on preemptions has not run out (the
    guards that pass with time, such as a minimum runtime, do). Only such a job may borrow;
    the others are the queue's fixed holders (``State.quota_held_fixed``)."""
    return may_be_preempted(job.spec, classes) and not capped(job, classes.get(job.spec.priority_class))


def holding(job: JobState) -> list[tuple[str, int]]:
    """What an admitted job holds: (key, milli-GPU) per quota key of its admission."""
    adm = job.admission
    if adm is None or not adm.gpus:
        return []
    if len(adm.gpus) == 1:
        for key in adm.gpus:
            return [(key, worker_milli(job.spec.resources, key) * adm.replicas)]
    # More than one key cannot be proposed through ``check``; it is held as recorded.
    return [(key, gpus * WHOLE) for key, gpus in sorted(adm.gpus.items())]


def count_holding(state: State, job: JobState, sign: int) -> None:
    """Add (sign 1) or remove (sign -1) what ``job`` holds to ``State.quota_held``, and to
    ``State.quota_held_fixed`` for a job admitted as one that may not borrow
    (``JobState.fixed``): the fold calls it whenever a job enters or leaves a quota-holding
    phase."""
    _count(state.quota_held, job, sign)
    if _fixed(state, job):
        _count(state.quota_held_fixed, job, sign)


def refix(state: State, priority_class: str) -> dict[str, bool | None]:
    """Decide again whether the jobs of ``priority_class`` that hold quota hold it as fixed
    (``JobState.fixed``; the class changed whether its jobs may be preempted, or how often: an
    administrator's act, seldom), every other job's standing kept, and count
    ``State.quota_held_fixed`` again; the standings it replaced, for ``restore``."""
    was: dict[str, bool | None] = {}
    ledger: Ledger | None = None
    for phase in HOLDS_QUOTA:
        for job_id in state.jobs_by_phase.get(phase, ()):
            job = state.jobs[job_id]
            if job.spec.priority_class == priority_class:
                if ledger is None:
                    ledger = Ledger(state)
                was[job_id] = job.fixed
                job.fixed = not ledger.may_borrow(job)
    _recount_fixed(state)
    return was


def restore(state: State, was: dict[str, bool | None]) -> None:
    """Undo ``refix``: the standings it replaced, and the count from them."""
    for job_id, fixed in was.items():
        state.jobs[job_id].fixed = fixed
    _recount_fixed(state)


def _recount_fixed(state: State) -> None:
    state.quota_held_fixed = {}
    for phase in HOLDS_QUOTA:
        for job_id in state.jobs_by_phase.get(phase, ()):
            job = state.jobs[job_id]
            if _fixed(state, job):
                _count(state.quota_held_fixed, job, 1)


def _fixed(state: State, job: JobState) -> bool:
    """``job.fixed``; one the fold never admitted (a state made by hand) is decided now, once."""
    if job.fixed is None:
        job.fixed = not Ledger(state).may_borrow(job)
    return job.fixed


def _count(held: dict[str, dict[str, int]], job: JobState, sign: int) -> None:
    queue = job.spec.queue
    per_key = held.get(queue)
    if per_key is None:
        per_key = held[queue] = {}
    adm = job.admission
    if adm is not None and len(adm.gpus) == 1:  # ``holding``'s one key, without its list
        (key,) = adm.gpus
        res = job.spec.resources
        milli = worker_milli(res, key)
        left = per_key.get(key, 0) + sign * milli * adm.replicas
        if left:
            per_key[key] = left
        else:
            per_key.pop(key, None)
    else:
        for key, milli in holding(job):
            left = per_key.get(key, 0) + sign * milli
            if left:
                per_key[key] = left
            else:
                per_key.pop(key, None)
    if not per_key:
        del held[queue]


class Ledger:
    """The cohort tree and every queue's usage, built from one State, then updated by charges.

    ``decide`` charges its own admissions as it makes them; the fold charges each admission of a
    ``JobsAdmitted`` in order, so both see the same arithmetic at the same log position.
    """

    def __init__(self, state: State) -> None:
        self._queues: dict[str, _Node] = {}
        self._cohorts: dict[str, _Node] = {}
        self._specs = state.queues
        self._classes = state.priority_classes
        # What jobs that may not be preempted hold, per queue and key (``may_borrow``).
        self._fixed: dict[str, dict[str, int]] = {}
        self._trees: dict[_Node, list[_Node]] | None = None  # root -> its queues, on first use
        self._ceilings: dict[tuple[str, str], int] = {}  # depend on the tree only
        self._fixed_limits: dict[tuple[str, str], int] = {}  # ... as these do
        self._shared = {name for name, c in state.cohorts.items() if c.share_own_quota}
        self._branches: dict[tuple[bool, str], Branch] = {}  # depend on the tree only
        # Whether some node could host a job of ``spec`` on GPUs of a model it names
        # (``Inventory.hosts_spec``), where the deciding service has an inventory: a job of
        # several models runs on the one it is charged to, so one no node could host it on is
        # no model to count it against (``demands``). None: every model may.
        self.hosts: Callable[[JobSpec, str], bool] | None = None
        for c in sorted(state.cohorts):
            self._cohorts[c] = _Node(c, False, state.cohorts[c].quotas)
        for name in sorted(state.queues):
            q = state.queues[name]
            node = self._queues[name] = _Node(name, True, q.quotas)
            if q.cohort is not None:
                node.parent = self._cohort(q.cohort)
        for name in sorted(state.cohorts):
            parent = state.cohorts[name].parent
            if parent is not None:
                self._cohorts[name].parent = self._cohort(parent)
        self._cut_loops()
        nodes = [*self._cohorts.values(), *self._queues.values()]
        for n in nodes:
            if n.parent is not None:
                n.parent.children.append(n)
        keys = sorted({k for n in nodes for k in n.quotas})
        for n in sorted(nodes, key=lambda n: -_depth(n)):  # children before parents
            for k in keys:
                own = n.quotas.get(k, _NO_QUOTA)
                sub = own.nominal * WHOLE + sum(c.subtree[k] - c.guaranteed[k] for c in n.children)
                n.subtree[k] = sub
                ll = own.lending_limit
                n.guaranteed[k] = max(0, sub - ll * WHOLE) if ll is not None and n.parent else 0

    def copy(self) -> Ledger:
        """A ledger to charge apart from this one: what a charge changes (each node's usage and
        held) is copied; the tree and its quota, fixed for the ledger's life, are shared."""
        twin = object.__new__(Ledger)
        twin.__dict__.update(self.__dict__)
        made: dict[int, _Node] = {}
        for n in (*self._cohorts.values(), *self._queues.values()):
            m = made[id(n)] = object.__new__(_Node)
            for slot in _Node.__slots__:
                setattr(m, slot, getattr(n, slot))
            m.usage = dict(n.usage)
        for m in made.values():
            if m.parent is not None:
                m.parent = made[id(m.parent)]
            m.children = [made[id(c)] for c in m.children]
        twin._cohorts = {name: made[id(n)] for name, n in self._cohorts.items()}
        twin._queues = {name: made[id(n)] for name, n in self._queues.items()}
        twin._trees = None
        twin._fixed = {q: dict(held) for q, held in self._fixed.items()}
        return twin

    @classmethod
    def from_state(cls, state: State) -> Ledger:
        """The ledger at the state's position; usage comes from what the fold keeps per queue
        (``State.quota_held``), so building one costs O(queues + cohorts), not O(jobs)."""
        ledger = cls(state)
        for queue in sorted(state.quota_held):
            if queue in ledger._queues:
                for key, milli in sorted(state.quota_held[queue].items()):
                    ledger.charge(queue, key, milli)
        ledger._fixed = {q: dict(held) for q, held in state.quota_held_fixed.items()}
        return ledger

    @classmethod
    def from_jobs(cls, state: State) -> Ledger:
        """The same ledger charged job by job: the definition ``from_state`` must agree with."""
        ledger = cls(state)
        for job in state.jobs.values():
            if job.phase in HOLDS_QUOTA:
                ledger.hold(job)
        return ledger

    def _sync(self, held: Mapping[str, Mapping[str, int]]) -> None:
        """Bring each queue's usage to ``held`` (as ``State.quota_held`` counts it), charging only
        the differences. Usage up the tree is a function of the queues' own usage alone, so this
        ends where a new ledger charged with ``held`` starts."""
        for name, node in self._queues.items():
            usage = node.usage
            want = held.get(name)
            if want is None:
                if not usage:
                    continue
                want = _NOTHING
            elif usage == want:
                continue
            for key, milli in want.items():
                delta = milli - usage.get(key, 0)
                if delta:
                    self.charge(name, key, delta)
            if not usage.keys() <= want.keys():  # keys it held and holds no more
                for key in [k for k in usage if k not in want]:
                    if usage[key]:
                        self.charge(name, key, -usage[key])
                    del usage[key]

    def _cohort(self, name: str) -> _Node:
        """A cohort named by a queue or as a parent need not be defined: it is then an empty
        root that only pools its members' quota."""
        node = self._cohorts.get(name)
        if node is None:
            node = self._cohorts[name] = _Node(name, False, {})
        return node

    def _cut_loops(self) -> None:
        # The fold refuses a cohort whose parent chain loops; this only keeps the walk finite.
        for name in sorted(self._cohorts):
            seen: set[str] = set()
            n: _Node | None = self._cohorts[name]
            while n is not None and n.parent is not None:
                if n.name in seen:
                    n.parent = None
                    break
                seen.add(n.name)
                n = n.parent

    # -- reading ------------------------------------------------------------------------------

    def has_queue(self, queue: str) -> bool:
        return queue in self._queues

    def spec(self, queue: str) -> QueueSpec:
        return self._specs[queue]

    def quota(self, queue: str, key: str) -> Quota:
        return self._queues[queue].quotas.get(key, _NO_QUOTA)

    def listed(self, queue: str, key: str) -> bool:
        return key in self._queues[queue].quotas

    def nominal(self, queue: str, key: str) -> int:
        return self.quota(queue, key).nominal * WHOLE

    def used(self, queue: str, key: str) -> int:
        return self._queues[queue].usage.get(key, 0)

    def usage(self, queue: str) -> Mapping[str, int]:
        return self._queues[queue].usage

    def cohort(self, queue: str) -> str | None:
        parent = self._queues[queue].parent
        return None if parent is None else parent.name

    def root(self, queue: str) -> str:
        return self._queues[queue].root().name

    def cohort_root(self, cohort: str) -> str:
        node = self._cohorts.get(cohort)
        return cohort if node is None else node.root().name

    def capacity(self, queue: str, key: str) -> int:
        """All quota for ``key`` in the queue's tree: what fair share is measured against."""
        return self._queues[queue].root().subtree.get(key, 0)

    def guaranteed(self, queue: str, key: str) -> int:
        """What the queue keeps for itself: nominal less what it lends (all of it at a root)."""
        node = self._queues[queue]
        return node.guaranteed.get(key, 0) if node.parent is not None else node.subtree.get(key, 0)

    def may_be_preempted(self, spec: JobSpec) -> bool:
        """``may_be_preempted`` with this state's priority classes."""
        return may_be_preempted(spec, self._classes)

    def may_borrow(self, job: JobState) -> bool:
        """Whether ``job`` may hold more than its queue's nominal quota: only one that could
        still be stopped (``stoppable``). What a queue borrows is its lenders' nominal, theirs
        again as soon as they need it, and only stopping the borrower gives it back; a job that
        may not be stopped stays within its own queue's nominal (KAI-Scheduler's rule for
        non-preemptible jobs; with a cohort that shares its own quota, and its part of that,
        ``fixed_limit``), or a lender's nominal would be guaranteed only until such a job
        borrowed it. One preempted as often as its class allows is held so too, unless it is
        larger than that on every model it may count against: a job its owner let be
        preempted because it could not fit otherwise would then never run again. Its loan can
        be taken back only when it ends."""
        classes = self._classes
        if not may_be_preempted(job.spec, classes):
            return False
        if not capped(job, classes.get(job.spec.priority_class)):
            return True
        queue = job.spec.queue
        if queue not in self._queues:
            return False
        # Every model it may count against, hosted now or not: read alike by the fold and by the
        # services, whose ledgers leave out models no node can host (``demands``).
        lo = min_replicas(job.spec)
        demands = worker_demands(self._specs[queue], job.spec.resources)
        return all(per_worker * lo > self.fixed_limit(queue, key) for key, per_worker in demands)

    def held_fixed(self, job: JobState) -> bool:
        """Whether what ``job`` holds is its queue's fixed part: as it was admitted
        (``JobState.fixed``) while it holds quota; as it would be now, for one stopped and
        waiting to be admitted again."""
        if job.fixed is not None and job.phase in HOLDS_QUOTA:
            return job.fixed
        return not self.may_borrow(job)

    def may_take_back(self, job: JobState) -> bool:
        """Whether ``job`` could be stopped for a job of its queue once that one needs its quota
        back (``stoppable``)."""
        return stoppable(job, self._classes)

    def fixed_limit(self, queue: str, key: str) -> int:
        """The most of ``key`` the queue's jobs that may not be preempted may hold: its nominal,
        and, where its cohort shares its own quota (``CohortSpec.share_own_quota``), its part of
        it (no queue's nominal, so none is lent by holding it), divided among the cohort's
        queues by weight. The parts add up to at most the cohort's own quota, so with every
        queue's such jobs at their limit each queue can still take its nominal back from the
        borrowers that may be stopped."""
        found = self._fixed_limits.get((queue, key))
        if found is None:
            node = self._queues[queue]
            found = node.quotas.get(key, _NO_QUOTA).nominal * WHOLE
            parent = node.parent
            own = parent.quotas.get(key) if parent is not None and parent.name in self._shared else None
            if parent is not None and own is not None and own.nominal > 0:
                weights = {c.name: self._weight(c.name) for c in parent.children if c.is_queue}
                total = sum(weights.values())
                if total > 0:
                    found += int(own.nominal * WHOLE * weights[queue] / total)
            self._fixed_limits[queue, key] = found
        return found

    def _weight(self, queue: str) -> float:
        spec = self._specs.get(queue)
        return spec.weight if spec is not None else 0.0

    def available(self, queue: str, key: str, borrow: bool = True) -> int:
        """How much more the queue may hold of ``key`` right now (may be < 0 after a quota cut);
        without ``borrow``, for a job that may not borrow (``may_borrow``): within its nominal."""
        node = self._queues[queue]
        if key not in node.quotas:
            return 0
        avail = _available(node, key)
        if borrow:
            return avail
        return min(avail, self.fixed_limit(queue, key) - self.fixed(queue, key))

    def fixed(self, queue: str, key: str) -> int:
        """What the queue's jobs that may not be preempted hold of ``key``."""
        held = self._fixed.get(queue)
        return 0 if held is None else held.get(key, 0)

    def _charge_fixed(self, queue: str, key: str, milli: int) -> None:
        held = self._fixed.setdefault(queue, {})
        left = held.get(key, 0) + milli
        if left:
            held[key] = left
        else:
            held.pop(key, None)

    def from_cohort(self, queue: str, key: str) -> int:
        """What the queue could borrow right now on top of what it keeps for itself."""
        node = self._queues[queue]
        if node.parent is None or key not in node.quotas:
            return 0
        return _available(node, key) - max(0, node.guaranteed.get(key, 0) - node.usage.get(key, 0))

    def ceiling(self, queue: str, key: str, borrow: bool = True) -> int:
        """The most the queue could ever hold of ``key``: its available with the tree idle (for
        a job that may not borrow, at most its nominal)."""
        found = self._ceilings.get((queue, key))
        if found is None:
            node = self._queues[queue]
            found = self._ceilings[queue, key] = _ceiling(node, key) if key in node.quotas else 0
        return found if borrow else min(found, self.fixed_limit(queue, key))

    def fits(self, queue: str, key: str, milli: int, borrow: bool = True) -> bool:
        return milli <= 0 or milli <= self.available(queue, key, borrow)

    def key_for(self, queue: str, job: JobState) -> tuple[str, int] | None:
        """The quota key a queued ``job`` counts against now, with what it needs there at
        its minimum workers (milli-GPU); None if it needs no quota. Of its keys, in its order
        (Kueue's flavor assignment, with its default fungibility): the first it fits now,
        borrowing if it must; else the first whose nominal its queue's own jobs leave room in
        (what others hold of it is lent, and may be taken back); else the first within the
        nominal at all; else the first. Admission's order and holds read the job's key here, so a
        job that fits its second model's nominal is not taken for a borrower of its first."""
        spec = job.spec
        demands = self.demands(queue, spec)
        if not demands:
            return None
        lo = min_replicas(spec)
        if len(demands) == 1:
            return demands[0][0], demands[0][1] * lo
        needs = [(key, per_worker * lo) for key, per_worker in demands]
        borrow = self.may_borrow(job)
        for key, need in needs:
            if self.fits(queue, key, need, borrow):
                return key, need
        for key, need in needs:
            if self.used(queue, key) + need <= self.nominal(queue, key):
                return key, need
        for key, need in needs:
            if need <= self.nominal(queue, key):
                return key, need
        return needs[0]

    def demands(self, queue: str, spec: JobSpec) -> tuple[tuple[str, int], ...]:
        """``worker_demands`` of a job of ``spec`` in ``queue``, less the models no node could
        host it on (``hosts``), unless that leaves none (it waits, as a job no node can host)."""
        demands = worker_demands(self.spec(queue), spec.resources)
        hosts = self.hosts
        if hosts is None or len(demands) < 2:
            return demands
        models = spec.resources.gpu_models
        hosted = tuple((k, d) for k, d in demands if k not in models or hosts(spec, k))
        return hosted or demands

    def borrowers(self, queue: str, key: str, exclude: bool = True) -> list[tuple[str, int]]:
        """Queues of ``queue``'s tree holding more than their nominal (itself too unless
        ``exclude``), biggest first."""
        out = [
            (n.name, n.usage.get(key, 0) - n.quotas.get(key, _NO_QUOTA).nominal * WHOLE)
            for n in self._tree(queue)
            if not (exclude and n.name == queue)
        ]
        return sorted(((name, b) for name, b in out if b > 0), key=lambda x: (-x[1], x[0]))

    def lenders_to(self, queue: str, key: str) -> list[str]:
        """The queues of ``queue``'s tree that hold quota of ``key`` lent by ``queue``'s side
        (``borrows_from``), by name."""
        return sorted(n.name for n in self._tree(queue) if self.borrows_from(n.name, queue, key))

    def _tree(self, queue: str) -> list[_Node]:
        root = self._queues[queue].root()
        if self._trees is None:
            self._trees = {}
            for n in self._queues.values():
                self._trees.setdefault(n.root(), []).append(n)
        return self._trees[root]

    def sides(self, queue: str, other: str) -> tuple[_Node, _Node] | None:
        """The two sides of the cohort tree two queues meet in: the children of their lowest
        common cohort that hold ``queue`` and ``other`` (the queues themselves when they share a
        cohort); None for one queue, or queues of different trees."""
        start = self._queues.get(queue)
        if start is None or queue == other:
            return None
        below: dict[_Node, _Node] = {}  # each cohort above ``queue`` -> its child on the way up
        n: _Node | None = start.parent
        child = start
        while n is not None:
            below[n] = child
            child = n
            n = n.parent
        m, theirs = self._queues.get(other), None
        while m is not None:
            if m in below and theirs is not None:
                return below[m], theirs
            m, theirs = m.parent, m
        return None

    def branches(self, queue: str, other: str) -> tuple[Branch, Branch] | None:
        """The two sides (``sides``) as branches, ``queue``'s first."""
        sides = self.sides(queue, other)
        return None if sides is None else (self._as_branch(sides[0]), self._as_branch(sides[1]))

    def lineage(self, queue: str) -> tuple[Branch, ...]:
        """The way down from ``queue``'s tree's root to it: the root's child that holds it, its
        child that holds it, and so on to the queue itself (the queue alone with no cohort)."""
        way: list[Branch] = []
        n: _Node | None = self._queues[queue]
        while n is not None and n.parent is not None:
            way.append(self._as_branch(n))
            n = n.parent
        return tuple(reversed(way)) if way else (self._as_branch(self._queues[queue]),)

    def branch_nominal(self, branch: Branch, key: str) -> int:
        """The nominal quota of ``key`` in ``branch``: its queues' and its cohorts' own."""
        if branch.is_queue:
            return self.nominal(branch.name, key)
        own = sum(self._cohorts[c].quotas.get(key, _NO_QUOTA).nominal for c in branch.cohorts)
        return own * WHOLE + sum(self.nominal(q, key) for q in branch.queues)

    def branch_weight(self, branch: Branch) -> float:
        """A branch's fair-sharing weight: a queue's own; a cohort's, its queues' on average. A
        cohort has no weight of its own: Kueue weighs one 1 unless told otherwise, as a queue,
        whatever it holds, so that a team is judged on the scale of a queue beside it. The sum
        would make a big team's borrowing cheap: a department of two queues that borrows a
        GPU would read half the share of one of one queue that borrows a GPU, and take it.
        With every weight the default (1), a cohort weighs 1, as Kueue's."""
        if branch.is_queue:
            return self._weight(branch.name)
        return sum(self._weight(q) for q in branch.queues) / len(branch.queues) if branch.queues else 0.0

    def _as_branch(self, n: _Node) -> Branch:
        found = self._branches.get((n.is_queue, n.name))
        if found is None:
            found = self._branches[(n.is_queue, n.name)] = _branch(n)
        return found

    def borrows_from(self, holder: str, queue: str, key: str) -> bool:
        """Whether ``holder`` holds quota of ``key`` lent by ``queue``'s side of the tree: it holds
        more than its nominal, and so does every cohort above it up to its side (the child, on
        its branch, of the cohort the two meet in), each counted as its parent counts it (what
        its members hold beyond what they keep from lending, against its quota with what they
        may lend). A cohort within its quota borrowed nothing from outside it, whatever its
        queues took from each other (Kueue's hierarchical reclaim: candidates come only from
        subtrees over their quota)."""
        sides = self.sides(queue, holder)
        if sides is None:
            return False
        theirs = sides[1]
        n: _Node | None = self._queues[holder]
        while n is not None:
            if n.usage.get(key, 0) <= n.subtree.get(key, 0):
                return False
            if n is theirs:
                return True
            n = n.parent
        return False

    def within_own(self, queue: str, holder: str, key: str, extra: int) -> bool:
        """Whether ``queue``, holding ``extra`` more of ``key``, needs none of what ``holder``'s side
        of the tree holds: the queue stays within its nominal, or some cohort above it up to its
        side stays within its quota, each counted as its parent counts it (Kueue's hierarchical
        advantage). It would then take back only quota its side lent."""
        sides = self.sides(queue, holder)
        if sides is None:
            return False
        return self._fits_below(self._queues[queue], key, extra, sides[0]) is not None

    def _fits_below(self, n: _Node, key: str, extra: int, top: _Node | None) -> _Node | None:
        """The lowest node from queue ``n`` up to ``top`` (the root when None) within its quota
        holding ``extra`` more of ``key`` at the queue; None if none is. What reaches a parent is
        what a charge carries up (``charge``): the part beyond what the child keeps from lending."""
        while True:
            used = n.usage.get(key, 0)
            if used + extra <= n.subtree.get(key, 0):
                return n
            if n is top or n.parent is None:
                return None
            g = n.guaranteed.get(key, 0)
            extra = (used + extra - g if used + extra > g else 0) - (used - g if used > g else 0)
            n = n.parent

    def fits_below_root(self, queue: str, key: str, need: int) -> bool:
        """Whether ``queue``, in a cohort, holding ``need`` more of ``key``, stays within its
        nominal, or some cohort above it short of the tree's root stays within its quota
        (Kueue's ``mayReclaimInHierarchy``): what it would take is then its side's own."""
        n = self._queues.get(queue)
        if n is None or n.parent is None:
            return False
        found = self._fits_below(n, key, need, None)
        return found is not None and found.parent is not None

    def borrowing_height(self, queue: str, key: str, need: int) -> int:
        """How far ``queue`` must borrow to hold ``need`` more of ``key`` (Kueue's borrowing
        height: who borrows less goes first): 0 within its own nominal, or with no cohort;
        else the height of the lowest cohort above it within its quota with the need counted
        (``_fits_below``), or of the tree's root if none is. A cohort's height is how far its
        furthest queue is below it, so borrowing from a cohort that holds a deep tree counts as
        borrowing further than borrowing from a small one, wherever the queue sits."""
        n = self._queues.get(queue)
        if n is None or n.parent is None:
            return 0
        found = self._fits_below(n, key, need, None)
        return _height(found if found is not None else n.root())

    # -- writing ------------------------------------------------------------------------------

    def charge(self, queue: str, key: str, milli: int, fixed: bool = False) -> None:
        """Add ``milli`` (negative: release) to the queue's usage and carry it up the tree;
        ``fixed``: of a job that may not be preempted, counted apart as well (``fixed``)."""
        if fixed:
            self._charge_fixed(queue, key, milli)
        n = self._queues[queue]
        old = n.usage.get(key, 0)
        new = old + milli
        n.usage[key] = new
        # The arithmetic of the module docstring, without calls to max: this runs per charge.
        while n.parent is not None:
            g = n.guaranteed.get(key, 0)
            delta = (new - g if new > g else 0) - (old - g if old > g else 0)  # max(0, ·) each
            if delta == 0:
                return
            n = n.parent
            old = n.usage.get(key, 0)
            new = old + delta
            n.usage[key] = new

    def hold(self, job: JobState) -> tuple[str, int] | None:
        """Charge what an admitted job holds; returns its (key, milli), None if nothing."""
        if job.spec.queue not in self._queues:
            return None
        held = holding(job)
        fixed = self.held_fixed(job)
        for key, milli in held:
            self.charge(job.spec.queue, key, milli, fixed)
        return held[0] if len(held) == 1 else None

    # -- the admission rule -------------------------------------------------------------------

    def admissible(self, queue: str, demand: Mapping[str, int]) -> Reason | None:
        """Whether ``demand`` (milli-GPU per key, all or nothing) fits the queue right now."""
        if queue not in self._queues:
            return Reason("unknown-queue", f"no queue {queue}")
        for key in sorted(demand):
            milli = demand[key]
            if milli <= 0:
                continue
            if key not in self._queues[queue].quotas:
                return Reason("no-quota", f"queue {queue} has no quota for {key_name(key)}")
            if not self.fits(queue, key, milli):
                return Reason("quota", self.describe(queue, key, milli))
        return None

    def check(self, job: JobState, adm: Admission) -> Reason | None:
        """Whether ``adm`` is a faithful, fitting admission of ``job`` at this point of the log:
        one key the job may count against, its GPUs as the job's resources say, within quota."""
        return self._verdict(job, adm, self.may_borrow(job))[0]

    def claim(self, job: JobState, adm: Admission, borrow: bool | None = None) -> Reason | None:
        """``check``, then charge the admission if it holds: the fold's call per admission.
        ``borrow``: ``may_borrow(job)``, when the caller has read it already (the fold keeps it
        as ``JobState.fixed``)."""
        if borrow is None:
            borrow = self.may_borrow(job)
        why, key, milli = self._verdict(job, adm, borrow)
        if why is None and key is not None:
            self.charge(job.spec.queue, key, milli, not borrow)  # as ``hold_admission``
        return why

    def claim_growth(self, job: JobState, grown: Admission) -> Reason | None:
        """``claim`` of a larger admission of a job that holds quota already: what it holds is
        given back for the check, and charged again if the growth does not fit."""
        queue = job.spec.queue
        held = holding(job)
        fixed = self.held_fixed(job)
        for key, milli in held:
            self.charge(queue, key, -milli, fixed)
        why = self.claim(job, grown)
        if why is not None:
            for key, milli in held:
                self.charge(queue, key, milli, fixed)
        return why

    def _verdict(self, job: JobState, adm: Admission, borrow: bool) -> tuple[Reason | None, str | None, int]:
        """``check``'s answer, with the key and milli-GPU the admission charges (None: none);
        ``borrow``: whether the job may borrow (``may_borrow``)."""
        spec = job.spec
        queue = spec.queue
        node = self._queues.get(queue)
        if node is None:
            return Reason("unknown-queue", f"no queue {queue}"), None, 0
        res = spec.resources
        if res.mig is None and res.gpus <= 0:  # ``worker_milli(res) == 0``: a MIG worker costs some
            if adm.gpus:
                return Reason("shape", f"job {job.id} uses no GPU but the admission holds some"), None, 0
            return None, None, 0
        if len(adm.gpus) != 1:
            return Reason("shape", f"admission of {job.id} must name exactly one quota key"), None, 0
        ((key, gpus),) = adm.gpus.items()
        if res.gpu_models or key != ANY:  # else ``candidate_keys`` is (ANY,)
            keys = candidate_keys(self._specs[queue], res)
            if key not in keys:
                why = f"job {job.id} may count against {', '.join(keys)}, not {key}"
                return Reason("shape", why), None, 0
        milli = worker_milli(res, key)
        milli *= adm.replicas
        if gpus != -(-milli // WHOLE):  # ``whole_gpus``
            why = f"{adm.replicas} workers of {job.id} hold {fmt_gpus(milli)} {key}"
            return Reason("shape", why), None, 0
        # ``admissible(queue, {key: milli})``, for the one key an admission names.
        if milli <= 0:
            return None, key, milli
        if key not in node.quotas:
            return Reason("no-quota", f"queue {queue} has no quota for {key_name(key)}"), None, 0
        if milli > _available(node, key):
            return Reason("quota", self.describe(queue, key, milli)), None, 0
        if not borrow and self.fixed(queue, key) + milli > self.fixed_limit(queue, key):
            return Reason("quota", self.describe(queue, key, milli, borrow=False)), None, 0
        return None, key, milli

    def hold_admission(self, job: JobState, adm: Admission) -> None:
        fixed = not self.may_borrow(job)
        for key in adm.gpus:
            self.charge(job.spec.queue, key, worker_milli(job.spec.resources, key) * adm.replicas, fixed)

    def describe(self, queue: str, key: str, milli: int, borrow: bool = True) -> str:
        """Why ``milli`` of ``key`` does not fit ``queue`` now, in operator terms (for a job that
        may not borrow, within the queue's nominal)."""
        if not borrow:
            fixed, limit = self.fixed(queue, key), self.fixed_limit(queue, key)
            nominal = self.nominal(queue, key)
            part = (
                ""
                if limit == nominal
                else f" and its part of its cohort's own quota, {fmt_gpus(limit - nominal)}"
            )
            return (
                f"needs {gpus_text(milli, key)} and may not be preempted, so may not "
                f"borrow: jobs of queue {queue} that may not be preempted hold {fmt_gpus(fixed)} "
                f"of its nominal {fmt_gpus(nominal)}{part}"
            )
        return f"needs {gpus_text(milli, key)}; {self.standing(queue, key)}"

    def standing(self, queue: str, key: str) -> str:
        """Where the queue stands on ``key``: its usage against nominal, what its cohort lends."""
        name = key_name(key)
        used, nominal = self.used(queue, key), self.nominal(queue, key)
        if used > nominal:
            text = (
                f"queue {queue} over its nominal {fmt_gpus(used)}/{fmt_gpus(nominal)} {name}"
                f" (borrowing {fmt_gpus(used - nominal)})"
            )
        elif used == nominal:
            text = f"queue {queue} at its nominal {fmt_gpus(used)}/{fmt_gpus(nominal)} {name}"
        else:
            text = f"queue {queue} using {fmt_gpus(used)} of its nominal {gpus_text(nominal, key)}"
        limit = self.quota(queue, key).borrowing_limit
        if limit is not None:
            text += f", borrowing limit {limit}"
        cohort = self.cohort(queue)
        if cohort is None:
            return f"{text}; no cohort to borrow from"
        if used >= nominal:
            return f"{text}; cohort {cohort} has {fmt_gpus(max(0, self.from_cohort(queue, key)))} to lend"
        # Below its nominal, what it may take now counts its own unused nominal first: "the
        # cohort has 5 to lend" read as 5 more than its own 5.
        free, spare = max(0, self.available(queue, key)), nominal - used
        text += f"; {fmt_gpus(free)} free to it now in cohort {cohort}"
        if free > spare:
            return f"{text}, {fmt_gpus(free - spare)} of them borrowed"
        if free < spare:
            return f"{text}, {fmt_gpus(spare - free)} of its nominal in use by other queues"
        return text


def _depth(n: _Node) -> int:
    d = 0
    while n.parent is not None:
        n = n.parent
        d += 1
    return d


def _available(n: _Node, key: str) -> int:
    if n.parent is None:
        return n.subtree.get(key, 0) - n.usage.get(key, 0)
    # The arithmetic of the module docstring, with comparisons for max and min: this runs per
    # admission checked.
    g = n.guaranteed.get(key, 0)
    used = n.usage.get(key, 0)
    # An over-committed parent (its quota was cut) takes nothing from what n keeps for itself.
    parent = n.parent
    if parent.parent is None:  # the root, as the first lines say
        from_parent = parent.subtree.get(key, 0) - parent.usage.get(key, 0)
    else:
        from_parent = _available(parent, key)
    if from_parent < 0:
        from_parent = 0
    limit = n.quotas.get(key, _NO_QUOTA).borrowing_limit
    if limit is not None:
        stored = n.subtree.get(key, 0) - g
        cap = stored - (used - g if used > g else 0) + limit * WHOLE
        if cap < from_parent:
            from_parent = cap
    return (g - used if g > used else 0) + from_parent


def _ceiling(n: _Node, key: str) -> int:
    if n.parent is None:
        return n.subtree.get(key, 0)
    g = n.guaranteed.get(key, 0)
    from_parent = _ceiling(n.parent, key)
    limit = n.quotas.get(key, _NO_QUOTA).borrowing_limit
    if limit is not None:
        from_parent = min(from_parent, n.subtree.get(key, 0) - g + limit * WHOLE)
    return g + from_parent


# -- the functions other modules call --------------------------------------------------------------


class _FoldLedger(threading.local):
    """The fold's ledger, with the queues and cohorts its tree was built from, per thread."""

    built: tuple[dict[str, QueueSpec], dict[str, CohortSpec], Ledger] | None = None


_fold = _FoldLedger()


def fold_ledger(state: State) -> Ledger:
    """The ledger the fold arbitrates ``JobsAdmitted`` with: it answers as
    ``Ledger.from_state(state)`` would, at a fraction of the cost. Its tree is built again only
    when the state's queues or cohorts differ from those it was built from (the specs are frozen
    values, so equal mappings make the same tree), and its usage is brought to the state's
    ``quota_held`` by charging what changed. It is one object, reused call after call: a caller
    charges it for the event at hand and does not keep it."""
    built = _fold.built
    if built is None or built[0] != state.queues or built[1] != state.cohorts:
        ledger = Ledger(state)
        queues = ledger._specs = dict(state.queues)  # its own: the state's mapping may change
        _fold.built = built = (queues, dict(state.cohorts), ledger)
    ledger = built[2]
    ledger._sync(state.quota_held)
    ledger._classes = state.priority_classes
    ledger._fixed = {q: dict(held) for q, held in state.quota_held_fixed.items()}
    return ledger


def admissible(state: State, queue: str, demand: Mapping[str, int]) -> Reason | None:
    """Whether ``demand`` (milli-GPU per quota key) fits ``queue`` in ``state`` right now.
    Builds a Ledger (O(jobs)); callers checking many demands build one and reuse it."""
    return Ledger.from_state(state).admissible(queue, demand)


def admission(
    queue: QueueSpec, job: JobState, replicas: int | None = None, key: str | None = None
) -> Admission:
    """The faithful admission of ``job`` at ``replicas`` (default: all) on ``key`` (default: its
    first candidate key): what ``Ledger.check`` expects to see proposed."""
    res = job.spec.resources
    key = candidate_keys(queue, res)[0] if key is None else key
    n = job.spec.replicas if replicas is None else replicas
    return Admission(job.id, job.attempt, n, admission_gpus(key, worker_milli(res, key) * n))
