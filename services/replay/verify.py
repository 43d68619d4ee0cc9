"""``corral replay --verify``: re-run every logged decision and report where the code now differs.

A decision service's cycle folds the log up to some sequence, asks its pure ``decide(state, now)``
what to do and appends the result. The shell stamps every event of a cycle with the id
``<role>:<based_on>:<index>`` and the producer ``<role>@host:pid``, and decisions carry
``based_on`` and ``now`` in their body. So each cycle can be found again in the log and re-run:
fold the log up to ``based_on``, call the role's ``decide`` with the recorded ``now``, and compare
what it decides now with what the cycle appended, as multisets of events (order within a cycle
and envelope metadata do not count). Every difference is reported in an operator's words: which
decision, what was logged, what the code decides now, job by job.

Invariants:

- The log is folded forward, never again from the start for a decision. Each role has a State
  of its own that its ``decide`` gets in place at each ``based_on``, as in the live shell: no
  copy of megabytes per decision, and a ``decide`` that changed its input would change only its
  own role's later decisions, as it did live. Big logs are cut into contiguous runs of
  decisions shared by forked processes, each folding from the start to its run.
- Only cycles that appended something are checked: a cycle that decided nothing leaves no trace.
- Everything a decision depends on is in the log except the code and the role's settings. Roles
  are re-run with the settings ``roles`` gives them (``corral``'s defaults); a service started
  with other settings diverges by design, and the report says so.
- A cycle whose first event is missing while everything else it appended matches the re-run at
  the same positions lost an append race: in logs written before cycles were appended as one
  fenced atomic batch, that event alone was conditional on the role's decision subject. A cycle
  cut short by the end of the log matches up to there. Both are noted, not counted as
  divergences.
"""

from __future__ import annotations

import bisect
import itertools
import multiprocessing
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from corral.events import codec, routing, subjects
from corral.events.base import Decision, Event
from corral.events.codec import DecodeError
from corral.events.jobs import (
    AdmissionWithdrawn,
    JobAccepted,
    JobPriorityChanged,
    JobRejected,
    JobRequeued,
    PendingReasonChanged,
)
from corral.events.log import Record
from corral.projections.fold import apply, fold
from corral.projections.rules import RULES
from corral.projections.state import State
from corral.services.replay.report import (
    VERBS,
    Divergence,
    Report,
    counts,
    items,
    seconds,
    summaries,
    summary,
)
from corral.services.runtime.shell import Decide

_T = TypeVar("_T")

_DECISION_PREFIX = subjects.decision("")
_JOB_PREFIX = subjects.job("")
_EV_PREFIX = f"{subjects.EV}."

# Events a role writes outside its decision subject: admission states its facts on each job.
_JOB_FACTS: dict[type[Event], str] = {
    JobAccepted: "admission",
    JobPriorityChanged: "admission",
    JobRejected: "admission",
    JobRequeued: "admission",
    AdmissionWithdrawn: "admission",
    PendingReasonChanged: "admission",
}

_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(State)
_body_encoder = msgspec.json.Encoder()
_body_decoder = msgspec.json.Decoder(codec.AnyEvent)
# Sorted dict keys: two equal events compare equal whatever order their dicts were built in.
_key_encoder = msgspec.json.Encoder(order="deterministic")


@dataclass(slots=True)
class _Logged:
    """A logged event of a cycle: ``index`` is its position in the cycle (from its id), ``time``
    its envelope's."""

    seq: int
    index: int | None
    producer: str
    body: Event
    time: float
    rules: int = 0  # the fold's rules its writer decided under (0: not recorded)


@dataclass(slots=True)
class _Cycle:
    role: str
    based_on: int
    events: list[_Logged] = field(default_factory=list)
    at_end: bool = False  # its last event is the log's last record


# -- the walk ------------------------------------------------------------------------------------


def verify(
    records: Sequence[Record],
    roles: dict[str, Decide],
    workers: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> Report:
    """Re-run every decision cycle of ``roles`` found in ``records`` and report divergences.

    ``progress(done, total)`` is told how many of the decision cycles are re-run as they are
    (in one process, after each; shared by several, after each chunk).

    ``workers``: processes that share the re-runs (None: one per CPU, up to ``MAX_WORKERS``,
    for a log with at least ``PARALLEL_FROM`` decisions; else this process alone). The report
    is the same whatever the number, as long as the roles' ``decide`` leave their input as they
    found it (as they must)."""
    if any(a.seq >= b.seq for a, b in zip(records, records[1:], strict=False)):
        records = sorted(records, key=lambda r: r.seq)
    last = records[-1].seq if records else 0
    cycles, divergences = _collect(records, roles)
    notes = [
        f"each role ({', '.join(sorted(roles))}) is re-run with this build's code and default "
        "settings: settings are not in the log, so a service started with other settings diverges "
        "by design"
    ]
    if records and last - records[0].seq + 1 != len(records):
        missing = last - records[0].seq + 1 - len(records)
        notes.append(
            f"the log has gaps ({missing} sequences between {records[0].seq} and {last} are missing): "
            "a decision based past a gap is re-run on a state without those records"
        )
    if records and records[0].seq != 1:
        notes.append(f"the log starts at seq {records[0].seq}: decisions are re-run without what came before")
    other_rules = Counter(e.rules for c in cycles.values() for e in c.events if e.rules != RULES)
    if other_rules:
        under = ", ".join(
            f"{n} under rules {r}" if r else f"{n} with no rules recorded"
            for r, n in sorted(other_rules.items())
        )
        notes.append(
            f"decision events written under other rules than this build's ({RULES}): {under}; "
            "where the rules differ, so may the decisions, by design"
        )

    due: list[_Cycle] = []
    for cycle in cycles.values():
        cycle.at_end = max(e.seq for e in cycle.events) == last
        if cycle.based_on > last:
            divergences.append(
                _unverifiable(cycle, f"based on seq {cycle.based_on}, past the end of the log")
            )
        else:
            due.append(cycle)
    due.sort(key=lambda c: (c.based_on, c.role))

    checked: Counter[str] = Counter()
    for outcome in _run(records, roles, due, workers, progress):
        divergences += outcome.divergences
        notes += outcome.notes
        checked.update(outcome.checked)

    divergences.sort(key=lambda d: (d.seq, d.role))
    if len(divergences) > 1:
        notes.append(
            "every decision is re-run on the log as it is: decisions after a divergence saw its "
            "effects, so later divergences may be its consequences; look at the first one first"
        )
    return Report(
        records=len(records),
        first_seq=records[0].seq if records else 0,
        last_seq=last,
        decisions=dict(sorted(checked.items())),
        events=sum(len(c.events) for c in cycles.values()),
        divergences=divergences,
        notes=notes,
    )


# -- re-running, in this process or several --------------------------------------------------------

PARALLEL_FROM = 1000  # decisions: below this, starting processes costs more than it saves
MAX_WORKERS = 8
_CHUNKS_PER_WORKER = 4  # later decisions cost more (the state grows): small chunks even the load


@dataclass(slots=True)
class _Outcome:
    divergences: list[Divergence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: Counter[str] = field(default_factory=Counter)


def _run(
    records: Sequence[Record],
    roles: dict[str, Decide],
    due: list[_Cycle],
    workers: int | None,
    progress: Callable[[int, int], object] | None = None,
) -> Iterator[_Outcome]:
    """Re-run ``due`` (in ``based_on`` order): in one pass here, or in contiguous chunks shared
    by forked processes, each folding from the start of the log to its chunk."""
    if workers is None:
        workers = _cpus() if len(due) >= PARALLEL_FROM else 1
    workers = max(1, min(workers, MAX_WORKERS, len(due)))
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        tick = None if progress is None else (lambda k: progress(k, len(due)))
        yield _check(records, roles, due, tick)
        return
    n = workers * _CHUNKS_PER_WORKER
    size = -(-len(due) // n)
    chunks = [due[i : i + size] for i in range(0, len(due), size)]
    # Forked workers inherit the log and the roles: nothing big is pickled, only the outcomes.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_adopt, initargs=(records, roles, chunks)
    ) as pool:
        done = 0
        for chunk, outcome in zip(chunks, pool.map(_check_chunk, range(len(chunks))), strict=True):
            done += len(chunk)
            if progress is not None:
                progress(done, len(due))
            yield outcome


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_adopted: tuple[Sequence[Record], dict[str, Decide], list[list[_Cycle]]] | None = None


def _adopt(records: Sequence[Record], roles: dict[str, Decide], chunks: list[list[_Cycle]]) -> None:
    global _adopted
    _adopted = (records, roles, chunks)


def _check_chunk(i: int) -> _Outcome:
    assert _adopted is not None
    records, roles, chunks = _adopted
    return _check(records, roles, chunks[i])


def _check(
    records: Sequence[Record],
    roles: dict[str, Decide],
    due: list[_Cycle],
    checked: Callable[[int], object] | None = None,
) -> _Outcome:
    """Fold forward to each cycle's ``based_on`` and re-run it.

    Each role gets a State of its own from the first cycle on, folded forward and handed to its
    ``decide`` in place, as the live shell does: no copy per decision (a State is megabytes), and
    a ``decide`` that changed its input would change only its own role's later decisions, as it
    would have live."""
    out = _Outcome()
    if not due:
        return out
    cut = bisect.bisect_right(records, due[0].based_on, key=lambda r: r.seq)
    base = fold(itertools.islice(records, cut))
    roles_due = sorted({c.role for c in due})
    states = {role: base if i == 0 else _copy(base) for i, role in enumerate(roles_due)}
    k = 0
    for r in itertools.islice(records, cut, None):
        while k < len(due) and due[k].based_on < r.seq:  # every state is now at due[k].based_on
            _check_one(due[k], states[due[k].role], roles[due[k].role], out)
            k += 1
            if checked is not None:
                checked(k)
        if k == len(due):
            return out
        for state in states.values():
            apply(state, r)
    for cycle in due[k:]:
        _check_one(cycle, states[cycle.role], roles[cycle.role], out)
        k += 1
        if checked is not None:
            checked(k)
    return out


def _check_one(cycle: _Cycle, state: State, decide: Decide, out: _Outcome) -> None:
    out.checked[cycle.role] += 1
    # As the service saw it, even when the record at based_on is missing from this log; the next
    # record folded is past based_on, so the fold skips nothing.
    state.seq = max(state.seq, cycle.based_on)
    found = _rerun(cycle, state, decide, out.notes)
    if found is not None:
        out.divergences.append(found)


def _copy(state: State) -> State:
    return _state_decoder.decode(_state_encoder.encode(state))


def _collect(
    records: Sequence[Record], roles: dict[str, Decide]
) -> tuple[dict[tuple[str, int], _Cycle], list[Divergence]]:
    """Group the records the decision roles wrote (or that claim to be theirs) into cycles."""
    cycles: dict[tuple[str, int], _Cycle] = {}
    bad: list[Divergence] = []
    # An event a role stamped, wherever it sits: its id starts with the role's name.
    stamps = tuple(f'"{role}:'.encode() for role in roles)
    for r in records:
        subject = r.subject
        elsewhere = False
        if subject.startswith(_DECISION_PREFIX):
            subject_role: str | None = subject[len(_DECISION_PREFIX) :]
        elif subject.startswith(_JOB_PREFIX):
            subject_role = None
        elif subject.startswith(_EV_PREFIX) and any(s in r.data for s in stamps):
            subject_role, elsewhere = None, True
        else:
            continue  # requests, and events no decision role wrote
        try:
            env = codec.decode_envelope(r.data)
        except DecodeError as e:
            if subject_role in roles:
                assert subject_role is not None
                bad.append(_bad(r.seq, subject_role, None, f"seq {r.seq} is not a readable event: {e}"))
            continue
        body = env.body
        role, based_on, index = _parse_id(env.id, roles)
        if role is None:
            if elsewhere:
                continue
            role = subject_role if subject_role in roles else _JOB_FACTS.get(type(body))
            if role is None or role not in roles:
                continue
            based_on = body.based_on if isinstance(body, Decision) else None
        logged = _Logged(r.seq, index, env.producer, body, env.time, env.rules)
        if based_on is None:
            d = _bad(r.seq, role, None, f"its id {env.id!r} does not name the cycle that decided it")
            _fill_logged(d, [logged])
            bad.append(d)
        elif based_on >= r.seq:
            d = _bad(
                r.seq, role, based_on, f"based on seq {based_on}, which is not before its own seq {r.seq}"
            )
            _fill_logged(d, [logged])
            bad.append(d)
        else:
            cycles.setdefault((role, based_on), _Cycle(role, based_on)).events.append(logged)
    return cycles, bad


def _parse_id(event_id: str, roles: dict[str, Decide]) -> tuple[str | None, int | None, int | None]:
    """``<role>:<based_on>:<index>`` as the shell writes it; Nones for any other id."""
    parts = event_id.split(":")
    if len(parts) != 3 or parts[0] not in roles or not parts[1].isdigit() or not parts[2].isdigit():
        return None, None, None
    return parts[0], int(parts[1]), int(parts[2])


# -- one cycle -----------------------------------------------------------------------------------


def _rerun(cycle: _Cycle, state: State, decide: Decide, notes: list[str]) -> Divergence | None:
    events = sorted(cycle.events, key=lambda e: (e.index if e.index is not None else -1, e.seq))
    now, stamp_lines = _recorded_now(cycle, events)
    foreign = sorted({e.producer for e in events if not e.producer.startswith(f"{cycle.role}@")})
    try:
        decided = [_normal(b) for b in decide(state, now)]
    except Exception as e:  # noqa: BLE001 - one failing decision must not hide the others
        d = _divergence(
            cycle, events, now, "error", [f"the {cycle.role} now fails on it: {type(e).__name__}: {e}"]
        )
        return d
    logged_keys = [_key(e.body) for e in events]
    decided_keys = [_key(b) for b in decided]
    changes = list(stamp_lines)
    involved: set[int] = set()
    if Counter(logged_keys) != Counter(decided_keys):
        partial = None if stamp_lines else _partial(cycle, events, logged_keys, decided, decided_keys)
        if partial is not None:
            notes.append(partial)
        else:
            lines, involved = _diff(events, decided, now)
            changes += lines
    if foreign:
        changes.insert(0, f"written by {', '.join(foreign)}, not by the {cycle.role} service")
    if not changes:
        return None
    kind = "differs" if len(changes) > bool(foreign) else "foreign"
    d = _divergence(cycle, events, now, kind, changes)
    d.decided = summaries([(None, b) for b in decided])
    if involved:
        d.seq = min(involved)  # the decision that differs, rather than the first of its cycle
    return d


def _recorded_now(cycle: _Cycle, events: list[_Logged]) -> tuple[float, list[str]]:
    """The ``now`` the cycle decided with: its decisions' (the shell stamps the same in every
    envelope of the cycle), else the envelope time of its first event."""
    lines = []
    stamped = [(e, e.body) for e in events if isinstance(e.body, Decision)]
    nows = sorted({b.now for _, b in stamped})
    now = stamped[0][1].now if stamped else events[0].time
    if len(nows) > 1:
        lines.append(f"the cycle's decisions record different times: {', '.join(seconds(n) for n in nows)}")
    for e, b in stamped:
        if b.based_on != cycle.based_on:
            lines.append(
                f"seq {e.seq} says it is based on seq {b.based_on}, but its id says the cycle at "
                f"{cycle.based_on} wrote it"
            )
    return now, lines


def _partial(
    cycle: _Cycle,
    events: list[_Logged],
    logged_keys: list[bytes],
    decided: list[Event],
    decided_keys: list[bytes],
) -> str | None:
    """Why a cycle whose logged events all sit at their positions in the re-run lacks the others,
    when the log explains it; None when it does not (a divergence). Two cases: position 0 alone is
    missing, the one append made conditional on the decision subject (a lost race); or the
    cycle's last positions are missing and the log ends with it (cut while being appended, or by
    ``--until``)."""
    indices = [e.index for e in events]
    if None in indices or len(set(indices)) != len(indices):
        return None
    if not all(
        e.index is not None and e.index < len(decided) and decided_keys[e.index] == k
        for e, k in zip(events, logged_keys, strict=True)
    ):
        return None
    where = f"{cycle.role} cycle based on seq {cycle.based_on} (seq {events[0].seq})"
    missing = sorted(set(range(len(decided))) - set(i for i in indices if i is not None))
    if missing == [0] and routing.subject_of(decided[0]) == subjects.decision(cycle.role):
        return (
            f"{where}: its first event ({summary(decided[0])}) was not stored, the append losing "
            f"a race on {subjects.decision(cycle.role)}; the rest matches"
        )
    top = max(i for i in indices if i is not None)
    if cycle.at_end and missing == list(range(top + 1, len(decided))):
        return (
            f"{where}: the log ends before the rest of the cycle "
            f"({len(missing)} more event(s)); what was stored matches"
        )
    return None


def _normal(body: Event) -> Event:
    """``body`` as it reads back from the wire, so that a re-run compares like a logged event."""
    result: Event = _body_decoder.decode(_body_encoder.encode(body))
    return result


def _key(body: Event) -> bytes:
    return _key_encoder.encode(body)


# -- the difference, job by job ------------------------------------------------------------------


def _diff(logged: list[_Logged], decided: list[Event], now: float) -> tuple[list[str], set[int]]:
    """Lines saying, job by job, what the log and the code disagree on; and the seqs of the
    logged events concerned (for what the code decides and the log lacks: the logged events of
    the type that would have carried it)."""
    was: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    now_: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    seqs_of_type: dict[str, list[int]] = defaultdict(list)
    for e in logged:
        seqs_of_type[type(e.body).__name__].append(e.seq)
        for what, job, detail in items(e.body, now):
            was[(what, job)].append((detail, e.seq))
    for body in decided:
        for what, job, detail in items(body, now):
            now_[(what, job)].append((detail, type(body).__name__))
    lines: list[str] = []
    involved: set[int] = set()
    for key in dict.fromkeys([*was, *now_]):
        common = Counter(d for d, _ in was[key]) & Counter(d for d, _ in now_[key])
        old = _without(was[key], common)
        new = _without(now_[key], common)
        if not old and not new:
            continue
        involved.update(s for _, s in old)
        for _, type_name in new:
            involved.update(seqs_of_type.get(type_name, ()))
        what, job = key
        past, present = VERBS.get(what, (what, f"writes {what}"))
        who = f"job {job}" if job else what
        log_text = "; ".join(f"{d} (seq {s})" for d, s in old)
        now_text = "; ".join(d for d, _ in new)
        if old and new:
            lines.append(f"{who}: {past} differently: log {log_text}; now {now_text}")
        elif old:
            lines.append(f"{who}: {past} in the log: {log_text}; the code now does not")
        else:
            lines.append(f"{who}: the code now {present} ({now_text}); the log does not")
    if not lines:
        counts_log = Counter(type(e.body).__name__ for e in logged)
        counts_now = Counter(type(b).__name__ for b in decided)
        lines.append(
            "the same decisions, written as different events: log "
            f"{counts(counts_log)}; now {counts(counts_now)}"
        )
    return lines, involved


def _without(items: list[tuple[str, _T]], common: Counter[str]) -> list[tuple[str, _T]]:
    left = Counter(common)
    out = []
    for detail, where in items:
        if left[detail] > 0:
            left[detail] -= 1
        else:
            out.append((detail, where))
    return out


# -- building divergences ------------------------------------------------------------------------


def _bad(seq: int, role: str, based_on: int | None, why: str) -> Divergence:
    return Divergence(
        seq=seq,
        role=role,
        based_on=based_on,
        now=None,
        kind="unverifiable",
        seqs=[seq],
        producers=[],
        logged=[],
        decided=[],
        changes=[why],
    )


def _fill_logged(d: Divergence, events: list[_Logged]) -> None:
    d.seqs = sorted(e.seq for e in events)
    d.producers = sorted({e.producer for e in events})
    d.rules = sorted({e.rules for e in events if e.rules != RULES})
    d.logged = summaries([(e.seq, e.body) for e in sorted(events, key=lambda e: e.seq)])


def _unverifiable(cycle: _Cycle, why: str) -> Divergence:
    d = _bad(min(e.seq for e in cycle.events), cycle.role, cycle.based_on, why)
    _fill_logged(d, cycle.events)
    return d


def _divergence(
    cycle: _Cycle, events: list[_Logged], now: float, kind: str, changes: list[str]
) -> Divergence:
    d = Divergence(
        seq=min(e.seq for e in events),
        role=cycle.role,
        based_on=cycle.based_on,
        now=now,
        kind=kind,
        seqs=[],
        producers=[],
        logged=[],
        decided=[],
        changes=changes,
    )
    _fill_logged(d, events)
    return d


# -- for people and for programs -----------------------------------------------------------------
