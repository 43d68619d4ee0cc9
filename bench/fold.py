"""Fold throughput: ``python -m bench.fold [--events N] [--by-type] [--profile]``.

Folds ``bench.workload.synthetic_log`` (a busy cluster's log, 1,000,000 records by default) from
an empty state and prints the median events/s of 3 runs for:

  apply        ``apply(state, record)`` on stored records: decode + fold, what a replay pays
  fold         ``fold(records)``: the same, with the cycle collector paused for the batch, as
               every service folds (``projections.fold.collector_paused``); with its ratio to apply
  apply_event  ``apply_event`` on events decoded beforehand: the fold alone, the simulator's path
  decode       ``codec.decode_record`` alone (the decoding ``apply`` does), to split the first

Each figure is given by the wall clock and per CPU-second of this process: on a shared machine
the second says what the code costs, the first what it got. Goal: apply ≥ 200,000 events/s.
``--by-type`` adds what ``apply`` costs per event of each type and each type's share of the
whole (timed one record at a time, so each figure carries the clock's own cost, some 0.1 µs);
``--profile`` adds a cProfile of one ``apply`` pass, hottest functions first.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections.abc import Callable

from bench.workload import records as to_records
from bench.workload import synthetic_log
from corral.events import codec
from corral.events.base import Event
from corral.events.log import Record
from corral.projections.fold import apply, apply_event, fold
from corral.projections.state import State

EVENTS = 1_000_000
RUNS = 3
GOAL = 200_000

Decoded = tuple[int, str, Event, float, str | None]  # seq, subject, body, time, tenant


def decoded(records: list[Record]) -> list[Decoded]:
    out = []
    for r in records:
        body, tenant, _ = codec.decode_body(r.subject, r.data, r.headers)
        out.append((r.seq, r.subject, body, r.time, tenant))
    return out


def fold_records(records: list[Record]) -> State:
    state = State()
    for r in records:
        apply(state, r)
    return state


def fold_decoded(events: list[Decoded]) -> State:
    state = State()
    for seq, subject, body, t, tenant in events:
        apply_event(state, seq, subject, body, t, tenant)
    return state


def decode_only(records: list[Record]) -> None:
    decode = codec.decode_record
    for r in records:
        decode(r.subject, r.data, r.headers)


def by_type(records: list[Record], kinds: list[str]) -> None:
    """What ``apply`` costs per event of each type (CPU time of this process), and its share."""
    clock = time.process_time_ns
    spent: dict[str, int] = {}
    state = State()
    for r, kind in zip(records, kinds, strict=True):
        t0 = clock()
        apply(state, r)
        spent[kind] = spent.get(kind, 0) + clock() - t0
    total = sum(spent.values())
    count: dict[str, int] = {}
    for kind in kinds:
        count[kind] = count.get(kind, 0) + 1
    print(f"{'by type':20s} {'events':>9s} {'µs/event':>9s} {'share':>7s}")
    for kind in sorted(spent, key=lambda k: -spent[k]):
        each = spent[kind] / count[kind] / 1e3
        print(f"  {kind:18s} {count[kind]:>9,d} {each:>9.2f} {spent[kind] / total:>7.1%}")


def measure(name: str, n: int, fn: Callable[[], object], runs: int) -> float:
    """Median events/s by the wall clock, and by this process's CPU time: on a shared machine the
    second says what the code costs, the first what it got."""
    wall, cpu = [], []
    for _ in range(runs):
        gc.collect()  # each run starts from the same heap, not from the last one's leftovers
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    w, c = statistics.median(wall), statistics.median(cpu)
    print(f"{name:12s} {n / w:>10,.0f} events/s ({n / c:>10,.0f} per CPU-s)  median {w:5.2f} s ({runs} runs)")
    return n / w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=EVENTS)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--by-type", action="store_true", help="apply's cost per event of each type")
    ap.add_argument("--profile", action="store_true", help="cProfile one apply pass and print the hot spots")
    args = ap.parse_args()

    t0 = time.perf_counter()
    records = to_records(synthetic_log(args.events, args.seed))
    events = decoded(records)
    kinds: dict[str, int] = {}
    for _, _, body, _, _ in events:
        kinds[type(body).__name__] = kinds.get(type(body).__name__, 0) + 1
    mix = ", ".join(f"{k} {v / len(events):.1%}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    size = sum(len(r.data) for r in records) / 1e6
    print(
        f"synthetic log: {len(records):,} records, {size:,.0f} MB, built in {time.perf_counter() - t0:.1f} s"
    )
    print(f"mix: {mix}")

    state = fold_records(records)
    phases: dict[str, int] = {}
    for j in state.jobs.values():
        phases[j.phase] = phases.get(j.phase, 0) + 1
    print(f"folded: {len(state.nodes)} nodes, {len(state.jobs):,} jobs {phases}")
    print(f"        rejected {state.rejected_total}, faults {state.faults}")
    if state.rejected_total or state.faults:
        print("warning: the synthetic log is not clean:", state.rejections[:3])
    other = fold_decoded(events)  # carries no trace context, so compare all but that
    if other.nodes != state.nodes or {j.id: j.phase for j in other.jobs.values()} != {
        j.id: j.phase for j in state.jobs.values()
    }:
        print("warning: apply_event and apply disagree on this log")
    # Two folded states would otherwise stay alive through every run below, and the collector
    # would walk their millions of objects again and again: a cost a service does not pay.
    del state, other

    n = len(records)
    rate = measure("apply", n, lambda: fold_records(records), args.runs)
    batch = measure("fold", n, lambda: fold(records), args.runs)
    print(f"{'':12s} fold/apply {batch / rate:.2f} (the collector paused for the batch)")
    measure("apply_event", n, lambda: fold_decoded(events), args.runs)
    measure("decode", n, lambda: decode_only(records), args.runs)
    print(f"goal: apply ≥ {GOAL:,} events/s: {'met' if rate >= GOAL else 'NOT met'}")

    if args.by_type:
        by_type(records, [type(body).__name__ for _, _, body, _, _ in events])

    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(fold_records, records)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
