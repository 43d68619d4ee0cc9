"""Indexes of the jobs, kept by the fold: the jobs in each phase, the queued jobs of each queue in
the order the queue serves them, the jobs holding GPUs on each node, and the workers every
unfinished job asks for.

Why. Every decision cycle, and the fold's handlers of node events, want a few kinds of jobs: the
queued ones, those holding quota, those on one node. A walk of ``State.jobs`` for them costs every
job that ever existed, finished ones included, at every cycle and every GPU health event. The fold
keeps these indexes instead, where what they index changes, so that a reader pays for the jobs it
asks for:

- ``State.jobs_by_phase``: phase -> ids of its jobs, in the order they entered it. Kept where a
  job is made (``fold_requests``, through ``add``) and where its phase changes
  (``fold_moves.move`` and ``move_twice``, the only places, through ``moved``).
- ``State.queued_by_queue``: queue -> its queued jobs' places, ``(-priority, submitted_seq, id)``,
  sorted: the order a FIFO queue serves them in (priority, then submission, then id), kept as
  jobs enter and leave the phase and as a queued job's priority changes (``reprioritised``), so
  that admission and the preemptor read a queue's front without sorting its backlog each cycle.
  (A shortest-first queue's order depends on the time: its reader orders it from this one.)
- ``State.workers_by_ask``: per worker ask (a ``Resources``, as its JSON: a State's dict keys
  are strings), the workers the unfinished jobs asking for it count, ``max(1, replicas)`` each:
  the workload the placer measures fragmentation against, kept where a job is made, finishes,
  is let go or resized (``respec``), so that no cycle reads every job for it.
- ``State.holding_by_node``: node -> ids of the jobs holding GPUs, CPU or memory there
  (``JobState.held``), in the order they took them. ``held`` changes only through ``hold``
  (``projections/claims.py`` and ``fold_nodes`` call it), which keeps this.
- ``State.holding_quota_by_queue``: queue -> ids of its jobs in a phase that holds quota
  (``HOLDS_QUOTA``), in the order they entered one: what admission and the preemptor read of a
  queue's holders (when each gives its quota back, whether it could be stopped) is read for the
  queues a cycle asks about, not by a walk of every job running in the cluster
  (``holds.QuotaHolders``). Kept where a job's phase changes (``moved``).
- ``State.naming_by_beneficiary``: beneficiary -> ids of the jobs that name it
  (``JobState.preempted_for``) in a phase of ``NAMING`` (stopping, stopped, or requeued and
  not placed again), so that the placer and the preemptor find the nominated beneficiaries
  without a walk of the backlog, where a requeued victim may sit anywhere.
  ``preempted_for`` changes only through ``name``, and the phase through ``moved``.
- ``State.explained_by_queue``: queue -> ids of its queued jobs that carry a reason: the few
  that admission may have to unsay (the front of each queue, jobs requeued or sent back), out
  of a deep backlog that carries none. Kept where a job's phase changes (``moved``) and, where
  its reasons change, by ``explain``.
- ``State.queued_by_shape``: per host shape (``host_shape``: what decides whether any node could
  ever host a job), ids of the queued jobs of that shape, in the order they entered it: admission
  judges each shape once against the inventory and walks only the jobs of shapes no node can
  host, not the whole backlog. Kept where a job's phase changes (``moved``) and where a queued
  job's spec does (``respec``).
- ``State.elastic_by_phase``: phase -> ids of its elastic jobs (``JobSpec.min_replicas`` given,
  which no resize changes), in the order they entered it, as ``jobs_by_phase``: the running
  ones are what growth and shrinking read (admission's growths and their time-outs, the
  placer's ranks to add, the preemptor's shrinks under way), not every job running. Kept with
  ``jobs_by_phase``.
- ``State.queued_by_form``: per form (``form_key``: a queue and what the preemptor's verdict
  on a queued job reads besides its priority and the ledger), the places of the queued jobs of that form,
  sorted as ``queued_by_queue``: the preemptor judges a backlog form by form, and passes over
  the rest of a form it found no victims for without reading its jobs. Kept with
  ``queued_by_queue`` and, where a queued job's spec changes, by ``respec``.
- ``State.places_held``: ids of the jobs a place is held for, one a planned shutdown left them
  (``JobState.kept_place``) or one a move names (``JobState.moved_to``), in the order they were
  given one: the few the placer takes out of its snapshot before anything else, the
  preemptor's simulation too, and whose places a registration that renumbers GPUs moves, out
  of every job interrupted, queued or admitted. Both fields change only through ``keep_place``
  and ``move_to``; a job that ends keeps neither (``fold_moves._ended``).

They are ids, not the ``JobState`` objects again, so that a snapshot encodes each job once. They
are part of the State: snapshots carry them and every replica builds them in the same order, so
any walk of them is deterministic. An index entry left empty is removed: a State has one form.
``forget`` takes a job out of the State and every index (the simulator's compaction of finished
jobs); ``rebuild`` makes the indexes of a State built by hand (benchmarks, tests); ``check``
recomputes them from ``State.jobs`` and says where they differ (tests).

Order. ``jobs_by_phase`` and ``holding_by_node`` keep the order of events, not submission order;
readers that need another order sort by their own key with ties by id. ``holding_on`` gives a
node's jobs in
submission order, the order a walk of ``State.jobs`` found them (the fold inserts jobs in
submission order), so that what the fold does to them in turn is what it did before.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable
from functools import lru_cache

import msgspec

from corral.events.decisions import Placement
from corral.events.jobs import MAX_REPLICAS, JobSpec, Resources, Topology
from corral.projections import lifecycle
from corral.projections.lifecycle import FINAL, PHASES, Phase
from corral.projections.state import JobState, State


def ordered(phases: Collection[Phase]) -> tuple[Phase, ...]:
    """``phases`` in the order the lifecycle declares them: a set of phases (``HOLDS_QUOTA``)
    iterates in an order that changes from one process to the next, a walk of the index by this
    tuple does not."""
    return tuple(p for p in PHASES if p in phases)


UNFINISHED: tuple[Phase, ...] = tuple(p for p in PHASES if p not in FINAL)
# The phases in which a job stopped for a beneficiary names it (``JobState.preempted_for``):
# stopping, stopped, or requeued and not placed again yet.
NAMING: tuple[Phase, ...] = ("checkpointing", "preempted", "queued", "admitted")
_NAMING = frozenset(NAMING)
HOLDS_QUOTA: tuple[Phase, ...] = ordered(lifecycle.HOLDS_QUOTA)
_HOLDS_QUOTA = lifecycle.HOLDS_QUOTA

Index = dict[str, dict[str, None]]
# A queued job's place in its queue: sorted ascending, highest priority first, then submission.
Place = tuple[int, int, str]


def place_of(job: JobState) -> Place:
    return (-job.priority, job.submitted_seq, job.id)


def _add(index: Index, key: str, job_id: str) -> None:
    ids = index.get(key)
    if ids is None:
        index[key] = {job_id: None}
    else:
        ids[job_id] = None


def _remove(index: Index, key: str, job_id: str) -> None:
    # Tolerant: a scratch State (the placer's gate, the preemptor's trial) takes and gives back
    # claims of jobs it does not index.
    ids = index.get(key)
    if ids is not None:
        ids.pop(job_id, None)
        if not ids:
            del index[key]


def _enqueue(state: State, job: JobState, form: str) -> None:
    place = place_of(job)  # one tuple for both indexes
    _insert(state.queued_by_queue, job.spec.queue, place)
    _insert(state.queued_by_form, form, place)


def _dequeue(state: State, job: JobState, place: Place, form: str) -> None:
    _delete(state.queued_by_queue, job.spec.queue, place)
    _delete(state.queued_by_form, form, place)


def _insert(index: dict[str, list[Place]], key: str, place: Place) -> None:
    places = index.get(key)
    if places is None:
        index[key] = [place]
    else:
        insort(places, place)


def _delete(index: dict[str, list[Place]], key: str, place: Place) -> None:
    places = index.get(key)
    if places is None:
        return
    i = bisect_left(places, place)
    if i < len(places) and places[i] == place:
        del places[i]
    else:  # tolerant, as ``_remove``: a scratch State may hold a job its index never had
        places[:] = [p for p in places if p[2] != place[2]]
    if not places:
        del index[key]


# The keys below are JSON written from the values alone. msgspec's ``omit_defaults`` leaves a
# field out only when it *is* its default object, so a decoded ``gpu_milli`` of 1000 (a fresh int)
# is written out while a constructed one is not: equal asks would get two keys, the same ask
# counted twice over in the placer's workload and a forecast's state differ from the live one. So
# a field is left out when it *equals* its default.
def _plain(value: msgspec.Struct) -> dict[str, object]:
    defaults = value.__struct_defaults__
    fields = value.__struct_fields__
    skip = len(fields) - len(defaults)  # the fields without a default come first
    out: dict[str, object] = {}
    for i, name in enumerate(fields):
        field = getattr(value, name)
        if i < skip or field != defaults[i - skip]:
            out[name] = field
    return out


# Encoding is most of what keeping those two indexes costs: every job is keyed as it is made,
# queued, leaves the queue and finishes, yet a few kinds of ask and shape recur. So each key is
# written once per distinct value (frozen structs: hashed by value) and looked up after. The
# values come from tenants: at most ``_MAX_KEYS`` of each are kept, none longer than
# ``_MAX_KEPT`` characters, and a full cache starts again, so that values that stopped coming do
# not keep out the ones that come now.
_MAX_KEYS = 4096
_MAX_KEPT = 1024
_ask_keys: dict[Resources, str] = {}
_shape_keys: dict[tuple[Resources, Topology, int, bool], str] = {}


def ask_key(res: Resources) -> str:
    """A worker ask as ``workers_by_ask`` keys it: equal asks give equal keys (defaults omitted)."""
    key = _ask_keys.get(res)
    if key is None:
        key = msgspec.json.encode(_plain(res)).decode()
        if len(key) <= _MAX_KEPT:
            if len(_ask_keys) >= _MAX_KEYS:
                _ask_keys.clear()
            _ask_keys[res] = key
    return key


@lru_cache(maxsize=4096)
def ask_of(key: str) -> Resources:
    """The ask a ``workers_by_ask`` key stands for (a few kinds of ask recur: decoded once)."""
    return msgspec.json.decode(key, type=Resources)


def _shape(spec: JobSpec, selector: list[tuple[str, str]], n: int) -> str:
    shape = (_plain(spec.resources), selector, _plain(spec.topology), n, n < spec.replicas)
    return msgspec.json.encode(shape).decode()


def host_shape(spec: JobSpec) -> str:
    """What decides whether some node could ever host a job of ``spec``, as ``queued_by_shape``
    keys it: its worker ask, node selector and topology, and its smallest gang (``min_replicas``
    for an elastic job, and whether it is elastic, which the reason says). Equal shapes give
    equal keys."""
    n = spec.min_replicas if spec.min_replicas is not None else spec.replicas
    if spec.node_selector:  # a dict, not hashable: written each time (few jobs select nodes)
        return _shape(spec, sorted(spec.node_selector.items()), n)
    known = (spec.resources, spec.topology, n, n < spec.replicas)
    key = _shape_keys.get(known)
    if key is None:
        key = _shape(spec, [], n)
        if len(key) <= _MAX_KEPT:
            if len(_shape_keys) >= _MAX_KEYS:
                _shape_keys.clear()
            _shape_keys[known] = key
    return key


def form_key(spec: JobSpec) -> str:
    """The form of a queued job, as ``queued_by_form`` keys it: its queue, worker ask, replicas,
    minimum replicas, topology and node selector, which decide (with its priority and the
    quota ledger) whether preemption could get it admitted and placed, and whether it may be
    preempted at all (its ``preemptible`` and priority class): one that may not be may not
    borrow either, so its verdict says nothing of the jobs behind it that may. Equal forms give
    equal keys; the runtime estimate is not part of it."""
    return queued_keys(spec)[0]


_queued_keys: dict[tuple[str, Resources, int, int | None, Topology, bool, str], tuple[str, str]] = {}


def queued_keys(spec: JobSpec) -> tuple[str, str]:
    """A queued job's form (``form_key``) and host shape (``host_shape``): it is keyed by both
    as it enters and leaves the queue, and what its form is made from decides its shape too, so
    one look-up finds both."""
    if spec.node_selector:  # a dict, not hashable: written each time (few jobs select nodes)
        return _form(spec, sorted(spec.node_selector.items())), host_shape(spec)
    known = (
        spec.queue,
        spec.resources,
        spec.replicas,
        spec.min_replicas,
        spec.topology,
        spec.preemptible,
        spec.priority_class,
    )
    keys = _queued_keys.get(known)
    if keys is None:
        keys = (_form(spec, []), host_shape(spec))
        if len(keys[0]) <= _MAX_KEPT and len(keys[1]) <= _MAX_KEPT:
            if len(_queued_keys) >= _MAX_KEYS:
                _queued_keys.clear()
            _queued_keys[known] = keys
    return keys


def _form(spec: JobSpec, selector: list[tuple[str, str]]) -> str:
    form = (
        spec.queue,
        _plain(spec.resources),
        spec.replicas,
        spec.min_replicas,
        _plain(spec.topology),
        selector,
        spec.preemptible,
        spec.priority_class,
    )
    return msgspec.json.encode(form).decode()


def _count_ask(state: State, spec: JobSpec, sign: int) -> None:
    asks = state.workers_by_ask
    key = ask_key(spec.resources)
    # A job is counted from its submission, before admission has checked its size: a tenant's
    # jobs of 2**63 workers would carry the sum past what the state's encodings hold. (Compared,
    # not ``min(max(1, replicas), MAX_REPLICAS)``: this runs as every job is made and finishes.)
    workers = spec.replicas
    if workers < 1:
        workers = 1
    elif workers > MAX_REPLICAS:
        workers = MAX_REPLICAS
    n = asks.get(key, 0) + sign * workers
    if n:
        asks[key] = n
    else:
        del asks[key]


def _nodes(placement: Placement) -> Iterable[str]:
    workers = placement.workers
    if len(workers) == 1:
        return (workers[0].node,)
    return dict.fromkeys(w.node for w in workers)


# -- kept by the fold -------------------------------------------------------------------------------


SPEC_BYTES = 512  # a spec's fixed fields, as a service holds them
_STRING_BYTES = 64  # what a string costs held (its object, its slot), besides its characters


def spec_bytes(spec: JobSpec) -> int:
    """About what holding ``spec`` costs a service, in bytes: a fixed part, and every string it
    carries (queue, name, priority class, image, command, env, mounts, labels, node selector,
    GPU models, MIG profile) by its length. What a tenant's jobs in the state hold is judged by
    it (``RetentionSpec``), before admission has looked at any of them."""
    # Empty collections are passed over and the command's characters counted in one call: this
    # runs as every job is submitted and let go, and most of a spec's collections are empty.
    res = spec.resources
    command = spec.command
    n = SPEC_BYTES + len(spec.queue) + len(spec.name) + len(spec.priority_class) + len(spec.image or "")
    n += len(res.mig or "") + len("".join(command)) + len(command) * _STRING_BYTES
    for pairs in (spec.env, spec.labels, spec.node_selector):
        if pairs:
            for k, v in pairs.items():
                n += len(k) + len(v) + 2 * _STRING_BYTES
    for m in spec.mounts:
        n += len(m.source) + len(m.target) + 2 * _STRING_BYTES
    for model in res.gpu_models or ():
        n += len(model) + _STRING_BYTES
    return n


def add(state: State, job: JobState, size: int | None = None) -> None:
    """Put a new job into the State and its indexes; ``size``: its ``spec_bytes``, when known."""
    state.jobs[job.id] = job
    _add(state.jobs_by_tenant, job.tenant, job.id)
    held = state.spec_bytes_by_tenant
    held[job.tenant] = held.get(job.tenant, 0) + (spec_bytes(job.spec) if size is None else size)
    _add(state.jobs_by_phase, job.phase, job.id)
    if job.spec.min_replicas is not None:
        _add(state.elastic_by_phase, job.phase, job.id)
    if job.phase in _HOLDS_QUOTA:
        _add(state.holding_quota_by_queue, job.spec.queue, job.id)
    if job.phase == "queued":
        form, shape = queued_keys(job.spec)
        _enqueue(state, job, form)
        _add(state.queued_by_shape, shape, job.id)
    if job.phase not in FINAL:
        _count_ask(state, job.spec, 1)
    if job.held is not None:
        for node in _nodes(job.held):
            _add(state.holding_by_node, node, job.id)
    if job.preempted_for and job.phase in _NAMING:
        _add(state.naming_by_beneficiary, job.preempted_for, job.id)
    if job.phase == "queued" and job.reasons:
        _add(state.explained_by_queue, job.spec.queue, job.id)
    if job.kept_place is not None or job.moved_to is not None:
        state.places_held[job.id] = None


def moved(state: State, job: JobState, before: Phase) -> None:
    """``job`` has moved from phase ``before`` to ``job.phase``. (A move to the same phase, a
    gang's next worker starting, keeps its place.)"""
    after = job.phase
    if after == before:
        return
    job_id = job.id
    by_phase = state.jobs_by_phase
    ids = by_phase.get(before)
    if ids is not None:
        ids.pop(job_id, None)
        if not ids:
            del by_phase[before]
    ids = by_phase.get(after)
    if ids is None:
        by_phase[after] = {job_id: None}
    else:
        ids[job_id] = None
    if job.spec.min_replicas is not None:
        _remove(state.elastic_by_phase, before, job_id)
        _add(state.elastic_by_phase, after, job_id)
    if before == "queued":
        form, shape = queued_keys(job.spec)
        _dequeue(state, job, place_of(job), form)
        _remove(state.queued_by_shape, shape, job_id)
    if after == "queued":
        form, shape = queued_keys(job.spec)
        _enqueue(state, job, form)
        _add(state.queued_by_shape, shape, job_id)
    if before == "queued" or after == "queued":
        explain(state, job)
    if (before in _HOLDS_QUOTA) != (after in _HOLDS_QUOTA):
        if after in _HOLDS_QUOTA:
            _add(state.holding_quota_by_queue, job.spec.queue, job_id)
        else:
            _remove(state.holding_quota_by_queue, job.spec.queue, job_id)
    if (before in FINAL) != (after in FINAL):
        _count_ask(state, job.spec, -1 if after in FINAL else 1)
    b = job.preempted_for
    if b and (before in _NAMING) != (after in _NAMING):
        if after in _NAMING:
            _add(state.naming_by_beneficiary, b, job_id)
        else:
            _remove(state.naming_by_beneficiary, b, job_id)


def name(state: State, job: JobState, beneficiary: str) -> None:
    """Set the beneficiary ``job`` was stopped for (``JobState.preempted_for``): the one way it
    changes ("" when none). The beneficiary's ``victims`` are the jobs naming it."""
    old = job.preempted_for
    if old == beneficiary:
        return
    job.preempted_for = beneficiary
    if old:
        _unlist(state, old, job.id)
    if beneficiary:
        b = state.jobs.get(beneficiary)
        if b is not None and job.id not in b.victims:
            b.victims = (*b.victims, job.id)
    if job.phase in _NAMING:
        if old:
            _remove(state.naming_by_beneficiary, old, job.id)
        if beneficiary:
            _add(state.naming_by_beneficiary, beneficiary, job.id)


def _unlist(state: State, beneficiary: str, job_id: str) -> None:
    b = state.jobs.get(beneficiary)
    if b is not None and job_id in b.victims:
        b.victims = tuple(v for v in b.victims if v != job_id)


def explain(state: State, job: JobState) -> None:
    """``job``'s reasons or phase may have changed: a queued job with a reason is in
    ``explained_by_queue``, no other job is."""
    if job.phase == "queued" and job.reasons:
        _add(state.explained_by_queue, job.spec.queue, job.id)
    else:
        _remove(state.explained_by_queue, job.spec.queue, job.id)


def keep_place(state: State, job: JobState, place: Placement | None) -> None:
    """Set the place a planned shutdown left ``job`` (``JobState.kept_place``; None: it keeps
    none): the one way it changes."""
    job.kept_place = place
    _place_held(state, job)


def move_to(state: State, job: JobState, place: Placement | None) -> None:
    """Set where a move is to put ``job`` (``JobState.moved_to``; None: nowhere): the one way
    it changes."""
    job.moved_to = place
    _place_held(state, job)


def _place_held(state: State, job: JobState) -> None:
    if job.kept_place is not None or job.moved_to is not None:
        state.places_held[job.id] = None
    else:
        state.places_held.pop(job.id, None)


def reprioritised(state: State, job: JobState, before: int) -> None:
    """``job``'s priority has changed from ``before`` to ``job.priority``: a queued job takes its
    new place in its queue."""
    if job.phase != "queued" or job.priority == before:
        return
    form = form_key(job.spec)
    _dequeue(state, job, (-before, job.submitted_seq, job.id), form)
    _enqueue(state, job, form)


def respec(state: State, job: JobState, spec: JobSpec) -> None:
    """Give ``job`` a new spec (a resize: the same queue and ask, another most workers)."""
    unfinished = job.phase not in FINAL
    if unfinished:
        _count_ask(state, job.spec, -1)
    if job.phase == "queued":
        _remove(state.queued_by_shape, host_shape(job.spec), job.id)
        _add(state.queued_by_shape, host_shape(spec), job.id)
        _delete(state.queued_by_form, form_key(job.spec), place_of(job))
        _insert(state.queued_by_form, form_key(spec), place_of(job))
    held = state.spec_bytes_by_tenant
    held[job.tenant] = held.get(job.tenant, 0) + spec_bytes(spec) - spec_bytes(job.spec)
    job.spec = spec
    if unfinished:
        _count_ask(state, spec, 1)


def hold(state: State, job: JobState, held: Placement | None) -> None:
    """Set what ``job`` holds (``JobState.held``): the one way it changes."""
    old = job.held
    job.held = held
    if old is None and held is None:
        return
    index = state.holding_by_node
    job_id = job.id
    if old is None:
        assert held is not None
        for node in _nodes(held):
            _add(index, node, job_id)
        return
    before = _nodes(old)
    after = () if held is None else _nodes(held)
    for node in before:
        if node not in after:
            _remove(index, node, job_id)
    for node in after:
        if node not in before:
            _add(index, node, job_id)


def forget(state: State, job: JobState) -> None:
    """Take ``job`` out of the State and every index."""
    known = state.jobs.pop(job.id, None) is not None
    if known:
        _remove(state.jobs_by_tenant, job.tenant, job.id)
        left = job.tenant in state.jobs_by_tenant
        held = state.spec_bytes_by_tenant
        rest = held[job.tenant] - spec_bytes(job.spec)
        if left:
            held[job.tenant] = rest
        else:
            del held[job.tenant]
    _remove(state.jobs_by_phase, job.phase, job.id)
    _remove(state.elastic_by_phase, job.phase, job.id)
    _remove(state.holding_quota_by_queue, job.spec.queue, job.id)
    if job.phase == "queued":
        form, shape = queued_keys(job.spec)
        _dequeue(state, job, place_of(job), form)
        _remove(state.queued_by_shape, shape, job.id)
    if known and job.phase not in FINAL:
        _count_ask(state, job.spec, -1)
    if job.held is not None:
        for node in _nodes(job.held):
            _remove(state.holding_by_node, node, job.id)
    if job.preempted_for:
        _remove(state.naming_by_beneficiary, job.preempted_for, job.id)
        _unlist(state, job.preempted_for, job.id)
    _remove(state.explained_by_queue, job.spec.queue, job.id)
    state.places_held.pop(job.id, None)


# -- read ---------------------------------------------------------------------------------------------


def jobs_in(state: State, *phases: Phase) -> list[JobState]:
    """The jobs in ``phases``, phase by phase as given, each in the order it entered it."""
    jobs = state.jobs
    by_phase = state.jobs_by_phase
    if len(phases) == 1:
        return [jobs[i] for i in by_phase.get(phases[0], ())]
    return [jobs[i] for p in phases for i in by_phase.get(p, ())]


def elastic_in(state: State, phase: Phase) -> list[JobState]:
    """The elastic jobs in ``phase``, in the order they entered it (``jobs_in``'s, theirs only)."""
    jobs = state.jobs
    return [jobs[i] for i in state.elastic_by_phase.get(phase, ())]


def count(state: State, *phases: Phase) -> int:
    by_phase = state.jobs_by_phase
    return sum(len(by_phase.get(p, ())) for p in phases)


def unfinished(state: State) -> list[JobState]:
    """Every job not finished: as many as are queued, admitted or running, whatever finished."""
    return jobs_in(state, *UNFINISHED)


def queued_in(state: State, queue: str) -> list[JobState]:
    """The queued jobs of ``queue`` in its FIFO order: priority, then submission, then id."""
    jobs = state.jobs
    return [jobs[i] for _, _, i in state.queued_by_queue.get(queue, ())]


def holding_on(state: State, node: str) -> list[JobState]:
    """The jobs holding GPUs, CPU or memory on ``node``, in submission order."""
    jobs = state.jobs
    found = [jobs[i] for i in state.holding_by_node.get(node, ())]
    if len(found) > 1:
        found.sort(key=lambda j: (j.submitted_seq, j.id))
    return found


def nominated(state: State) -> set[str]:
    """The beneficiaries some job stopped for them names, in a phase of ``NAMING``."""
    return set(state.naming_by_beneficiary)


def explained(state: State, queue: str) -> list[JobState]:
    """The queued jobs of ``queue`` that carry a reason, in no particular order."""
    jobs = state.jobs
    return [jobs[i] for i in state.explained_by_queue.get(queue, ())]


def holding_quota(state: State, queue: str) -> list[JobState]:
    """The jobs of ``queue`` in a phase that holds quota, in the order they entered one."""
    jobs = state.jobs
    return [jobs[i] for i in state.holding_quota_by_queue.get(queue, ())]


def places_held(state: State) -> list[JobState]:
    """The jobs a place is held for (kept across a planned shutdown, or named by a move), in
    the order they were given one."""
    jobs = state.jobs
    return [jobs[i] for i in state.places_held]


def holding(state: State) -> list[JobState]:
    """Every job holding GPUs, CPU or memory anywhere, once, node by node."""
    jobs = state.jobs
    ids: dict[str, None] = {}
    for on_node in state.holding_by_node.values():
        ids.update(on_node)
    return [jobs[i] for i in ids]


# -- made again, and checked ------------------------------------------------------------------------


def rebuild(state: State) -> State:
    """Make every index from ``State.jobs``, in its order: for a State built by hand."""
    state.jobs_by_phase = {}
    state.queued_by_queue = {}
    state.holding_by_node = {}
    state.holding_quota_by_queue = {}
    state.workers_by_ask = {}
    state.naming_by_beneficiary = {}
    state.explained_by_queue = {}
    state.queued_by_shape = {}
    state.queued_by_form = {}
    state.elastic_by_phase = {}
    state.jobs_by_tenant = {}
    state.spec_bytes_by_tenant = {}
    state.places_held = {}
    jobs = list(state.jobs.values())
    state.jobs.clear()
    for job in jobs:
        add(state, job)
    return state


def check(state: State) -> None:
    """Raise AssertionError, saying where, unless every index holds exactly what ``State.jobs``
    says it should: each queue's and form's places in full sorted order, the asks' worker counts exactly;
    by phase, node, beneficiary named, queue explained and host shape, and the places held, the same
    ids (their order is the fold's history, which this cannot know)."""
    want = rebuild(State(jobs=dict(state.jobs)))
    problems = []
    queued = [j for j in state.jobs.values() if j.phase == "queued"]
    for name, key_of in (
        ("queued_by_queue", lambda j: j.spec.queue),
        ("queued_by_form", lambda j: form_key(j.spec)),
    ):
        have_sorted: dict[str, list[Place]] = getattr(state, name)
        want_sorted: dict[str, list[Place]] = {}
        for j in queued:
            want_sorted.setdefault(key_of(j), []).append(place_of(j))
        for key in sorted(have_sorted.keys() | want_sorted.keys()):
            have_places = have_sorted.get(key)
            want_places = sorted(want_sorted.get(key, ()))
            if have_places is not None and not have_places:
                problems.append(f"{name}[{key}] is empty and kept")
            if (have_places or []) != want_places:
                problems.append(f"{name}[{key}]: {(have_places or [])[:5]}, not {want_places[:5]}")
    if set(state.places_held) != set(want.places_held):
        extra, missing = (
            sorted(state.places_held.keys() - want.places_held),
            sorted(want.places_held.keys() - state.places_held),
        )
        problems.append(f"places_held: has {extra[:5]} ({len(extra)}), lacks {missing[:5]} ({len(missing)})")
    if state.workers_by_ask != want.workers_by_ask:
        problems.append(f"workers_by_ask: {state.workers_by_ask}, not {want.workers_by_ask}")
    if state.jobs_by_tenant != want.jobs_by_tenant:
        problems.append(f"jobs_by_tenant: {state.jobs_by_tenant}, not {want.jobs_by_tenant}")
    for tenant, ids in state.jobs_by_tenant.items():
        seqs = [state.jobs[i].submitted_seq for i in ids if i in state.jobs]
        if seqs != sorted(seqs):
            problems.append(f"jobs_by_tenant[{tenant}] is not in submission order")
    if state.spec_bytes_by_tenant != want.spec_bytes_by_tenant:
        problems.append(
            f"spec_bytes_by_tenant: {state.spec_bytes_by_tenant}, not {want.spec_bytes_by_tenant}"
        )
    for name in (
        "jobs_by_phase",
        "holding_by_node",
        "holding_quota_by_queue",
        "naming_by_beneficiary",
        "explained_by_queue",
        "queued_by_shape",
        "elastic_by_phase",
    ):
        have_index: Index = getattr(state, name)
        want_index: Index = getattr(want, name)
        for key in sorted(have_index.keys() | want_index.keys()):
            have, should = set(have_index.get(key, ())), set(want_index.get(key, ()))
            if key in have_index and not have:
                problems.append(f"{name}[{key}] is empty and kept")
            if have != should:
                extra, missing = sorted(have - should), sorted(should - have)
                problems.append(
                    f"{name}[{key}]: has {extra[:5]} ({len(extra)}), lacks {missing[:5]} ({len(missing)})"
                )
    if problems:
        raise AssertionError("indexes differ from the jobs: " + "; ".join(problems))
