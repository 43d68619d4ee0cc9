"""Runtime estimates learned from the jobs that finished, for jobs whose owner gave none.

Most people do not say how long their job runs, and those who do are often wrong; yet the
placer's backfill, the head-of-queue reservation and hold, the shortest-first order and every
start-time estimate need a runtime. Like Helios's QSSF (Hu et al., SC'21), which found that a
user's jobs of the same name and size run alike, the fold keeps, per class of similar jobs, the
running times of the jobs that succeeded, and a new job's estimate is the median of the most
specific class with at least ``MIN_SAMPLES`` of them:

1. the same tenant, name (or command, when it has no name) and GPUs;
2. the same tenant and GPUs;
3. the same tenant;
4. the same queue.

Of which runs: the ``LATEST`` that were *submitted* last (``State.latest_runs``), not those that
ended last. A team's jobs come in batches (a sweep, the runs of one model) that run alike, and
the runs of a class that end first are its short ones: while a batch of long jobs runs, the
latest runs that ended are of the short jobs submitted before them, or after them and done
already, and say the class is short; the latest submitted that ended are the batch's own first
ones, or the batch before it. Replayed under corral on the Philly slice (``bench/eta.py``,
1,000 jobs on 16 x 8 GPUs and 2,000 on 32 x 8; the history at each submission the jobs that
ended before it), the median of the latest 5 submitted came within the band (±20 %, or 5
minutes under 25 minutes) of the actual runtime for 50 % and 43 % of jobs, against 20 % and
25 % for the median of the latest 20 that ended; the latest 20 submitted 35 %, the latest 3
41 % on the 2,000. The median, not the mean: run times are heavy-tailed. Tiresias and Lucid
learn from the same history; Tiresias without it (least attained service), Lucid with a model
over more features than a log holds.

``HISTORY``: the running times of the latest 20 that ended per class (``State.runtimes``) are
kept too: how long a class's runs go on once they ran as long as a running job has
(``services/sim/eta.py``) asks for the class's spread, not its latest batch.

A job's estimate (``of``) is its owner's ``runtime_estimate_s`` when given, else the one learned
when it was submitted (``JobState.learned_s``, learned whether or not the owner gave one; None
while no class has enough history). Fixed
at submission, so that every reader of a job agrees on it whatever was folded since. What a
job ran for is the log time it spent running over all its attempts (``JobState.ran_s``).

An owner's own estimate is checked against their record (``overrun``): per tenant, how far the
``RECORD`` latest of their jobs that succeeded having carried an estimate ran past it (and of
those that failed or were cancelled after running past it, ``ended_unwell``). The
short-job lane (``queueing.short``) scales an owner's estimate by the worst of those overruns, so
a tenant whose word held keeps it (owners' estimates of short runs are often better than a
class's history, which mixes a team's long and short runs), and one who called a long job short
has every estimate stretched as far as that lie for the next ``RECORD`` of their jobs. While a
tenant has fewer than ``MIN_SAMPLES`` such runs, the lane reads the longer of their estimate and
the learned one. Fixed at submission (``JobState.overrun``), as ``learned_s`` is.

Bounded: at most ``MAX_CLASSES`` classes are kept, the one updated longest ago let go first,
so that unique names cost nothing for ever; and a tenant's are at most
``MAX_CLASSES_PER_TENANT``, its own oldest let go first, so that one tenant's stream of unique
names takes from the others at most that many of the classes updated longest ago, once (a
single LRU let it push out every other tenant's history). A name or command is in a class's key
as it is up to ``MAX_NAME`` characters, else as its digest: a key costs the same whatever a
tenant runs. Tenants' records are at most ``MAX_CLASSES``. Pure: the fold calls ``learn``,
``ended_unwell``, ``learned`` and ``overrun``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from operator import itemgetter

from corral.events.jobs import JobSpec, Resources
from corral.projections import quota
from corral.projections.state import WHOLE, JobState, State

HISTORY = 20
RECORD = 20  # a tenant's latest estimated runs that their estimates are checked against
LATEST = 5  # the runs submitted last that a new job's estimate is the median of
MIN_SAMPLES = 3
MAX_CLASSES = 10_000
MAX_CLASSES_PER_TENANT = 1_000
MAX_NAME = 128  # a longer name or command is keyed by its digest


# Each job's classes are asked for twice (at its submission and at its success), and most jobs
# share theirs with many others: formatted once per distinct (tenant, name, command, ask,
# workers, queue). Names and commands come from tenants: at most ``_MAX_KNOWN`` are kept, none
# that holds more than ``_MAX_KEPT`` characters in all, and a full cache starts again,
# so that classes that stopped coming (a command's arguments change run to run) do not keep out
# the ones that come now.
_MAX_KNOWN = 4096
_MAX_KEPT = 1024
_known: dict[tuple[str, str, tuple[str, ...], Resources, int, str], tuple[str, ...]] = {}


def classes(tenant: str, spec: JobSpec) -> tuple[str, ...]:
    """The classes a job belongs to, most specific first (as history keys)."""
    known = (tenant, spec.name, spec.command, spec.resources, spec.replicas, spec.queue)
    found = _known.get(known)
    if found is None:
        found = _classes(tenant, spec)
        kept = sum(map(len, found)) + sum(map(len, spec.command)) + sum(map(len, spec.resources.gpu_models))
        if kept <= _MAX_KEPT:  # what the entry holds: its key and its classes
            if len(_known) >= _MAX_KNOWN:
                _known.clear()
            _known[known] = found
    return found


def _classes(tenant: str, spec: JobSpec) -> tuple[str, ...]:
    gpus = f"{quota.worker_milli(spec.resources) * spec.replicas / WHOLE:g}"
    what = spec.name or " ".join(spec.command)
    if len(what) > MAX_NAME:
        what = "#" + hashlib.blake2b(what.encode(errors="surrogatepass"), digest_size=16).hexdigest()
    if what:
        return (f"t={tenant} n={what} g={gpus}", f"t={tenant} g={gpus}", f"t={tenant}", f"q={spec.queue}")
    return (f"t={tenant} g={gpus}", f"t={tenant}", f"q={spec.queue}")


def learned(state: State, tenant: str, spec: JobSpec) -> float | None:
    """The median of the latest submitted runs of the most specific class with enough of them;
    None when none has. Learned also when the owner gave an estimate: theirs stands (``of``),
    but the short-job lane checks it against this (``queueing.short``)."""
    latest = state.latest_runs
    for key in classes(tenant, spec):
        runs = latest.get(key)
        if runs is not None and len(runs) >= MIN_SAMPLES:
            return _median(sorted(map(_ran, runs)))
    return None


_ran = itemgetter(1)  # of a (submitted at, running time) pair in ``State.latest_runs``


def _median(ordered: list[float]) -> float:
    """``statistics.median`` of sorted values, to the bit: a class has at most ``LATEST`` runs,
    and its checks and generator cost more than the sort."""
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2)


def overrun(state: State, tenant: str) -> float | None:
    """How far past their own estimates the tenant's latest estimated jobs that succeeded ran:
    the worst ratio of running time to estimate among them; None while fewer than
    ``MIN_SAMPLES`` are on record."""
    record = state.estimate_record.get(tenant)
    if record is None or len(record) < MIN_SAMPLES:
        return None
    return max(record)


def ended_unwell(state: State, job: JobState) -> None:
    """A job that failed or was cancelled goes on its owner's record only when it had run past
    their estimate by then: a tenant who calls a long job short, then cancels it (or lets it
    fail) once it has overrun, is found out as one who lets it succeed is; an early failure
    says nothing of their word, and would push their overruns off the record."""
    est = job.spec.runtime_estimate_s
    if est is not None and 0 < est < job.ran_s:
        _owners_word(state, job)


def _owners_word(state: State, job: JobState) -> None:
    """Put a job's running time against its owner's estimate on the owner's record."""
    est = job.spec.runtime_estimate_s
    if est is None or not (0 < est < math.inf):  # admission refuses others; the fold divides by it
        return
    record = state.estimate_record.pop(job.tenant, None)  # re-inserted last, as classes are
    if record is None:
        record = []
    record.append(job.ran_s / est)
    if len(record) > RECORD:
        del record[0]
    state.estimate_record[job.tenant] = record
    while len(state.estimate_record) > MAX_CLASSES:
        del state.estimate_record[next(iter(state.estimate_record))]


def of(job: JobState) -> float | None:
    """A job's runtime estimate: its owner's, else the one learned at its submission."""
    est = job.spec.runtime_estimate_s
    return job.learned_s if est is None else est


def learn(state: State, job: JobState) -> None:
    """Count a job that succeeded, having run ``job.ran_s``, in each of its classes: among the
    latest that ended, and among the ``LATEST`` submitted last when it is one of them; and, when
    its owner estimated it, on the owner's record."""
    history, latest = state.runtimes, state.latest_runs
    ran_s = job.ran_s
    run = (job.submitted_at, ran_s)
    keys = classes(job.tenant, job.spec)
    for key in keys:
        ran = history.pop(key, None)  # re-inserted last: the dict's order is the order of updates
        if ran is None:
            ran = []
        ran.append(ran_s)
        if len(ran) > HISTORY:
            del ran[0]
        history[key] = ran
        runs = latest.pop(key, None)
        if runs is None:
            runs = []
        bisect.insort(runs, run)  # a job submitted before all of them, when full, is dropped next
        if len(runs) > LATEST:
            del runs[0]
        latest[key] = runs
    mine = state.runtime_classes.pop(job.tenant, None)  # re-inserted last, as classes are
    if mine is None:
        mine = {}
    for key in keys[:-1]:  # the last is its queue's
        mine.pop(key, None)
        mine[key] = None
    state.runtime_classes[job.tenant] = mine
    while len(mine) > MAX_CLASSES_PER_TENANT:
        _forget(state, next(iter(mine)))
    while len(history) > MAX_CLASSES:
        _forget(state, next(iter(history)))
    _owners_word(state, job)


def _forget(state: State, key: str) -> None:
    """Let go of class ``key`` (and of its tenant's list once it has none)."""
    state.runtimes.pop(key, None)
    state.latest_runs.pop(key, None)
    if key.startswith("t="):  # a tenant's, not a queue's (``_classes``; tenants are tokens)
        tenant = key[2:].split(" ", 1)[0]
        mine = state.runtime_classes.get(tenant)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del state.runtime_classes[tenant]
