"""The ``corral`` command: start a cluster, submit and inspect work, export and replay the log.

Every failure a person can cause (a wrong flag, an unreachable server, a bad job file) is one line
on stderr and exit status 2, never a traceback.

How it reaches a corral, and as whom: ``services/cli/access.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_args

import msgspec

import corral
from corral.events import codec, subjects
from corral.events.jobs import JobSpec, Mount, Resources, Topology
from corral.events.log import Append, LogError, Record
from corral.events.nats_client import RECONNECT_FOR, reconnecting
from corral.events.queues import (
    ApplyCohort,
    ApplyFairShare,
    ApplyPriorityClass,
    ApplyQueue,
    ApplyRetention,
    CohortSpec,
    FairShareSpec,
    PriorityClassSpec,
    QueueSpec,
    RetentionSpec,
)
from corral.projections.fold import fold
from corral.projections.lifecycle import Phase
from corral.projections.state import State
from corral.services.cli import logfile, progress, table, when
from corral.services.cli.access import (
    STATE_DIR,
    Failure,
    as_client,
    ask,
    login_of,
    needs_log,
    open_log,
    remote_state,
    server_url,
    session,
    tenant_of,
)
from corral.services.cli.jobfile import BadInput, command_here, convert, load_document
from corral.services.client import Client, CorralError, Refused, TimedOut
from corral.services.query import client as wire
from corral.services.query import present
from corral.services.runtime import identities


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"corral: {message} (see corral --help)\n")


def emit(args: argparse.Namespace, data: Any, headers: Sequence[str] | None = None) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    elif headers is not None:
        print(table.render(headers, [[row.get(h, "") for h in headers] for row in data]))
    else:
        print(data)


# -- verbs --------------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> None:
    from corral.services.agent.inventory import MIXED
    from corral.services.cli.up import PartStopped, Refused, Settings, run_cluster

    tenants = tuple(t for t in (args.tenants or "").split(",") if t)
    if tenants and not args.auth:
        raise BadInput("--tenants names the tenants that get a login: give --auth with it")
    try:
        for t in tenants:
            identities.check_tenant(t)
    except identities.CredentialsError as e:
        raise BadInput(str(e)) from None
    if args.profile != "mixed" and args.profile not in MIXED:
        raise BadInput(f"--profile {args.profile}: known profiles are mixed, {', '.join(MIXED)}")
    if args.nodes < 1:
        raise BadInput(f"--nodes {args.nodes}: a corral needs at least one node")
    if not 0 <= args.port <= 65535:
        raise BadInput(f"--port {args.port}: a TCP port is 1 to 65535 (0: a free one)")
    if args.cluster is not None:
        if args.server:
            raise BadInput("--cluster starts NATS servers here; --server names ones running: give one")
        if args.cluster < 3 or args.cluster % 2 == 0:
            # A JetStream cluster of n survives (n - 1) // 2 servers lost: 2 survives none, as 1.
            raise BadInput(f"--cluster {args.cluster}: an odd number of servers, 3 or more")
    if args.replicas is not None and not 1 <= args.replicas <= 5:
        raise BadInput(f"--replicas {args.replicas}: JetStream keeps 1 to 5 replicas")
    if args.replicas is not None and args.server is None and args.replicas > (args.cluster or 1):
        raise BadInput(f"--replicas {args.replicas}: more than the {args.cluster or 1} NATS servers started")
    settings = Settings(
        auth=args.auth, tenants=tenants, nats_servers=args.cluster or 1, replicas=args.replicas
    )
    observe(args)
    try:
        asyncio.run(
            run_cluster(
                args.server, args.nodes, args.profile, Path(args.data), args.port, settings, args.metrics_port
            )
        )
    except Refused as e:
        raise Failure(str(e)) from None
    except PartStopped as e:  # not a person's mistake: status 1, for a supervisor to restart it
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(1)


def observe(args: argparse.Namespace) -> None:
    """Logging for a long-running process (``up``, ``serve``), once, before anything logs."""
    from corral.services.runtime import logs

    if args.metrics_port is not None and not 0 <= args.metrics_port < 65536:
        raise BadInput(f"--metrics-port {args.metrics_port}: not a port (0 to 65535; 0: any free one)")
    logs.configure(args.log_level)
    if getattr(args, "role", None):
        logs.set_role(args.role)


def serve_roles() -> dict[str, str]:
    """Every role ``corral serve`` runs, and how its replicas share it: ``leased`` (one leads,
    under the role's lease; the others fold the log and stand by), ``shared`` (no lease: every
    replica answers its share) or ``node`` (one agent per node). compose.yaml runs each of them
    (``tests/unit/test_compose.py``)."""
    from corral.services.assignments import service as assignments_service
    from corral.services.cli.up import DECISION_SERVICES
    from corral.services.forecast import service as forecast_service
    from corral.services.health import service as health_service
    from corral.services.intake import service as intake_service
    from corral.services.query import service as read_service

    # The assignments service writes node views, and the forecast role start forecasts, not the
    # log, but they fold and lease like the rest.
    leased = [
        *(s.ROLE for s in DECISION_SERVICES),
        health_service.ROLE,
        assignments_service.ROLE,
        forecast_service.ROLE,
    ]
    # Services that fold nothing to decide, or only to answer, and hold no lease: any number of
    # replicas share the work, each with its own login.
    shared = [read_service.ROLE, intake_service.ROLE]
    return {**dict.fromkeys(leased, "leased"), **dict.fromkeys(shared, "shared"), "agent": "node"}


def cmd_serve(args: argparse.Namespace) -> None:
    """One service as its own process, against a running NATS."""
    from corral.services.runtime import metrics

    known = serve_roles()
    if args.role not in known:
        raise BadInput(f"unknown service {args.role!r}; services: {', '.join(known)}")
    observe(args)
    for flag, seconds in (("--reconnect-s", args.reconnect_s), ("--heartbeat-s", args.heartbeat_s)):
        # ``not (x > 0)`` also refuses NaN, which every comparison lets through.
        if not (seconds > 0 and math.isfinite(seconds)):
            raise BadInput(f"{flag} {seconds:g}: a number of seconds above 0")
    if not math.isfinite(args.lost_after_s) or args.lost_after_s <= args.heartbeat_s * SUSPECT_AFTER:
        raise BadInput(
            f"--lost-after-s {args.lost_after_s:g}: more than {SUSPECT_AFTER} heartbeats "
            f"({args.heartbeat_s * SUSPECT_AFTER:g} s), when a silent node is suspect"
        )
    if args.role == "agent":
        serve_agent(args)
        return
    from corral.services.assignments import service as assignments_service
    from corral.services.cli.up import DECISION_SERVICES
    from corral.services.forecast import service as forecast_service
    from corral.services.health import service as health_service
    from corral.services.health.decide import HeartbeatTracker
    from corral.services.intake import service as intake_service
    from corral.services.query import service as read_service
    from corral.services.runtime.forecasts import KvForecasts
    from corral.services.runtime.lease import KvLease
    from corral.services.runtime.shell import Service, stop_on_signals
    from corral.services.runtime.status import StatusBoard
    from corral.services.runtime.views import KvViewStore

    roles = {s.ROLE: s for s in DECISION_SERVICES}
    views_role = assignments_service.ROLE
    stateless = {read_service.ROLE: read_service.serve, intake_service.ROLE: intake_service.serve}
    login = login_of(args, args.role if args.role in stateless else identities.SERVICES)
    holder = f"{args.role}@{socket.gethostname()}:{os.getpid()}"
    if args.role in stateless:
        creds: dict[str, Any] = {"user": login.user, "password": login.password} if login else {}
        run_one = stateless[args.role](server_url(args.server), **creds, **reconnecting(args.reconnect_s))
        announce(args.role, holder, "started; no lease: every replica answers its share")

        async def serve_one() -> None:
            async with metrics.serving(f"corral-{args.role}", args.metrics_port):
                await run_one(stop_on_signals())

        ended(serve_one)
        return
    needs_log(f"serve {args.role}", login)

    async def run() -> None:
        async with metrics.serving(f"corral-{args.role}", args.metrics_port):
            await run_leased()

    async def run_leased() -> None:
        # A service reconnects (to any server of the list) and resumes; one that cannot, exits.
        log = await open_log(server_url(args.server), login, reconnect=args.reconnect_s)
        snapshots = None
        try:
            if args.snapshot:
                from corral.projections.snapshot import SnapshotStore

                snapshots = await SnapshotStore.open(args.snapshot, stream=await log.identity())
            # Replicas of a role take turns; each says when it starts and stops leading.
            lease = await KvLease.open(
                log.nc, args.role, holder, on_change=lambda leads: announce(args.role, holder, LEADS[leads])
            )
            announce(args.role, holder, "started; stands by until it holds the lease")
            board = await StatusBoard.open(log.nc, args.role, holder)
            svc: Service
            if args.role == health_service.ROLE:
                # Heartbeats come on core NATS, over the log's own connection.
                tracker = HeartbeatTracker(args.heartbeat_s, SUSPECT_AFTER, args.lost_after_s)
                svc = health_service.HealthMonitor(log, log.nc, tracker=tracker, lease=lease, status=board)
                svc.snapshots = snapshots
            elif args.role == views_role:
                store = await KvViewStore.open(log.nc)
                svc = assignments_service.service(log, store, snapshots=snapshots, lease=lease, status=board)
            elif args.role == forecast_service.ROLE:
                starts = await KvForecasts.open(log.nc)
                svc = forecast_service.service(log, starts, snapshots=snapshots, lease=lease, status=board)
            else:
                svc = roles[args.role].service(log, snapshots=snapshots, lease=lease, status=board)
            await svc.run(stop_on_signals())
        finally:
            if snapshots is not None:
                await snapshots.close()
            await log.close()

    ended(run)


LEADS = {True: "leads", False: "stops leading"}

# A served agent's heartbeats and the health role's timing: ``corral up``'s defaults (its
# ``Settings``), which a test corral shortens so that a killed node is lost within seconds.
HEARTBEAT = 5.0  # seconds between an agent's heartbeats
SUSPECT_AFTER = 3  # heartbeats missed before a node is suspect
LOST_AFTER = 60.0  # seconds of silence before a node is lost


def announce(role: str, holder: str, what: str) -> None:
    """One line on stderr for whoever watches a replica (its supervisor's log, a test)."""
    print(f"corral serve {role}: {holder} {what}", file=sys.stderr, flush=True)


def serve_agent(args: argparse.Namespace) -> None:
    """One node's agent as its own process, watching its node's view. SIGTERM or SIGINT ends it
    and leaves its workers running, for the next agent on the same work directory to take back
    (an agent restart: an upgrade, a crash of the agent alone); ``--stop-workers`` stops them
    instead and reports their exits (the node is being taken out of service), after telling
    the log so (``NodeShutdown``): their jobs requeue without counting a restart."""
    from corral.events.jetstream import JetStreamLog
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime import metrics
    from corral.services.runtime.output import JetStreamOutput
    from corral.services.runtime.shell import stop_on_signals
    from corral.services.runtime.views import KvNodeViews

    if not args.node:
        raise BadInput("serve agent: name the node with --node")
    login = login_of(args, identities.agent(args.node))
    creds: dict[str, Any] = {"user": login.user, "password": login.password} if login else {}
    creds.update(reconnecting(args.reconnect_s))
    work = Path(args.work_dir or Path(STATE_DIR) / "nodes" / args.node)

    announce(
        "agent", f"agent-{args.node}@{socket.gethostname()}:{os.getpid()}", f"started for node {args.node}"
    )

    async def run() -> None:
        # The agent's own figures (its process, its exports); the cluster's come from the read service.
        async with metrics.serving("corral-agent", args.metrics_port):
            await run_agent()

    async def run_agent() -> None:
        log = await JetStreamLog.connect(
            server_url(args.server),
            name=f"agent-{args.node}",
            inbox_prefix=identities.agent_inbox(args.node),
            **creds,
        )
        try:
            agent = NodeAgent(
                args.node,
                log,
                KvNodeViews(log.nc),
                work_dir=work,
                checkpoint_root=args.checkpoint_dir,
                publish=log.nc.publish,
                output=JetStreamOutput(log.nc),
                heartbeat_interval=args.heartbeat_s,
                sandbox=args.sandbox,
                hidden=list(args.hide or ()),
            )
            stop, ended = stop_on_signals(), asyncio.Event()
            running = asyncio.create_task(agent.run(ended))
            await asyncio.wait(
                {running, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED
            )
            if not running.done():
                if args.stop_workers:
                    ended.set()
                else:
                    await agent.leave()
            await running
        finally:
            await log.close()

    ended(run)


def ended(serve: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service until it stops; one whose connection to NATS gave up (an outage longer
    than it reconnects for) exits 1 with one line, for its supervisor to start it again."""
    try:
        asyncio.run(serve())
    except LogError as e:
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(1)


def _names(text: str | None, what: str) -> list[str]:
    names = [n for n in (text or "").split(",") if n]
    bad = [n for n in names if not subjects.is_token(n)]
    if bad:
        raise BadInput(f"{what} {bad[0]!r}: use letters, digits, '-' and '_' (at most 64)")
    return names


def cmd_deploy(args: argparse.Namespace) -> None:
    """What compose.yaml's init services run: NATS configs and logins, then the stream."""
    from corral.services.cli import deploy

    if args.step == "nats-config":
        servers = _names(args.servers, "server")
        if not servers:
            raise BadInput("deploy nats-config: name the nats-servers with --servers")
        try:
            written = deploy.nats_config(
                Path(args.out), servers, _names(args.nodes, "node"), _names(args.tenants, "tenant")
            )
        except identities.CredentialsError as e:
            raise BadInput(str(e)) from None
        print(
            f"wrote {len(written)} files under {args.out}: {len(servers)} server configs, logins/<name>.json"
        )
        return
    if args.replicas is not None and not 1 <= args.replicas <= 5:
        raise BadInput(f"--replicas {args.replicas}: JetStream keeps 1 to 5 replicas")
    login = login_of(args, identities.ADMIN)
    creds = {"user": login.user, "password": login.password} if login is not None else {}
    try:
        made = asyncio.run(deploy.setup(server_url(args.server), args.replicas, creds))
    except LogError as e:
        raise Failure(f"deploy setup: {e}") from None
    print(f"the log and its buckets are ready, {made} replicas each")


def cmd_demo(args: argparse.Namespace) -> None:
    from corral.services.cli.demo import run_demo
    from corral.services.sim.traces import philly

    try:
        philly.find()  # before anything starts: the demo's jobs come from the trace
    except FileNotFoundError as e:
        raise BadInput(f"demo: {e} (the folder that holds philly/philly.csv)") from None
    asyncio.run(run_demo(Path(args.data)))


# The job's fields as submit's flags, with the value each has when not given.
JOB_FLAGS = {
    "queue": None, "name": None, "priority_class": "normal", "replicas": 1, "gpus": 1, "gpu_milli": 1000,
    "mig": None, "cpu": 1000, "memory": 4096, "pack": None, "required": False, "min_replicas": None,
    "gpu_model": None, "image": None, "env": None, "mount": None, "runtime_estimate": None,
    "checkpointable": False, "grace": None, "not_preemptible": False, "restart_policy": None,
    "max_restarts": None, "label": None, "node_selector": None, "command": None,
}  # fmt: skip


def job_from_args(args: argparse.Namespace) -> tuple[str | None, JobSpec]:
    if args.file:
        # A flag beside a job file would be ignored: say so rather than submit something else.
        beside = [k for k, default in JOB_FLAGS.items() if getattr(args, k, default) != default]
        if beside:
            flag = "--" + beside[0].replace("_", "-")
            raise BadInput(f"{flag}: give the job's fields in {args.file} or as flags, not both")
        doc = load_document(args.file)
        if not isinstance(doc, dict):
            raise BadInput(f"{args.file}: a job file holds one table/object of job fields")
        job_id = doc.pop("id", None)
        spec = convert(doc, JobSpec, args.file, also=("id",))
        if args.command:
            if spec.command:
                raise BadInput(f"{args.file} gives the command already: give it there or after --, not both")
            spec = msgspec.structs.replace(spec, command=tuple(args.command))
        return job_id, spec
    if not args.queue:
        raise BadInput("give a job file, or at least --queue")
    res = Resources(
        gpus=args.gpus,
        gpu_milli=args.gpu_milli,
        mig=args.mig,
        cpu_milli=args.cpu,
        memory_mib=args.memory,
        gpu_models=tuple(args.gpu_model or ()),
    )
    # Only what a flag gave: the rest keeps JobSpec's defaults, as a job file leaving it out.
    given: dict[str, Any] = {
        "min_replicas": args.min_replicas,
        "image": args.image,
        "runtime_estimate_s": _duration(args.runtime_estimate, "--runtime-estimate"),
        "grace_seconds": _duration(args.grace, "--grace"),
        "restart_policy": args.restart_policy,
        "max_restarts": args.max_restarts,
    }
    if args.checkpointable:
        given["checkpointable"] = True
    if args.not_preemptible:
        given["preemptible"] = False
    spec = JobSpec(
        queue=args.queue,
        name=args.name or "",
        priority_class=args.priority_class,
        replicas=args.replicas,
        resources=res,
        topology=Topology(pack=args.pack or "none", required=args.required),
        command=tuple(args.command or ()),
        env=_pairs(args.env, "--env"),
        labels=_pairs(args.label, "--label"),
        node_selector=_pairs(args.node_selector, "--node-selector"),
        mounts=tuple(_mount(m) for m in args.mount or ()),
        **{k: v for k, v in given.items() if v is not None},
    )
    return None, spec


def paths_here(job_id: str | None, spec: JobSpec) -> tuple[str | None, JobSpec]:
    """The job with its command's relative paths taken from this directory (``jobfile.command_here``),
    saying on stderr which it changed. An image's command is the image's: left as given."""
    if spec.image is not None:
        return job_id, spec
    command, changed = command_here(spec.command, Path.cwd())
    for given, absolute in changed:
        print(f"corral: command: {given} is {absolute}", file=sys.stderr)
    return job_id, msgspec.structs.replace(spec, command=command)


def _duration(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return when.duration(text)
    except when.BadTime as e:
        raise BadInput(f"{flag}: {e}") from None


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise BadInput(f"{flag} {item!r}: write NAME=VALUE")
        out[name] = value
    return out


def _mount(text: str) -> Mount:
    """``SOURCE:TARGET`` (read-only) or ``SOURCE:TARGET:rw``."""
    parts = text.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        return Mount(source=parts[0], target=parts[1], read_only=parts[2] == "ro")
    if len(parts) == 2 and all(parts):
        return Mount(source=parts[0], target=parts[1])
    raise BadInput(f"--mount {text!r}: write SOURCE:TARGET, or SOURCE:TARGET:rw to let workers write")


def client_for(args: argparse.Namespace, *, reading: bool = False) -> Client:
    """The Python client as the command's login, for its tenant. Reading with no login (or the
    services login) and no ``--tenant``, it asks as the admin: the whole cluster, as the
    operator at the machine expects."""
    login = login_of(args, args.tenant)
    if reading and args.tenant is None and as_client(login) is None:
        tenant = identities.ADMIN
    else:
        tenant = tenant_of(args, login)
    if login is None:
        return Client(server_url(args.server), tenant=tenant)
    return Client(server_url(args.server), tenant=tenant, user=login.user, password=login.password)


def cmd_submit(args: argparse.Namespace) -> None:
    job_id, spec = paths_here(*job_from_args(args))
    with client_for(args) as client:
        done = client.submit(spec, args.id or job_id, wait=not args.no_wait, timeout=args.wait_timeout)
    print(done.job_id)


def cmd_cancel(args: argparse.Namespace) -> None:
    with client_for(args) as client:
        done = client.cancel(args.job, args.reason or "", wait=not args.no_wait, timeout=args.wait_timeout)
    print(f"cancelled {args.job}" if done.applied else f"cancel of {args.job} requested")


def cmd_resize(args: argparse.Namespace) -> None:
    with client_for(args) as client:
        done = client.resize(args.job, args.replicas, wait=not args.no_wait, timeout=args.wait_timeout)
    most = f"at most {args.replicas} workers"
    print(f"{args.job} resized to {most}" if done.applied else f"resize of {args.job} to {most} requested")


class QueueFile(msgspec.Struct, forbid_unknown_fields=True):
    """What ``corral queue apply`` takes: cohorts, queues, priority classes, the fair-share
    settings and the retention of finished jobs, all optional."""

    cohorts: list[CohortSpec] = []
    queues: list[QueueSpec] = []
    priority_classes: list[PriorityClassSpec] = []
    fair_share: FairShareSpec | None = None
    retention: RetentionSpec | None = None


def cmd_queue_apply(args: argparse.Namespace) -> None:
    doc = convert(durations_in(load_document(args.file), args.file), QueueFile, args.file)
    # Parents before children, so a cohort tree applies in one go whatever order the file uses.
    requests: list[tuple[str, Any, str]] = []
    if doc.fair_share is not None:
        requests.append(("fair-share", ApplyFairShare(fair_share=doc.fair_share), "cluster"))
    if doc.retention is not None:
        requests.append(("retention", ApplyRetention(retention=doc.retention), "cluster"))
    requests += [
        ("priority-class", ApplyPriorityClass(priority_class=p), p.name) for p in doc.priority_classes
    ]
    requests += [("cohort", ApplyCohort(cohort=c), c.name) for c in _parents_first(doc.cohorts)]
    requests += [("queue", ApplyQueue(queue=q), q.name) for q in doc.queues]
    send_admin(args, requests)
    counts = f"{len(doc.priority_classes)} priority classes, {len(doc.cohorts)} cohorts"
    fair = ", fair share" if doc.fair_share is not None else ""
    fair += ", retention" if doc.retention is not None else ""
    print(f"applied {counts}, {len(doc.queues)} queues{fair}")


# The queue file's durations, by path: written as people write them ("7d", "1h30m") or in
# seconds; the log stores seconds.
QUEUE_FILE_DURATIONS = (("fair_share", "half_life_s", False), ("retention", "finished_s", True))


def durations_in(doc: Any, where: str) -> Any:
    """``doc`` with each of its durations in seconds, or a BadInput naming the one that is not."""
    if not isinstance(doc, dict):
        return doc
    for part, field, zero in QUEUE_FILE_DURATIONS:
        section = doc.get(part)
        if isinstance(section, dict) and field in section:
            section = {**section, field: _seconds(section[field], f"{where}: {part}.{field}", zero=zero)}
            doc = {**doc, part: section}
    return doc


def cmd_queue_fair_share(args: argparse.Namespace) -> None:
    half_life = _seconds(args.half_life, "--half-life", zero=False)
    spec = FairShareSpec(half_life_s=half_life)
    send_admin(args, [("fair-share", ApplyFairShare(fair_share=spec), "cluster")])
    print(f"fair share: past GPU time halves every {half_life:g} s from now on")


def cmd_queue_retention(args: argparse.Namespace) -> None:
    keep = _seconds(args.finished, "--finished")
    spec = RetentionSpec(finished_s=keep)
    send_admin(args, [("retention", ApplyRetention(retention=spec), "cluster")])
    print(f"retention: finished jobs leave the state {keep:g} s after they end, from now on")


def _seconds(value: object, what: str, *, zero: bool = True) -> float:
    try:
        return when.seconds(value, zero=zero)
    except when.BadTime as e:
        raise BadInput(f"{what}: {e}") from None


def send_admin(args: argparse.Namespace, requests: list[tuple[str, Any, str]]) -> None:
    """Send the admin's ``(verb, request, name)`` requests, in order, through the intake (or, with
    the services' login, straight into the log)."""
    stamp = time.time_ns()
    items = [
        Append(subjects.admin(verb), codec.encode(body), msg_id=f"{verb}:{name}:{stamp}")
        for verb, body, name in requests
    ]
    login = login_of(args, identities.ADMIN)
    client = as_client(login)

    async def send() -> None:
        assert client is not None
        conn = await session(server_url(args.server), client)
        try:
            for item in items:  # in order: parents before children
                assert item.msg_id is not None
                await conn.send(item.subject, item.data, item.msg_id)
        except wire.Refused as e:
            raise Failure(str(e)) from None
        finally:
            await conn.close()

    async def run() -> None:
        log = await open_log(server_url(args.server), login)
        try:
            for r in await log.append_many(items):
                if isinstance(r, LogError):
                    raise Failure(f"the log refused a change: {r}")
        finally:
            await log.close()

    asyncio.run(send() if client is not None else run())


def _parents_first(cohorts: list[CohortSpec]) -> list[CohortSpec]:
    by_name = {c.name: c for c in cohorts}
    out: list[CohortSpec] = []
    seen: set[str] = set()

    def visit(c: CohortSpec, path: tuple[str, ...]) -> None:
        if c.name in seen or c.name in path:
            return
        if c.parent in by_name:
            visit(by_name[c.parent], (*path, c.name))
        seen.add(c.name)
        out.append(c)

    for c in cohorts:
        visit(c, ())
    return out


def cmd_status(args: argparse.Namespace) -> None:
    """Every live replica of every service with a lease, as each last posted itself."""
    from corral.services.runtime import status

    login = login_of(args, identities.SERVICES)
    needs_log("status", login)

    async def read() -> tuple[dict[str, str], list[status.ServiceStatus]]:
        log = await open_log(server_url(args.server), login)
        try:
            return await status.read(log.nc)
        finally:
            await log.close()

    holders, replicas = asyncio.run(read())
    rows = []
    for r in sorted(replicas, key=lambda r: (r.role, not r.leading, r.replica)):
        last = r.last_failure
        rows.append(
            {
                "ROLE": r.role,
                "REPLICA": r.replica,
                "LEADS": "yes" if holders.get(r.role) == r.replica else "no",
                "SEQ": r.seq,
                "CYCLES": r.cycles,
                "FAILURES": r.failures,
                "IN A ROW": r.in_a_row,
                "RETRY IN": f"{max(0.0, r.retry_at - r.at):.0f}s" if r.in_a_row else "",
                "LAST FAILURE": (
                    f"seq {last.seq}{' job ' + last.job if last.job else ''}: {last.error}" if last else ""
                ),
            }
        )
    if args.output == "json":
        emit(args, {"leases": holders, "replicas": [msgspec.to_builtins(r) for r in replicas]})
        return
    if not rows:
        print("no service has posted its status (none running, or none with a lease)")
        return
    emit(args, rows, list(rows[0]))


def cmd_queues(args: argparse.Namespace) -> None:
    from corral.services.query.queues import queue_rows

    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        rows = answer_of(ask(server_url(args.server), client, "queues"), "queues")
    else:
        rows = queue_rows(asyncio.run(remote_state(server_url(args.server), login)))
    emit(args, rows, list(rows[0]) if rows else ["queue"])


def answer_of(answer: dict[str, Any], key: str) -> Any:
    if "error" in answer:
        raise Failure(str(answer["error"]))
    return answer[key]


JOB_COLUMNS = [
    "id", "tenant", "queue", "phase", "attempt", "workers", "per_worker", "nodes", "starts", "reason"
]  # fmt: skip
NODE_COLUMNS = ["name", "condition", "profile", "model", "gpus", "free", "health", "mig"]
PHASES = get_args(Phase)


def job_table(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    """Jobs for people: workers as running of most (``3 of 2..4`` for an elastic job)."""
    cells = [[present.workers_text(r) if c == "workers" else r.get(c, "") for c in JOB_COLUMNS] for r in rows]
    text = table.render(JOB_COLUMNS, cells)
    return text if header else "\n".join(text.splitlines()[1:])


def node_table(rows: Sequence[dict[str, Any]]) -> str:
    texts = {"health": present.health_text, "mig": present.mig_text}
    return table.render(
        NODE_COLUMNS, [[texts[c](r) if c in texts else r.get(c, "") for c in NODE_COLUMNS] for r in rows]
    )


def cmd_jobs(args: argparse.Namespace) -> None:
    """The jobs the cluster holds; with ``--all``, also those it let go after their retention
    period (the newest ``MAX_LET_GO``), from the read service's view of the log. ``--watch``
    then prints each job that changed, each time the log moves on (JSON Lines with ``-o json``)."""
    phases = set(_names(args.state, "--state"))
    unknown = sorted(phases - set(PHASES))
    if unknown:
        raise BadInput(f"--state {unknown[0]}: not a phase; phases: {', '.join(PHASES)}")

    def shown(jobs: Sequence[Any], now: float | None = None) -> list[dict[str, Any]]:
        # The read service shows a tenant its own jobs only; the admin's may be narrowed here.
        # A waiting job's forecast start: in how long from ``now``, else when (what --watch
        # shows, so that a row changes only when its forecast does).
        return [
            {
                **msgspec.structs.asdict(j),
                "eta": None if j.eta is None else msgspec.to_builtins(j.eta),
                "starts": "" if j.eta is None else present.eta_text(msgspec.to_builtins(j.eta), now),
            }
            for j in jobs
            if args.tenant in (None, j.tenant)
            and (not phases or j.phase in phases)
            and args.queue in (None, j.queue)
        ]

    with client_for(args, reading=True) as client:
        if not args.watch:
            jobs, more = client.job_list(all=args.all)
            rows = shown(jobs, time.time())
            if args.output == "json":
                emit(args, rows)
            else:
                print(job_table(rows))
            if more:
                print(f"corral: and {more} older jobs let go, not shown", file=sys.stderr)
            return
        seen: dict[str, dict[str, Any]] = {}
        for i, jobs in enumerate(client.watch(all=args.all)):
            changed = [r for r in shown(jobs) if seen.get(r["id"]) != r]
            seen.update((r["id"], r) for r in changed)
            if args.output == "json":
                for r in changed:
                    print(json.dumps(r, sort_keys=True), flush=True)
            elif changed or i == 0:
                print(job_table(changed, header=i == 0), flush=True)


def cmd_nodes(args: argparse.Namespace) -> None:
    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        rows = answer_of(ask(server_url(args.server), client, "nodes"), "nodes")
    else:
        state = asyncio.run(remote_state(server_url(args.server), login))
        rows = [present.node_row(n) for n in sorted(state.nodes.values(), key=lambda n: n.name)]
    if args.output == "json":
        emit(args, rows)
    else:
        print(node_table(rows))


def admin_client(args: argparse.Namespace) -> Client:
    """The Python client as the admin (or as the tenant or login given, which the intake then
    refuses with the reason)."""
    login = login_of(args, identities.ADMIN)
    client = as_client(login)
    tenant = args.tenant or (client.user if client is not None else identities.ADMIN)
    if login is None:
        return Client(server_url(args.server), tenant=tenant)
    return Client(server_url(args.server), tenant=tenant, user=login.user, password=login.password)


def cmd_node(args: argparse.Namespace) -> None:
    """Cordon, drain or uncordon a node: the admin's request, answered with its verdict."""
    with admin_client(args) as client:
        if args.node_verb == "uncordon":
            client.uncordon(args.node)
            print(f"{args.node} uncordoned: work may land on it again")
            return
        drain = args.node_verb == "drain"
        client.cordon(args.node, args.reason, drain=drain)
    if drain:
        print(f"{args.node} draining: no new work, and its jobs move to other nodes")
    else:
        print(f"{args.node} cordoned: no new work lands on it; what runs there keeps running")


def cmd_queue_delete(args: argparse.Namespace) -> None:
    with admin_client(args) as client:
        client.delete_queue(args.name)
    print(f"deleted queue {args.name}")


async def read_shown(log: Any, until: int | None = None) -> list[Record]:
    """The log from its start (to ``until``), with a bar on a terminal."""
    total = until if until is not None else await log.last_seq()
    out: list[Record] = []
    with progress.shown("reading the log", total, "records", scale=True) as done:
        async for batch in log.read(1, until):
            out.extend(batch)
            done(len(batch))
    return out


def read_file_shown(path: str) -> list[Record]:
    """A log file's records, with a bar on a terminal (a missing file: LogFileError)."""
    size = Path(path).stat().st_size if Path(path).is_file() else None
    with progress.shown(f"reading {path}", size, "B", scale=True) as done:
        return logfile.read(path, done)


def cmd_log_export(args: argparse.Namespace) -> None:
    login = login_of(args, identities.SERVICES)
    needs_log("log export", login)
    where = Path(args.file).absolute().parent
    if not where.is_dir():  # before the whole log is read, not after
        raise BadInput(f"{args.file}: no directory {where}")

    async def run() -> int:
        log = await open_log(server_url(args.server), login)
        try:
            return logfile.write(args.file, await read_shown(log))
        finally:
            await log.close()

    n = asyncio.run(run())
    print(f"exported {n} records to {args.file}")


def cmd_log_import(args: argparse.Namespace) -> None:
    records = read_file_shown(args.file)
    login = login_of(args, identities.SERVICES)
    needs_log("log import", login)

    async def run() -> int:
        # Importing sets a log up: into a server with no corral yet, the stream is made.
        log = await open_log(server_url(args.server), login, create=True)
        try:
            items = [Append(r.subject, r.data, headers=r.headers) for r in records]
            results: list[Any] = []
            with progress.shown("importing", len(items), "records", scale=True) as done:
                for i in range(0, len(items), IMPORT_BATCH):
                    results += await log.append_many(items[i : i + IMPORT_BATCH])
                    done(len(items[i : i + IMPORT_BATCH]))
            failed = [r for r in results if isinstance(r, LogError)]
            if failed:
                raise Failure(f"{len(failed)} of {len(items)} records were refused: {failed[0]}")
            return len(items)
        finally:
            await log.close()

    print(f"imported {asyncio.run(run())} records from {args.file}")


IMPORT_BATCH = 1000  # records appended at once: the bar moves, and the batch still pipelines
FOLD_BATCH = 5000  # records folded between two moves of the bar


def cmd_replay(args: argparse.Namespace) -> None:
    if args.file:
        records = read_file_shown(args.file)
    else:
        login = login_of(args, identities.SERVICES)
        needs_log("replay", login)

        async def run() -> list[Record]:
            log = await open_log(server_url(args.server), login)
            try:
                return await read_shown(log, args.until)
            finally:
                await log.close()

        records = asyncio.run(run())
    if args.until is not None:
        records = [r for r in records if r.seq <= args.until]
    if args.at is not None:
        try:
            at = when.moment(args.at, time.time())
        except when.BadTime as e:
            raise BadInput(f"--at: {e}") from None
        records = [r for r in records if r.time <= at]
    if args.verify:
        from corral.services.cli.up import service_roles
        from corral.services.replay.report import as_dict, format_report
        from corral.services.replay.verify import verify

        with progress.shown("verifying", None, "decisions", scale=True) as done:
            report = verify(records, service_roles(), progress=done.at)
        emit(args, as_dict(report) if args.output == "json" else format_report(report))
        if not report.clean:
            sys.exit(1)
        return
    state = State()
    with progress.shown("folding", len(records), "records", scale=True) as done:
        for i in range(0, len(records), FOLD_BATCH):
            fold(records[i : i + FOLD_BATCH], state)
            done(len(records[i : i + FOLD_BATCH]))
    if args.output == "json":
        emit(args, present.full(state))
        return
    s = present.summary(state)
    print(f"state at seq {s['seq']}: {s['nodes']} nodes, {s['gpus']} GPUs, {s['jobs']} jobs")
    phases = present.phases_text(s["phases"])
    print(f"phases: {phases}; rejected {s['rejected']} (void {s['void']}); faults {s['faults']}")
    print()
    print(node_table([present.node_row(n) for n in sorted(state.nodes.values(), key=lambda n: n.name)]))
    print()
    print(job_table([present.job_row(j) for j in state.jobs.values()]))


def cmd_whatif(args: argparse.Namespace) -> None:
    """What corral would do with the job if it were submitted now; nothing is written. Asked of
    the forecast role, which answers for the asking tenant only; ``--log FILE`` answers from an
    exported log instead, on this machine."""
    from corral.services.forecast import whatif

    job_id, spec = paths_here(*job_from_args(args))
    job_id = job_id or "whatif"
    if args.log:
        state = fold(logfile.read(args.log))
        print(whatif.report(state, tenant_of(args), job_id, spec, state.time))
        return
    with client_for(args) as client:
        told = client.whatif(spec, job_id)
    emit(args, msgspec.to_builtins(told) if args.output == "json" else told.text)


def cmd_logs(args: argparse.Namespace) -> None:
    """A job's worker output, from any machine, through the read service (the agents ship it to
    the cluster): each worker's (``--rank``: one worker's), all the cluster keeps or its last
    ``--tail`` lines; ``--follow`` then prints what the workers print until the job has ended.
    A ``==> node: attempt-A.rank-R <==`` line says whose lines follow, as ``tail`` does."""
    if not subjects.is_token(args.job):
        raise BadInput(f"job id {args.job!r}: use letters, digits, '-' and '_' (at most 64)")
    if args.tail is not None and args.tail < 0:
        raise BadInput(f"--tail {args.tail}: a number of lines, 0 or more")
    if args.rank is not None and args.rank < 0:
        raise BadInput(f"--rank {args.rank}: ranks are 0 and up")
    source = None
    printed = False
    with client_for(args, reading=True) as client:
        for line in client.logs(args.job, args.rank, args.tail, args.follow):
            if (line.node, line.attempt, line.rank) != source:
                source = (line.node, line.attempt, line.rank)
                print(f"==> {line.node}: attempt-{line.attempt}.rank-{line.rank} <==")
            print(line.text, flush=args.follow)
            printed = True
    if not printed and not args.follow and args.tail != 0:
        which = f" rank {args.rank}" if args.rank is not None else ""
        raise Failure(f"no output of job {args.job}{which} (yet)")


def cmd_explain(args: argparse.Namespace) -> None:
    with client_for(args, reading=True) as client:
        told = client.explain(args.job)
    emit(args, msgspec.to_builtins(told) if args.output == "json" else told.text)


def cmd_dashboard(args: argparse.Namespace) -> None:
    """A live web page of the cluster, as one identity, over the read service."""
    from corral.services.dashboard.app import Feed, serve
    from corral.services.runtime.shell import stop_on_signals

    login = login_of(args, args.tenant)
    if login is not None and login.reads_log:
        raise Failure(f"the dashboard asks the read service: log in as a tenant or admin, not {login.user}")
    asker = login.user if login is not None else args.tenant or subjects.ADMIN
    if not subjects.is_token(asker):
        raise BadInput(f"tenant {asker!r}: use letters, digits, '-' and '_'")
    feed = Feed(server_url(args.server), asker, login.password if login is not None else None)

    async def run() -> None:
        await serve(feed, args.host, args.port, stop_on_signals())

    try:
        asyncio.run(run())
    except OSError as e:
        raise Failure(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None


# -- parser -------------------------------------------------------------------------------------


def add_observing(p: argparse.ArgumentParser) -> None:
    from corral.services.runtime.logs import LEVELS

    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port at /metrics (0: any free one; default: none). "
        "OTLP export too when OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    p.add_argument(
        "--log-level", choices=LEVELS, default="info", help="JSON lines on stderr unless it is a terminal"
    )


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="corral", description="Event-sourced GPU scheduler.")
    p.add_argument("--version", action="version", version=f"corral {corral.__version__}")
    common = _Parser(add_help=False)
    common.add_argument(
        "--server",
        help="NATS URL, or several comma separated (a cluster's: clients fail over between them; "
        "default: $CORRAL_SERVER, the running `corral up`, or localhost)",
    )
    common.add_argument("-o", "--output", choices=["table", "json"], default="table")
    common.add_argument(
        "--tenant",
        default=os.environ.get("CORRAL_TENANT"),
        help="who you act as (default: $CORRAL_TENANT, else 'default'); lists show only its jobs",
    )
    common.add_argument(
        "--credentials",
        default=os.environ.get("CORRAL_CREDENTIALS"),
        help="JSON file of user name to password, for a server with logins (default: $CORRAL_CREDENTIALS)",
    )
    common.add_argument(
        "--user",
        default=os.environ.get("CORRAL_USER"),
        help="log in as this identity (default: $CORRAL_USER, else --tenant); password from "
        "--credentials or $CORRAL_PASSWORD",
    )
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    up = sub.add_parser("up", parents=[common], help="embedded NATS, the services and simulated nodes")
    up.add_argument("--nodes", type=int, default=5)
    up.add_argument("--profile", default="mixed", help="node profile, or 'mixed' for one of each")
    up.add_argument("--data", default=str(STATE_DIR / "data"), help="JetStream store directory")
    up.add_argument("--port", type=int, default=0, help="NATS port (default: a free one)")
    up.add_argument(
        "--auth",
        action="store_true",
        help="require logins: each tenant may only send its own requests and ask about its own jobs",
    )
    up.add_argument("--tenants", help="with --auth: comma-separated tenants that get a login")
    add_observing(up)
    up.add_argument(
        "--cluster",
        type=int,
        metavar="N",
        help="run N nats-servers (odd, 3 or more) as one JetStream cluster here, the log in 3 replicas",
    )
    up.add_argument(
        "--replicas",
        type=int,
        help="replicas of the log and the buckets (default: 3 with --cluster or on a --server cluster of "
        "3 or more, else 1)",
    )
    up.set_defaults(fn=cmd_up)

    sv = sub.add_parser(
        "serve", parents=[common], help="run one service as its own process: admission, placer, …"
    )
    sv.add_argument(
        "role",
        help="admission, placer, preemptor, health, assignments, forecast (with leases), query, intake, "
        "or agent",
    )
    sv.add_argument("--snapshot", help="SQLite file for snapshots of its state")
    sv.add_argument("--node", help="agent: the node it runs (its name in the log)")
    sv.add_argument(
        "--work-dir", help="agent: workers' directories, logs and keepers (default: under ~/.corral)"
    )
    sv.add_argument(
        "--checkpoint-dir", help="agent: where jobs checkpoint, shared by the nodes that resume them"
    )
    sv.add_argument(
        "--sandbox", choices=["auto", "bwrap", "none"], default="auto", help="agent: run workers in bwrap"
    )
    sv.add_argument("--hide", action="append", help="agent: a directory no worker may see (repeatable)")
    sv.add_argument(
        "--stop-workers",
        action="store_true",
        help="agent: on SIGTERM stop this node's workers (default: leave them for the next agent)",
    )
    sv.add_argument(
        "--heartbeat-s",
        type=float,
        default=HEARTBEAT,
        help="agent: seconds between its heartbeats; health: the interval it expects "
        f"(default {HEARTBEAT:g})",
    )
    sv.add_argument(
        "--lost-after-s",
        type=float,
        default=LOST_AFTER,
        help="health: seconds of silence before a node is lost and its jobs requeue "
        f"(default {LOST_AFTER:g})",
    )
    add_observing(sv)
    sv.add_argument(
        "--reconnect-s",
        type=float,
        default=RECONNECT_FOR,
        help="seconds to try the servers again after losing them before exiting 1, for a supervisor "
        f"to restart the service (default {RECONNECT_FOR:g})",
    )
    sv.set_defaults(fn=cmd_serve)

    dp = sub.add_parser(
        "deploy", parents=[common], help="set up a deployment of separate machines (compose.yaml's init)"
    )
    dp.add_argument(
        "step",
        choices=["nats-config", "setup"],
        help="nats-config: passwords, each nats-server's config and each identity's login file (before "
        "NATS starts); setup: the log's stream and buckets (once NATS answers)",
    )
    dp.add_argument("--out", default="/etc/corral", help="nats-config: the directory shared with NATS")
    dp.add_argument("--servers", help="nats-config: comma-separated nats-server host names")
    dp.add_argument("--nodes", help="nats-config: comma-separated nodes whose agents get a login")
    dp.add_argument("--tenants", help="nats-config: comma-separated tenants that get a login")
    dp.add_argument(
        "--replicas",
        type=int,
        help="setup: copies of the log and the buckets (default: 3 on a NATS cluster of 3 or more, else 1)",
    )
    dp.set_defaults(fn=cmd_deploy)

    st = sub.add_parser(
        "status", parents=[common], help="each service replica: leading or standing by, failures"
    )
    st.set_defaults(fn=cmd_status)

    demo = sub.add_parser("demo", parents=[common], help="the whole mission on one machine, narrated")
    demo.add_argument("--data", default=str(STATE_DIR / "demo"))
    demo.set_defaults(fn=cmd_demo)

    verdict = _Parser(add_help=False)
    verdict.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the log stored the request, without waiting for its verdict",
    )
    verdict.add_argument(
        "--wait-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the verdict (default 30; past it: exit 3, the request stands)",
    )
    s = sub.add_parser(
        "submit",
        parents=[common, verdict],
        help="submit a job (file or flags); prints its id once accepted, or why not (exit 1)",
    )
    s.add_argument("file", nargs="?", help="job file: .toml, .yaml or .json")
    s.add_argument("--id", help="job id (default: generated); the same id twice is one job")
    s.add_argument("--queue")
    s.add_argument("--name")
    s.add_argument("--priority-class", default="normal")
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--gpus", type=int, default=1)
    s.add_argument("--gpu-milli", type=int, default=1000, help="thousandths of one shared GPU")
    s.add_argument("--mig", help="MIG profile, e.g. 3g.40gb")
    s.add_argument("--cpu", type=int, default=1000, help="milli-CPU per worker")
    s.add_argument("--memory", type=int, default=4096, help="MiB per worker")
    s.add_argument("--pack", choices=["none", "nvlink", "node", "rack", "block", "spread"])
    s.add_argument("--required", action="store_true", help="--pack is a requirement, not a preference")
    s.add_argument("--min-replicas", type=int, help="elastic: the fewest workers it runs with")
    s.add_argument(
        "--gpu-model",
        action="append",
        metavar="MODEL",
        help="a GPU model it may use, e.g. H100-80GB (repeatable)",
    )
    s.add_argument("--image", help="run each worker in this container image (docker or podman)")
    s.add_argument(
        "--env", action="append", metavar="NAME=VALUE", help="in each worker's environment (repeatable)"
    )
    s.add_argument(
        "--mount",
        action="append",
        metavar="SOURCE:TARGET[:rw]",
        help="a data mount, read-only unless it ends in :rw (repeatable)",
    )
    s.add_argument("--runtime-estimate", metavar="DURATION", help=f"how long it runs; {when.DURATION_HELP}")
    s.add_argument(
        "--checkpointable", action="store_true", help="it checkpoints when asked (the worker contract)"
    )
    s.add_argument(
        "--grace", metavar="DURATION", help="time it gets to checkpoint before it is stopped (30s)"
    )
    s.add_argument("--not-preemptible", action="store_true", help="never stopped for another job")
    s.add_argument("--restart-policy", choices=["never", "on-failure", "always"])
    s.add_argument("--max-restarts", type=int)
    s.add_argument("--label", action="append", metavar="NAME=VALUE", help="a label of the job (repeatable)")
    s.add_argument(
        "--node-selector",
        action="append",
        metavar="LABEL=VALUE",
        help="only nodes with this label (repeatable)",
    )
    s.add_argument(
        "--command",
        nargs=argparse.REMAINDER,
        help="what each worker runs (the rest of the line; or after --)",
    )
    s.set_defaults(fn=cmd_submit)

    w = sub.add_parser(
        "whatif", parents=[common], help="what corral would do with a job submitted now (changes nothing)"
    )
    shared = {"help", "id"} | {a.dest for a in common._actions} | {a.dest for a in verdict._actions}
    for action in s._actions:  # the same job file and flags as submit
        if action.dest not in shared:
            w._add_action(action)
    w.add_argument(
        "--log", help="answer from this exported log file (corral log export) at its last record's time"
    )
    w.set_defaults(fn=cmd_whatif)

    c = sub.add_parser("cancel", parents=[common, verdict], help="cancel a job of yours")
    c.add_argument("job")
    c.add_argument("--reason")
    c.set_defaults(fn=cmd_cancel)

    rz = sub.add_parser(
        "resize",
        parents=[common, verdict],
        help="an elastic job's most workers (a running job above it shrinks)",
    )
    rz.add_argument("job")
    rz.add_argument("replicas", type=int)
    rz.set_defaults(fn=cmd_resize)

    jb = sub.add_parser("jobs", parents=[common], help="list jobs")
    jb.add_argument(
        "--all", action="store_true", help="also the finished jobs let go after the retention period"
    )
    jb.add_argument("--state", help=f"only jobs in these phases, comma-separated: {', '.join(PHASES)}")
    jb.add_argument("--queue", help="only jobs of this queue")
    jb.add_argument(
        "--watch",
        action="store_true",
        help="then a line for each job that changes, as the log moves on (Ctrl-C stops)",
    )
    jb.set_defaults(fn=cmd_jobs)
    sub.add_parser(
        "nodes", parents=[common], help="list nodes: condition, free GPUs, health, MIG instances"
    ).set_defaults(fn=cmd_nodes)

    nd = sub.add_parser("node", help="take a node out of service and back (the admin's)")
    ndsub = nd.add_subparsers(dest="node_verb", required=True, parser_class=_Parser)
    for verb, what in (
        ("cordon", "no new work lands on the node; what runs there keeps running"),
        ("drain", "cordon, and move its running jobs away (each resumes from its last checkpoint)"),
        ("uncordon", "work may land on the node again"),
    ):
        nv = ndsub.add_parser(verb, parents=[common], help=what)
        nv.add_argument("node")
        if verb != "uncordon":
            nv.add_argument("--reason", default="", help="why, for `corral explain` of the jobs it moves")
        nv.set_defaults(fn=cmd_node, node_verb=verb)

    lo = sub.add_parser("logs", parents=[common], help="a job's worker output, from any machine")
    lo.add_argument("job")
    lo.add_argument("--rank", type=int, help="only this worker's output")
    lo.add_argument("--tail", type=int, metavar="N", help="only the last N lines of each worker's output")
    lo.add_argument(
        "-f", "--follow", action="store_true", help="keep printing what workers write, until the job ends"
    )
    lo.set_defaults(fn=cmd_logs)

    e = sub.add_parser("explain", parents=[common], help="a job's history and why it waits")
    e.add_argument("job")
    e.set_defaults(fn=cmd_explain)

    db = sub.add_parser(
        "dashboard",
        parents=[common],
        help="a live web page of GPUs, queues and jobs, showing what --tenant (or the login) may see",
    )
    db.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    db.add_argument("--port", type=int, default=8080, help="port to listen on (0: any free one)")
    db.set_defaults(fn=cmd_dashboard)

    q = sub.add_parser("queue", help="queues, cohorts and priority classes")
    qsub = q.add_subparsers(dest="queue_verb", required=True, parser_class=_Parser)
    qa = qsub.add_parser("apply", parents=[common], help="apply a queue file (.toml, .yaml, .json)")
    qa.add_argument("file")
    qa.set_defaults(fn=cmd_queue_apply)
    qf = qsub.add_parser(
        "fair-share", parents=[common], help="cluster-wide fair-share settings (the half-life of past use)"
    )
    qf.add_argument(
        "--half-life",
        "--half-life-s",
        dest="half_life",
        required=True,
        help="how long after GPU time a queue held weighs half in the fair-share order "
        f"({when.DURATION_HELP}; default 1d)",
    )
    qf.set_defaults(fn=cmd_queue_fair_share)
    qr = qsub.add_parser(
        "retention", parents=[common], help="how long the cluster's state keeps a finished job"
    )
    qr.add_argument(
        "--finished",
        "--finished-s",
        dest="finished",
        required=True,
        help="log time a finished job stays in the state before it is let go (its history stays "
        f"in the log and in `corral jobs --all`); 0 lets it go at once ({when.DURATION_HELP}; "
        "default 1h)",
    )
    qr.set_defaults(fn=cmd_queue_retention)
    qd = qsub.add_parser("delete", parents=[common], help="delete a queue that has no unfinished jobs")
    qd.add_argument("name")
    qd.set_defaults(fn=cmd_queue_delete)
    sub.add_parser("queues", parents=[common], help="quota, usage and fair share per queue").set_defaults(
        fn=cmd_queues
    )

    from corral.services.cli.sim import add_parser as add_sim

    add_sim(sub, common)

    lg = sub.add_parser("log", help="move the log to and from a JSON Lines file")
    lsub = lg.add_subparsers(dest="log_verb", required=True, parser_class=_Parser)
    ex = lsub.add_parser("export", parents=[common])
    ex.add_argument("file")
    ex.set_defaults(fn=cmd_log_export)
    im = lsub.add_parser("import", parents=[common])
    im.add_argument("file")
    im.set_defaults(fn=cmd_log_import)

    r = sub.add_parser("replay", parents=[common], help="rebuild the state from a log file or the server")
    r.add_argument("file", nargs="?")
    r.add_argument("--until", type=int, help="stop after this sequence number")
    r.add_argument("--at", help=f"stop at this time: {when.MOMENT_HELP}")
    r.add_argument(
        "--verify",
        action="store_true",
        help="re-run every decision on the state it was based on; report divergences (exit 1)",
    )
    r.set_defaults(fn=cmd_replay)
    return p


# Options whose value may start with "-" (``--at -1h``): argparse would take it for an option.
DASHED_VALUES = ("--at",)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments, with what people write that argparse alone would refuse: ``--at -1h``,
    and a job's command after ``--`` (``corral submit --queue q -- python train.py``)."""
    argv = list(argv)
    command: list[str] | None = None
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    fixed: list[str] = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] in DASHED_VALUES and arg.startswith("-") and fixed:
            fixed[-1] = f"{fixed[-1]}={arg}"
        else:
            fixed.append(arg)
    args = parser().parse_args(fixed)
    if command is not None:
        if args.verb not in ("submit", "whatif"):
            parser().error("only submit and whatif take a command after --")
        if args.command:
            parser().error("give the command after --command or after --, not both")
        if not command:
            parser().error("nothing after --: give the command to run")
        args.command = command
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        args.fn(args)
    except Refused as e:  # the cluster said no: the request was made, and refused
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(1)
    except TimedOut as e:  # the request stands; its outcome is not known yet
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(3)
    except (Failure, BadInput, logfile.LogFileError, identities.CredentialsError, CorralError) as e:
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
