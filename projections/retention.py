"""Bounded state: a finished job leaves the state a retention period after it finished, in log time.

A job in a final phase (``lifecycle.FINAL``) that gave its GPUs back (``held is None``) is read
by no decision: its quota went back when it left the quota-holding phases, and the GPU time it
held is in its queue's ``State.gpu_time``, which fair share reads and which the fold keeps apart
from the jobs. The state keeps it ``State.retention.finished_s`` seconds of log time more (so a
person sees how it ended, and a client retrying its submission is told it is a duplicate), then
lets it go. Its history stays in the log and in the read service's view (``services/query``).
The period is an admin setting in the log (``ApplyRetention``), not a service's config: which
jobs the state holds decides whether an id is free again, so every replica and every replay must
let jobs go alike.

Invariants:

- ``State.finished`` names each finished job once, from the record that made it both final and
  free of GPUs, in that order; the log time it holds (``State.time``) never decreases, so under
  one retention period the jobs become due in that order too, and a change of the period keeps
  the order;
- the fold lets jobs go before it folds a record, by that record's log time: a job finished at
  ``t`` is let go by the first record at or after ``t + finished_s`` (with 0, by the next record),
  so whoever folds a record still sees the jobs it made final, and ``due`` tells a reader which
  jobs the next record will let go before it is folded;
- letting go costs O(jobs let go): only the head of ``State.finished`` is looked at;
- nothing the state keeps names a job let go in a way that a later job of the same id could be
  taken for it: its victims' ``preempted_for`` was cleared when it ended (``JobState.victims``,
  ``fold_moves``), so letting it go changes no decision, and
  ``stopped_for`` entries carry the beneficiary's ``priority_seq``, unique to one job.
"""

from __future__ import annotations

from corral.events.queues import RetentionSpec
from corral.projections import indexes
from corral.projections.lifecycle import FINAL
from corral.projections.state import JobState, State

# Forget the entries let go once this many have piled up at the head (and they are at least
# half of the list), so the list stays as long as the jobs it waits on.
_TRIM = 1024


def note(state: State, job: JobState) -> None:
    """Count ``job`` as finished from now if it is final and holds no GPUs: the fold calls it
    after every move and every release of a job's GPUs."""
    if job.phase in FINAL and job.held is None:
        state.finished.append((state.time, job.id, job.submitted_seq))


def is_due(state: State, now: float) -> bool:
    """Whether a record folded at log time ``now`` lets any job go."""
    fin, i = state.finished, state.finished_from
    return i < len(fin) and fin[i][0] + state.retention.finished_s <= now


def due(state: State, seq: int, time: float) -> list[JobState]:
    """The jobs ``apply`` lets go before it folds the record at ``seq`` stamped ``time``, oldest
    first: a reader that keeps them elsewhere takes them here, while the state still has them."""
    if seq <= state.seq:
        return []  # a record already folded: the fold skips it whole
    now = time if time > state.time else state.time
    fin, jobs, keep = state.finished, state.jobs, state.retention.finished_s
    out = []
    for i in range(state.finished_from, len(fin)):
        at, job_id, submitted = fin[i]
        if at + keep > now:
            break
        job = jobs.get(job_id)
        if job is not None and job.submitted_seq == submitted:
            out.append(job)
    return out


def let_go(state: State) -> None:
    """Let go every finished job whose retention period has passed at ``state.time``."""
    fin, jobs = state.finished, state.jobs
    now, keep = state.time, state.retention.finished_s
    i, n = state.finished_from, len(fin)
    while i < n and fin[i][0] + keep <= now:  # as ``due`` and ``is_due`` compare, to the bit
        _, job_id, submitted = fin[i]
        i += 1
        job = jobs.get(job_id)
        if job is None or job.submitted_seq != submitted:
            continue
        indexes.forget(state, job)  # the jobs stopped for it stopped naming it when it ended
        state.let_go += 1
    if i >= _TRIM and 2 * i >= n:
        del fin[:i]
        i = 0
    state.finished_from = i


def apply_settings(state: State, spec: RetentionSpec) -> None:
    """A new retention period from now on: it applies to every finished job still held, those
    that finished before the change included."""
    state.retention = spec
