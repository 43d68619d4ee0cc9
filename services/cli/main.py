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
import secrets
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn

import msgspec

import corral
from corral.events import codec, subjects
from corral.events.jobs import CancelJob, JobSpec, ResizeJob, Resources, SubmitJob, Topology
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
from corral.services.cli import logfile, table
from corral.services.cli.access import (
    STATE_DIR,
    Failure,
    as_client,
    ask,
    login_of,
    needs_log,
    nonce,
    open_log,
    publish_request,
    read_all,
    remote_state,
    server_url,
    session,
    tenant_of,
)
from corral.services.cli.jobfile import BadInput, convert, load_document
from corral.services.query import present
from corral.services.query.client import Refused
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
    try:
        asyncio.run(run_cluster(args.server, args.nodes, args.profile, Path(args.data), args.port, settings))
    except Refused as e:
        raise Failure(str(e)) from None
    except PartStopped as e:  # not a person's mistake: status 1, for a supervisor to restart it
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(1)


def cmd_serve(args: argparse.Namespace) -> None:
    """One service as its own process, against a running NATS."""
    if args.reconnect_s <= 0:
        raise BadInput(f"--reconnect-s {args.reconnect_s:g}: a number of seconds above 0")
    if args.role == "agent":
        serve_agent(args)
        return
    from corral.services.assignments import service as assignments_service
    from corral.services.cli.up import DECISION_SERVICES
    from corral.services.health import service as health_service
    from corral.services.intake import service as intake_service
    from corral.services.query import service as read_service
    from corral.services.runtime.lease import KvLease
    from corral.services.runtime.shell import Service, stop_on_signals
    from corral.services.runtime.status import StatusBoard
    from corral.services.runtime.views import KvViewStore

    roles = {s.ROLE: s for s in DECISION_SERVICES}
    # The assignments service writes node views, not the log, but folds and leases like the rest.
    views_role = assignments_service.ROLE
    leased = [*roles, health_service.ROLE, views_role]
    # Services that fold nothing to decide, or only to answer, and hold no lease: any number of
    # replicas share the work, each with its own login.
    stateless = {read_service.ROLE: read_service.serve, intake_service.ROLE: intake_service.serve}
    if args.role not in leased and args.role not in stateless:
        names = [*leased, *stateless]
        raise BadInput(f"unknown service {args.role!r}; services: {', '.join(names)}")
    login = login_of(args, args.role if args.role in stateless else identities.SERVICES)
    if args.role in stateless:
        creds: dict[str, Any] = {"user": login.user, "password": login.password} if login else {}
        run_one = stateless[args.role](server_url(args.server), **creds, **reconnecting(args.reconnect_s))

        async def serve_one() -> None:
            await run_one(stop_on_signals())

        ended(serve_one)
        return
    needs_log(f"serve {args.role}", login)

    async def run() -> None:
        # A service reconnects (to any server of the list) and resumes; one that cannot, exits.
        log = await open_log(server_url(args.server), login, reconnect=args.reconnect_s)
        snapshots = None
        try:
            if args.snapshot:
                from corral.projections.snapshot import SnapshotStore

                snapshots = await SnapshotStore.open(args.snapshot, stream=await log.identity())
            holder = f"{args.role}@{socket.gethostname()}:{os.getpid()}"
            lease = await KvLease.open(log.nc, args.role, holder)  # replicas of a role take turns
            board = await StatusBoard.open(log.nc, args.role, holder)
            svc: Service
            if args.role == health_service.ROLE:
                # Heartbeats come on core NATS, over the log's own connection.
                svc = health_service.HealthMonitor(log, log.nc, lease=lease, status=board)
                svc.snapshots = snapshots
            elif args.role == views_role:
                store = await KvViewStore.open(log.nc)
                svc = assignments_service.service(log, store, snapshots=snapshots, lease=lease, status=board)
            else:
                svc = roles[args.role].service(log, snapshots=snapshots, lease=lease, status=board)
            await svc.run(stop_on_signals())
        finally:
            if snapshots is not None:
                await snapshots.close()
            await log.close()

    ended(run)


def serve_agent(args: argparse.Namespace) -> None:
    """One node's agent as its own process, watching its node's view. SIGTERM or SIGINT ends it
    and leaves its workers running, for the next agent on the same work directory to take back
    (an agent restart: an upgrade, a crash of the agent alone); ``--stop-workers`` stops them
    instead and reports their exits (the node is being taken out of service)."""
    from corral.events.jetstream import JetStreamLog
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime.shell import stop_on_signals
    from corral.services.runtime.views import KvNodeViews

    if not args.node:
        raise BadInput("serve agent: name the node with --node")
    login = login_of(args, identities.agent(args.node))
    creds: dict[str, Any] = {"user": login.user, "password": login.password} if login else {}
    creds.update(reconnecting(args.reconnect_s))
    work = Path(args.work_dir or Path(STATE_DIR) / "nodes" / args.node)

    async def run() -> None:
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


def cmd_demo(args: argparse.Namespace) -> None:
    from corral.services.cli.demo import run_demo
    from corral.services.sim.traces import philly

    try:
        philly.find()  # before anything starts: the demo's jobs come from the trace
    except FileNotFoundError as e:
        raise BadInput(f"demo: {e} (the folder that holds philly/philly.csv)") from None
    asyncio.run(run_demo(Path(args.data)))


def job_from_args(args: argparse.Namespace) -> tuple[str | None, JobSpec]:
    if args.file:
        doc = load_document(args.file)
        if not isinstance(doc, dict):
            raise BadInput(f"{args.file}: a job file holds one table/object of job fields")
        job_id = doc.pop("id", None)
        return job_id, convert(doc, JobSpec, args.file)
    if not args.queue:
        raise BadInput("give a job file, or at least --queue")
    res = Resources(
        gpus=args.gpus, gpu_milli=args.gpu_milli, mig=args.mig, cpu_milli=args.cpu, memory_mib=args.memory
    )
    spec = JobSpec(
        queue=args.queue,
        name=args.name or "",
        priority_class=args.priority_class,
        replicas=args.replicas,
        resources=res,
        topology=Topology(pack=args.pack) if args.pack else Topology(),
        command=tuple(args.command or ()),
    )
    return None, spec


def cmd_submit(args: argparse.Namespace) -> None:
    job_id, spec = job_from_args(args)
    job_id = args.id or job_id or f"j-{secrets.token_hex(5)}"
    if not subjects.is_token(job_id):
        raise BadInput(f"job id {job_id!r}: use letters, digits, '-' and '_' (at most 64)")
    req = SubmitJob(request_id=job_id, job=spec)
    login = login_of(args, args.tenant)
    tenant = tenant_of(args, login)
    msg_id = f"submit:{tenant}:{job_id}:{nonce()}"
    asyncio.run(publish_request(server_url(args.server), tenant, "submit", req, msg_id, login))
    print(job_id)


def cmd_cancel(args: argparse.Namespace) -> None:
    req = CancelJob(job_id=args.job, reason=args.reason or "")
    login = login_of(args, args.tenant)
    tenant = tenant_of(args, login)
    msg_id = f"cancel:{tenant}:{args.job}:{nonce()}"
    asyncio.run(publish_request(server_url(args.server), tenant, "cancel", req, msg_id, login))
    print(f"cancel requested for {args.job}")


def cmd_resize(args: argparse.Namespace) -> None:
    if args.replicas < 1:
        raise BadInput(f"replicas {args.replicas}: at least 1")
    req = ResizeJob(job_id=args.job, replicas=args.replicas)
    login = login_of(args, args.tenant)
    tenant = tenant_of(args, login)
    msg_id = f"resize:{tenant}:{args.job}:{nonce()}"
    asyncio.run(publish_request(server_url(args.server), tenant, "resize", req, msg_id, login))
    print(f"resize of {args.job} to at most {args.replicas} workers requested")


class QueueFile(msgspec.Struct, forbid_unknown_fields=True):
    """What ``corral queue apply`` takes: cohorts, queues, priority classes, the fair-share
    settings and the retention of finished jobs, all optional."""

    cohorts: list[CohortSpec] = []
    queues: list[QueueSpec] = []
    priority_classes: list[PriorityClassSpec] = []
    fair_share: FairShareSpec | None = None
    retention: RetentionSpec | None = None


def cmd_queue_apply(args: argparse.Namespace) -> None:
    doc = convert(load_document(args.file), QueueFile, args.file)
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


def cmd_queue_fair_share(args: argparse.Namespace) -> None:
    half_life = args.half_life_s
    if not (half_life > 0 and math.isfinite(half_life)):
        raise BadInput(f"--half-life-s {half_life}: a positive number of seconds")
    spec = FairShareSpec(half_life_s=half_life)
    send_admin(args, [("fair-share", ApplyFairShare(fair_share=spec), "cluster")])
    print(f"fair share: past GPU time halves every {half_life:g} s from now on")


def cmd_queue_retention(args: argparse.Namespace) -> None:
    keep = args.finished_s
    if not (keep >= 0 and math.isfinite(keep)):
        raise BadInput(f"--finished-s {keep}: a number of seconds, 0 or more")
    spec = RetentionSpec(finished_s=keep)
    send_admin(args, [("retention", ApplyRetention(retention=spec), "cluster")])
    print(f"retention: finished jobs leave the state {keep:g} s after they end, from now on")


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
        except Refused as e:
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


JOB_COLUMNS = ["id", "tenant", "queue", "phase", "attempt", "workers", "per_worker", "nodes", "reason"]
NODE_COLUMNS = ["name", "condition", "profile", "model", "gpus", "free", "unhealthy", "mig"]


def cmd_jobs(args: argparse.Namespace) -> None:
    """The jobs the cluster holds; with ``--all``, also those it let go after their retention
    period (the newest ``MAX_LET_GO``), from the read service's view of the log."""
    from corral.services.query.decide import MAX_LET_GO
    from corral.services.query.view import JobView

    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        # The read service shows a tenant its own jobs only; the admin's may be narrowed here.
        answer = ask(server_url(args.server), client, "jobs", everything=args.all)
        jobs, more = answer_of(answer, "jobs"), answer.get("more_let_go", 0)
        rows = [j for j in jobs if args.tenant in (None, j["tenant"])]
    elif args.all:
        view = JobView()
        try:
            view.fold(asyncio.run(log_records(server_url(args.server), login)))
            older, more = view.jobs(args.tenant or subjects.ADMIN, MAX_LET_GO)
            held = [present.job_row(j) for j in view.state.jobs.values() if args.tenant in (None, j.tenant)]
            rows = older + held
        finally:
            view.close()
    else:
        state = asyncio.run(remote_state(server_url(args.server), login))
        rows = [present.job_row(j) for j in state.jobs.values() if args.tenant in (None, j.tenant)]
        more = 0
    emit(args, rows, JOB_COLUMNS)
    if more:
        print(f"corral: and {more} older jobs let go, not shown", file=sys.stderr)


def cmd_nodes(args: argparse.Namespace) -> None:
    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        rows = answer_of(ask(server_url(args.server), client, "nodes"), "nodes")
    else:
        state = asyncio.run(remote_state(server_url(args.server), login))
        rows = [present.node_row(n) for n in state.nodes.values()]
    emit(args, rows, NODE_COLUMNS)


def cmd_log_export(args: argparse.Namespace) -> None:
    login = login_of(args, identities.SERVICES)
    needs_log("log export", login)

    async def run() -> int:
        log = await open_log(server_url(args.server), login)
        try:
            return logfile.write(args.file, await read_all(log))
        finally:
            await log.close()

    n = asyncio.run(run())
    print(f"exported {n} records to {args.file}")


def cmd_log_import(args: argparse.Namespace) -> None:
    records = logfile.read(args.file)
    login = login_of(args, identities.SERVICES)
    needs_log("log import", login)

    async def run() -> int:
        # Importing sets a log up: into a server with no corral yet, the stream is made.
        log = await open_log(server_url(args.server), login, create=True)
        try:
            items = [Append(r.subject, r.data, headers=r.headers) for r in records]
            results = await log.append_many(items)
            failed = [r for r in results if isinstance(r, LogError)]
            if failed:
                raise Failure(f"{len(failed)} of {len(items)} records were refused: {failed[0]}")
            return len(items)
        finally:
            await log.close()

    print(f"imported {asyncio.run(run())} records from {args.file}")


def cmd_replay(args: argparse.Namespace) -> None:
    if args.file:
        records = logfile.read(args.file)
    else:
        login = login_of(args, identities.SERVICES)
        needs_log("replay", login)

        async def run() -> list[Record]:
            log = await open_log(server_url(args.server), login)
            try:
                return await read_all(log, args.until)
            finally:
                await log.close()

        records = asyncio.run(run())
    if args.until is not None:
        records = [r for r in records if r.seq <= args.until]
    if args.at is not None:
        records = [r for r in records if r.time <= args.at]
    if args.verify:
        from corral.services.cli.up import service_roles
        from corral.services.replay.report import as_dict, format_report
        from corral.services.replay.verify import verify

        report = verify(records, service_roles())
        emit(args, as_dict(report) if args.output == "json" else format_report(report))
        if not report.clean:
            sys.exit(1)
        return
    state = fold(records)
    if args.output == "json":
        emit(args, present.full(state))
        return
    s = present.summary(state)
    print(f"state at seq {s['seq']}: {s['nodes']} nodes, {s['gpus']} GPUs, {s['jobs']} jobs")
    print(f"phases: {s['phases']}; rejected {s['rejected']} (void {s['void']}); faults {s['faults']}")
    print()
    print(
        table.render(
            NODE_COLUMNS, [[present.node_row(n)[c] for c in NODE_COLUMNS] for n in state.nodes.values()]
        )
    )
    print()
    print(
        table.render(JOB_COLUMNS, [[present.job_row(j)[c] for c in JOB_COLUMNS] for j in state.jobs.values()])
    )


def cmd_logs(args: argparse.Namespace) -> None:
    """A job's worker output, from the agents' directories on this machine."""
    from corral.services.agent.workers import job_logs

    client = as_client(login_of(args, args.tenant))
    if client is not None:
        # The files are on this machine; still show them only for a job the login may see.
        answer_of(ask(server_url(args.server), client, "explain", args.job), "job")
    root = Path(args.root)
    agents = sorted({p.parent.parent.parent for p in root.glob(f"**/logs/{args.job}/*.log")})
    files = [f for agent in agents for f in job_logs(agent, args.job)]
    if not files:
        raise Failure(f"no logs of job {args.job} under {root}")
    for f in files:
        print(f"==> {f.parent.parent.parent.name}: {f.name} <==")
        print(f.read_text(errors="replace"), end="")


async def log_records(url: str, login: Any) -> list[Record]:
    log = await open_log(url, login)
    try:
        return await read_all(log)
    finally:
        await log.close()


def cmd_explain(args: argparse.Namespace) -> None:
    from corral.services.query.view import explain_log

    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        answer = ask(server_url(args.server), client, "explain", args.job)
        answer_of(answer, "job")
        emit(args, answer if args.output == "json" else answer["text"])
        return

    records = asyncio.run(log_records(server_url(args.server), login))
    report = explain_log(records, args.job, args.tenant)
    if report is None:
        raise Failure(f"no job {args.job}")
    emit(args, report if args.output == "json" else report["text"])


# -- parser -------------------------------------------------------------------------------------


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
    up.add_argument(
        "--cluster",
        type=int,
        metavar="N",
        help="run N nats-servers (odd, 3 or more) as one JetStream cluster here, the log in 3 replicas",
    )
    up.add_argument(
        "--replicas",
        type=int,
        help="replicas of the log and the buckets (default: 3 with --cluster, else 1)",
    )
    up.set_defaults(fn=cmd_up)

    sv = sub.add_parser(
        "serve", parents=[common], help="run one service as its own process: admission, placer, …"
    )
    sv.add_argument(
        "role",
        help="admission, placer, preemptor, health, assignments (with leases), query, intake, or agent",
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
        "--reconnect-s",
        type=float,
        default=RECONNECT_FOR,
        help="seconds to try the servers again after losing them before exiting 1, for a supervisor "
        f"to restart the service (default {RECONNECT_FOR:g})",
    )
    sv.set_defaults(fn=cmd_serve)

    st = sub.add_parser(
        "status", parents=[common], help="each service replica: leading or standing by, failures"
    )
    st.set_defaults(fn=cmd_status)

    demo = sub.add_parser("demo", parents=[common], help="the whole mission on one machine, narrated")
    demo.add_argument("--data", default=str(STATE_DIR / "demo"))
    demo.set_defaults(fn=cmd_demo)

    s = sub.add_parser("submit", parents=[common], help="submit a job (file or flags); prints its id")
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
    s.add_argument("--command", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_submit)

    c = sub.add_parser("cancel", parents=[common], help="cancel a job of yours")
    c.add_argument("job")
    c.add_argument("--reason")
    c.set_defaults(fn=cmd_cancel)

    rz = sub.add_parser(
        "resize", parents=[common], help="an elastic job's most workers (a running job above it shrinks)"
    )
    rz.add_argument("job")
    rz.add_argument("replicas", type=int)
    rz.set_defaults(fn=cmd_resize)

    jb = sub.add_parser("jobs", parents=[common], help="list jobs")
    jb.add_argument(
        "--all", action="store_true", help="also the finished jobs let go after the retention period"
    )
    jb.set_defaults(fn=cmd_jobs)
    sub.add_parser("nodes", parents=[common], help="list nodes").set_defaults(fn=cmd_nodes)

    lo = sub.add_parser("logs", parents=[common], help="a job's worker output (agents on this machine)")
    lo.add_argument("job")
    lo.add_argument("--root", default=str(STATE_DIR), help="where the agents keep their work")
    lo.set_defaults(fn=cmd_logs)

    e = sub.add_parser("explain", parents=[common], help="a job's history and why it waits")
    e.add_argument("job")
    e.set_defaults(fn=cmd_explain)

    q = sub.add_parser("queue", help="queues, cohorts and priority classes")
    qsub = q.add_subparsers(dest="queue_verb", required=True, parser_class=_Parser)
    qa = qsub.add_parser("apply", parents=[common], help="apply a queue file (.toml, .yaml, .json)")
    qa.add_argument("file")
    qa.set_defaults(fn=cmd_queue_apply)
    qf = qsub.add_parser(
        "fair-share", parents=[common], help="cluster-wide fair-share settings (the half-life of past use)"
    )
    qf.add_argument(
        "--half-life-s",
        type=float,
        required=True,
        help="seconds after which GPU time a queue held weighs half in the fair-share order (default 86400)",
    )
    qf.set_defaults(fn=cmd_queue_fair_share)
    qr = qsub.add_parser(
        "retention", parents=[common], help="how long the cluster's state keeps a finished job"
    )
    qr.add_argument(
        "--finished-s",
        type=float,
        required=True,
        help="seconds of log time a finished job stays in the state before it is let go (its "
        "history stays in the log and in `corral jobs --all`); 0 lets it go at once (default 3600)",
    )
    qr.set_defaults(fn=cmd_queue_retention)
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
    r.add_argument("--at", type=float, help="stop at this time (unix seconds)")
    r.add_argument(
        "--verify",
        action="store_true",
        help="re-run every decision on the state it was based on; report divergences (exit 1)",
    )
    r.set_defaults(fn=cmd_replay)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.fn(args)
    except (Failure, BadInput, logfile.LogFileError, identities.CredentialsError) as e:
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
