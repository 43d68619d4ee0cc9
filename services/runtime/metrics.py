"""Metrics through the OpenTelemetry metrics SDK: declared here, read by Prometheus and OTLP.

``METRICS`` is the one table of every metric corral exports: its name, unit and meaning, in
OpenTelemetry's conventions (``corral.<thing>.<measure>``, units in UCUM, counts of things as
``{thing}``, durations in ``s``). Three kinds of source feed them:

- the cluster's state, read when a collection asks (observable gauges): queues, quota, GPUs,
  fragmentation. The figures come from a function the read service passes in
  (``watch_cluster``), computed once per folded log position from the fold's indexes;
- what the fold accepted (counters and histograms): time to admit and to place, preemptions and
  the GPU time they lost, restarts. ``FoldWatch`` looks at the jobs a record names before and
  after the fold applies it, so a proposal the fold voided counts for nothing. One role counts
  them (the read service), so a corral counts each fact once; a process that folds the log again
  from its start counts the log's facts again, in log time, to the same totals;
- each service's own running (``watch_service``): cycle durations and decisions per cycle, its
  lag behind the log, which replica holds each lease.

The cluster's figures and the fold's facts are the log's, not a replica's: every read service
replica exports the same series (``CLUSTER``), so they are aggregated over replicas with ``max``
(the dashboard does; a ``sum`` would count each fact once per replica), while a service's own
figures are per replica and add up.

One ``Telemetry`` per process (``install``), with a Prometheus reader served on an HTTP port and,
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, OTLP over HTTP. Both collect on the event loop that
folds, between two folds, so no callback reads a state half-folded; the OTLP request itself is
sent from a thread, never holding the loop. Nothing here is imported by a decision core or the
fold (STYLE.md rule 12): services hand their state to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter
from opentelemetry.sdk.resources import Resource

from corral.events import codec
from corral.events.decisions import JobsPlaced, PreemptionRequested, ShrinkRequested
from corral.events.jobs import JobsAdmitted
from corral.events.log import Record
from corral.events.nodes import WorkerExited
from corral.projections.state import WHOLE, JobState, State

log = logging.getLogger("corral.metrics")

# Where ``/metrics`` listens unless told otherwise: this machine only. The figures name every
# queue and node and what each holds, which is no business of whoever else reaches the host;
# a deployment whose Prometheus scrapes over the network says so (``--metrics-host``).
LOOPBACK = "127.0.0.1"


class Unavailable(Exception):
    """``/metrics`` cannot listen where it was asked to (an address not of this host, a port
    taken): said in one line, before the service starts."""


Kind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class Metric:
    kind: Kind
    unit: str
    description: str


# Every metric corral exports. The dashboard's queries are checked against these names
# (tests/unit/test_dashboard.py), so a metric renamed here is renamed there too.
METRICS: dict[str, Metric] = {
    # -- queues and quota (cluster state, from the read service) --
    "corral.queue.jobs.pending": Metric("gauge", "{job}", "Jobs waiting in the queue"),
    "corral.queue.jobs.admitted": Metric("gauge", "{job}", "Jobs of the queue holding quota"),
    "corral.queue.quota.nominal": Metric("gauge", "{gpu}", "GPUs the queue is guaranteed"),
    "corral.queue.quota.used": Metric("gauge", "{gpu}", "GPUs of quota the queue's jobs hold"),
    "corral.queue.quota.borrowed": Metric("gauge", "{gpu}", "GPUs the queue holds beyond its nominal"),
    "corral.queue.quota.lent": Metric("gauge", "{gpu}", "Of the queue's nominal, GPUs others borrow"),
    # -- GPUs (cluster state) --
    "corral.node.gpus.allocated": Metric("gauge", "{gpu}", "GPUs held by jobs (fractions counted)"),
    "corral.node.gpus.free": Metric(
        "gauge", "{gpu}", "Free share of healthy GPUs on nodes taking work (corral nodes FREE)"
    ),
    "corral.node.gpus.unhealthy": Metric("gauge", "{gpu}", "GPUs marked unhealthy"),
    "corral.cluster.gpus.fragmented": Metric(
        "gauge", "{gpu}", "Free GPU capacity the pending and running workload could not use (FGD)"
    ),
    # -- what the fold accepted (from the read service) --
    "corral.job.admission.duration": Metric("histogram", "s", "Time from entering the queue to admission"),
    "corral.job.placement.duration": Metric("histogram", "s", "Time from entering the queue to placement"),
    "corral.job.preemptions": Metric(
        "counter", "{preemption}", "Jobs preempted, shrunk or moved to make room (consolidation), by reason"
    ),
    "corral.job.preemption.lost_gpu_time": Metric(
        "counter", "h", "GPU-hours of work since the last checkpoint, lost to preemption"
    ),
    "corral.job.restarts": Metric("counter", "{restart}", "Restarts of jobs whose worker failed"),
    # -- each service --
    "corral.service.cycle.duration": Metric("histogram", "s", "Time a decision cycle took, appends included"),
    "corral.service.cycle.decisions": Metric("histogram", "{event}", "Events a decision cycle proposed"),
    "corral.service.lag": Metric("gauge", "{record}", "Records in the log the service has not folded yet"),
    "corral.lease.held": Metric("gauge", "{lease}", "1 for the replica holding the role's lease, else 0"),
}

# Seconds: waits in a queue run from a blink to hours; cycles from a millisecond to seconds.
WAIT_BUCKETS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
    14400,
    43200,
)
CYCLE_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
DECISION_BUCKETS: tuple[float, ...] = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)

# Attribute keys.
QUEUE, GPU_MODEL, POOL, ROLE, REPLICA = (
    "corral.queue",
    "corral.gpu.model",
    "corral.node.pool",
    "corral.role",
    "corral.replica",
)
REASON, KIND = "corral.preemption.reason", "corral.preemption.kind"

Figures = dict[str, list[tuple[float, dict[str, str]]]]  # metric name -> (value, attributes)


# What every read service replica exports alike, from the same log: aggregate over replicas with
# ``max``, never ``sum``.
CLUSTER = frozenset(
    name
    for name in METRICS
    if name.startswith(("corral.queue.", "corral.node.", "corral.cluster.", "corral.job."))
)


class Watched(Protocol):
    """What ``watch_service`` reads of a service (``shell.Service``)."""

    role: str
    producer: str
    lease: Any
    log: Any

    @property
    def state(self) -> State: ...


class Telemetry:
    """The process's meters and readers. ``prometheus``: serve the Prometheus text format on
    this port (0: a free one; None: no endpoint). ``otlp``: export over OTLP/HTTP every
    ``otlp_every`` seconds (by default when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set)."""

    def __init__(
        self,
        service: str = "corral",
        *,
        otlp: bool | None = None,
        otlp_every: float | None = None,
        exporter: MetricExporter | None = None,
    ) -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        readers: list[Any] = [PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)]
        if otlp is None:
            otlp = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
        self._otlp_reader: InMemoryMetricReader | None = None
        self._exporter = exporter
        if otlp:
            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

                # A collector that does not answer costs an export, never the service.
                self._exporter = OTLPMetricExporter(timeout=5)
            self._otlp_reader = InMemoryMetricReader()
            readers.append(self._otlp_reader)
        interval = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL")  # milliseconds, as the SDK reads it
        self.otlp_every = (
            otlp_every if otlp_every is not None else (float(interval) / 1000 if interval else 30.0)
        )
        self.provider = MeterProvider(
            resource=Resource.create({"service.name": service}), metric_readers=readers
        )
        meter = self.provider.get_meter("corral")
        self._services: list[Watched] = []
        self._cluster: tuple[Callable[[], State], Callable[[State], Figures]] | None = None
        self._figures: tuple[int, Figures] = (-1, {})
        self._instruments: dict[str, Any] = {}
        for name, m in METRICS.items():
            if m.kind == "gauge":
                callback = (
                    self._observe_service(name)
                    if name.startswith(("corral.service.", "corral.lease."))
                    else self._observe_cluster(name)
                )
                meter.create_observable_gauge(name, [callback], unit=m.unit, description=m.description)
            elif m.kind == "counter":
                self._instruments[name] = meter.create_counter(name, unit=m.unit, description=m.description)
            else:
                buckets = CYCLE_BUCKETS if name.endswith("cycle.duration") else WAIT_BUCKETS
                if name.endswith("decisions"):
                    buckets = DECISION_BUCKETS
                self._instruments[name] = meter.create_histogram(
                    name,
                    unit=m.unit,
                    description=m.description,
                    explicit_bucket_boundaries_advisory=list(buckets),
                )
        self._server: asyncio.AbstractServer | None = None
        self._token: bytes | None = None  # what a scraper's Authorization must say, if anything
        self._exporting: asyncio.Task[None] | None = None
        self.port = 0

    # -- sources --------------------------------------------------------------------------------

    def watch_service(self, service: Watched) -> None:
        self._services.append(service)

    def forget_service(self, service: Watched) -> None:
        with contextlib.suppress(ValueError):
            self._services.remove(service)

    def watch_cluster(self, state: Callable[[], State], figures: Callable[[State], Figures]) -> None:
        """Report the cluster's figures from ``state()`` (the read service's folded state)."""
        self._cluster = (state, figures)

    def cycle(self, role: str, seconds: float, events: int) -> None:
        attrs = {ROLE: role}
        self._instruments["corral.service.cycle.duration"].record(seconds, attrs)
        self._instruments["corral.service.cycle.decisions"].record(events, attrs)

    def add(self, name: str, value: float, attributes: Mapping[str, str]) -> None:
        self._instruments[name].add(value, dict(attributes))

    def record(self, name: str, value: float, attributes: Mapping[str, str]) -> None:
        self._instruments[name].record(value, dict(attributes))

    def _observe_cluster(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            if self._cluster is None:
                return
            state_of, figures_of = self._cluster
            state = state_of()
            seq, figures = self._figures
            if seq != state.seq:  # the figures of one log position are computed once
                figures = figures_of(state)
                self._figures = (state.seq, figures)
            for value, attrs in figures.get(name, ()):
                yield Observation(value, attrs)

        return observe

    def _observe_service(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            for svc in self._services:
                if name == "corral.service.lag":
                    tail = getattr(svc.log, "tail", None)
                    known = tail() if callable(tail) else None
                    if known is not None:
                        yield Observation(max(0, known - svc.state.seq), {ROLE: svc.role})
                elif svc.lease is not None:
                    yield Observation(1 if svc.lease.held else 0, {ROLE: svc.role, REPLICA: svc.producer})

        return observe

    # -- export ---------------------------------------------------------------------------------

    def prometheus_text(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    async def start(self, port: int | None = None, host: str = LOOPBACK, token: str | None = None) -> None:
        """Serve ``/metrics`` on ``port`` of ``host`` (if given), to scrapers that send ``token``
        as a bearer token when one is given, and start the OTLP export (if configured)."""
        self._token = None if token is None else b"bearer " + token.encode()
        if port is not None:
            try:
                self._server = await asyncio.start_server(self._answer, host, port)
            except OSError as e:
                raise Unavailable(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("metrics at http://%s:%d/metrics", host, self.port)
        if self._otlp_reader is not None:
            self._exporting = asyncio.create_task(self._export_every(), name="metrics-export")

    async def stop(self) -> None:
        """Stop serving; send what was measured one last time (bounded: a dead collector does
        not hold a stopping service)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        if self._exporting is not None:
            self._exporting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._exporting
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.export(), 3)
        self.provider.shutdown(timeout_millis=1000)

    async def export(self) -> None:
        """Collect on this loop (between folds), send from a thread."""
        if self._otlp_reader is None or self._exporter is None:
            return
        data = self._otlp_reader.get_metrics_data()
        if data is not None:
            await asyncio.to_thread(self._exporter.export, data)

    async def _export_every(self) -> None:
        while True:
            await asyncio.sleep(self.otlp_every)
            try:
                await self.export()
            except Exception as e:  # noqa: BLE001 - metrics must never stop a service
                log.warning("metrics export failed: %s", e)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A minimal HTTP/1.0 answer: GET /metrics, anything else 404."""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            extra = b""
            if not (request.startswith(b"GET ") and path.split(b"?")[0] in (b"/metrics", b"/")):
                body, status, kind = b"not found\n", b"404 Not Found", b"text/plain"
            elif not self._bears_token(request):
                body, status, kind = b"a bearer token is required\n", b"401 Unauthorized", b"text/plain"
                extra = b"\r\nWWW-Authenticate: Bearer"
            else:
                body, status = self.prometheus_text(), b"200 OK"
                kind = b"text/plain; version=0.0.4; charset=utf-8"
            writer.write(
                b"HTTP/1.0 "
                + status
                + extra
                + b"\r\nContent-Type: "
                + kind
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    def _bears_token(self, request: bytes) -> bool:
        """Whether ``request`` may read the figures: no token asked, or its ``Authorization``
        header carries it. Loopback is not only the operator: a job's workers share their node's
        network, and the figures name every queue, those closed to the job's tenant included."""
        if self._token is None:
            return True
        for line in request.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                return hmac.compare_digest(scheme.lower() + b" " + credentials.strip(), self._token)
        return False


_current: Telemetry | None = None


def install(telemetry: Telemetry | None) -> None:
    """Make ``telemetry`` the process's (None: none, as before any was installed)."""
    global _current
    _current = telemetry


def current() -> Telemetry | None:
    return _current


# -- what the fold accepted ---------------------------------------------------------------------


class FoldWatch:
    """Counts what the fold accepted of the records it is shown: ``before`` each record is
    applied, ``after`` it. Only the records that can carry these facts are decoded (decisions
    and node reports); a record the fold refused changes no job, so it counts for nothing."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        # Admitted jobs: when their attempt entered the queue, kept through a withdrawal (placed
        # nowhere in time, the job is queued again at the same attempt and waits on), with the
        # job's submission and attempt it is for.
        self._queued_since: dict[str, tuple[int, int, float]] = {}
        # Jobs queued or admitted in the state the watch started from (a snapshot's), with their
        # submission and attempt: when they entered the queue at that attempt (before a withdrawal
        # the state no longer shows) it did not see, so their time to place is left out rather
        # than counted from the wrong start. None until the first record shows that state.
        self._unseen: set[tuple[str, int, int]] | None = None
        # Victims still stopping: (attempt, log time from which their work is not saved, the
        # milli-GPU they held). What a preemption loses is known only once the victim stops: a
        # job that checkpoints when asked saves the work the request found unsaved.
        self._stopping: dict[str, tuple[int, float, int]] = {}
        self._kind = "stop"  # of the record between ``before`` and ``after``: "move" for a consolidation

    def before(self, state: State, record: Record) -> list[tuple[JobState, tuple[Any, ...]]] | None:
        if self._unseen is None:
            self._unseen = {
                (job.id, job.submitted_seq, job.attempt)
                for phase in ("queued", "admitted")
                for job_id in state.jobs_by_phase.get(phase, ())
                if (job := state.jobs.get(job_id)) is not None
            }
        subject = record.subject
        if not subject.startswith(("corral.ev.decision.", "corral.ev.node.")):
            return None
        try:
            body = codec.decode_body(subject, record.data, record.headers).body
        except codec.DecodeError:
            return None
        if isinstance(body, JobsAdmitted | JobsPlaced):
            ids = [a.job_id for a in getattr(body, "admissions", ())] or [
                p.job_id for p in getattr(body, "placements", ())
            ]
        elif isinstance(body, PreemptionRequested):
            ids = [v.job_id for v in body.victims]
            self._kind = "move" if body.moves else "stop"
        elif isinstance(body, ShrinkRequested | WorkerExited):
            ids = [body.job_id]
        else:
            ids = []
        if self._stopping and subject.startswith("corral.ev.node."):
            # A node's report may stop a victim: its last worker's exit, or its node lost.
            ids += [job_id for job_id in self._stopping if job_id not in ids]
        if not ids:
            return None
        seen = []
        for job_id in ids:
            job = state.jobs.get(job_id)
            if job is not None:
                seen.append((job, _facts(job)))
        return seen

    def after(
        self, state: State, record: Record, seen: list[tuple[JobState, tuple[Any, ...]]] | None
    ) -> None:
        if not seen:
            return
        t, unseen = self.telemetry, self._unseen or set()
        for job, (phase, since, restarts, preemptions, held, replicas) in seen:
            queue = {QUEUE: job.spec.queue}
            this = (job.submitted_seq, job.attempt)  # the job's submission and attempt
            if phase == "queued" and job.phase == "admitted":
                t.record("corral.job.admission.duration", max(0.0, record.time - since), queue)
                entered = self._queued_since.get(job.id)
                if (entered is None or entered[:2] != this) and (job.id, *this) not in unseen:
                    self._queued_since[job.id] = (*this, since)
            elif phase == "admitted" and job.phase != "admitted":
                entered = self._queued_since.pop(job.id, None)
                # A job admitted when the watch started (from a snapshot) is not: it entered the
                # queue before, and the state keeps no time of it to count from.
                if job.phase == "placed" and entered is not None and entered[:2] == this:
                    t.record("corral.job.placement.duration", max(0.0, record.time - entered[2]), queue)
            if job.restarts > restarts:
                t.add("corral.job.restarts", job.restarts - restarts, queue)
            stopping = self._stopping.get(job.id)
            if stopping is not None and job.phase != "checkpointing":
                del self._stopping[job.id]
                attempt, unsaved_from, milli = stopping
                if job.phase == "preempted" and job.attempt == attempt:  # stopped, not cancelled
                    lost = _lost_hours(job, unsaved_from, milli, record.time)
                    t.add("corral.job.preemption.lost_gpu_time", lost, queue)
            if job.preemptions > preemptions:
                why = {**queue, REASON: _reason(state, job), KIND: self._kind}
                t.add("corral.job.preemptions", 1, why)
                if phase != "running":  # placed or starting: no work done yet
                    t.add("corral.job.preemption.lost_gpu_time", 0.0, queue)
                elif job.phase == "checkpointing":
                    self._stopping[job.id] = (job.attempt, since, held)
                else:  # stopped at once
                    lost = _lost_hours(job, since, held, record.time)
                    t.add("corral.job.preemption.lost_gpu_time", lost, queue)
            elif (
                isinstance(replicas, int) and job.admission is not None and job.admission.replicas < replicas
            ):
                t.add("corral.job.preemptions", 1, {**queue, REASON: _reason(state, job), KIND: "shrink"})
        waiting = state.jobs_by_phase.get("admitted", {}), state.jobs_by_phase.get("queued", {})
        if len(self._queued_since) > 2 * (len(waiting[0]) + len(waiting[1])) + 100:
            # Jobs cancelled while admitted: keep only those admitted or withdrawn.
            self._queued_since = {
                j: s for j, s in self._queued_since.items() if j in waiting[0] or j in waiting[1]
            }
        if unseen and len(unseen) > 2 * (len(waiting[0]) + len(waiting[1])) + 100:
            self._unseen = {u for u in unseen if u[0] in waiting[0] or u[0] in waiting[1]}
        if len(self._stopping) > 2 * len(state.jobs_by_phase.get("checkpointing", ())) + 100:
            # Victims cancelled while they stopped: keep only those still stopping.
            still = state.jobs_by_phase.get("checkpointing", {})
            self._stopping = {j: s for j, s in self._stopping.items() if j in still}


def _facts(job: JobState) -> tuple[Any, ...]:
    replicas = job.admission.replicas if job.admission is not None else None
    return (job.phase, job.phase_since, job.restarts, job.preemptions, job.held_milli, replicas)


def _reason(state: State, job: JobState) -> str:
    """Whether a job was stopped for one of its own queue (priority) or of another queue of its
    cohort (quota reclaimed, or borrowed by a higher priority)."""
    beneficiary = state.jobs.get(job.preempted_for)
    return (
        "within-queue" if beneficiary is not None and beneficiary.spec.queue == job.spec.queue else "cohort"
    )


def _lost_hours(job: JobState, since: float, held_milli: int, now: float) -> float:
    """GPU-hours of the work a preempted job loses: from the later of its start running (``since``)
    and its last checkpoint of this attempt, to its stop (``now``), on the GPUs it held; a
    checkpoint it saved when asked counts."""
    start = since
    cp = job.checkpoint
    if cp is not None and cp.attempt == job.attempt and cp.time > start:
        start = cp.time
    return max(0.0, now - start) * held_milli / WHOLE / 3600.0


@contextlib.asynccontextmanager
async def serving(
    service: str, port: int | None, host: str | None = None, token_file: str | None = None
) -> AsyncIterator[Telemetry | None]:
    """The process's telemetry while the block runs: ``/metrics`` on ``port`` of ``host`` (None:
    no endpoint), to scrapers bearing the token in ``token_file`` if given; OTLP when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; neither: none at all."""
    if port is None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        yield None
        return
    token = None if token_file is None else read_token(token_file)
    telemetry = Telemetry(service)
    await telemetry.start(port, host or LOOPBACK, token)
    install(telemetry)
    try:
        yield telemetry
    finally:
        install(None)
        await telemetry.stop()


TOKEN_FILE = "metrics-token"


def made_token(directory: Path) -> Path:
    """The token file a corral with logins keeps in its data ``directory`` (made the first
    time, readable by its owner only; the sandbox hides the directory from every job): its
    tenants' workers reach this host's loopback, where /metrics would otherwise tell any of
    them every queue's figures."""
    path = directory / TOKEN_FILE
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


def read_token(path: str) -> str:
    """The bearer token a scraper must send, from its file (as Prometheus's
    ``authorization.credentials_file`` reads it: the whole file, less surrounding whitespace)."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise Unavailable(f"cannot read the metrics token from {path}: {e}") from None
    if not token or any(c.isspace() for c in token):
        raise Unavailable(f"the metrics token in {path} must be one word, not empty")
    return token


# -- names as Prometheus shows them ------------------------------------------------------------

_UNIT_SUFFIX = {"s": "seconds", "h": "hours", "1": "ratio", "By": "bytes"}


def prometheus_names(name: str) -> tuple[str, ...]:
    """The series names a metric has on the Prometheus endpoint: dots become underscores, the
    unit is spelled out (``s``: ``_seconds``; an annotation such as ``{job}``: nothing),
    counters end in ``_total``, histograms are ``_bucket``, ``_sum`` and ``_count``."""
    m = METRICS[name]
    base = name.replace(".", "_")
    suffix = _UNIT_SUFFIX.get(m.unit, "")
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if m.kind == "counter":
        return (base + "_total",)
    if m.kind == "histogram":
        return (base + "_bucket", base + "_sum", base + "_count")
    return (base,)
