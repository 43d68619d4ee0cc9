"""``corral serve``: one service, or one node's agent, as its own process against a running NATS.

Replicas of a leased role take turns under the role's lease; a shared role's replicas each answer
their share. A service whose connection to NATS gave up exits 1, for its supervisor to restart it;
a wrong flag is one line and exit status 2, before anything connects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec

from corral.events.log import LogError
from corral.events.nats_client import reconnecting
from corral.projections.fold_nodes import MAX_WORKERS_PER_NODE
from corral.services.cli.access import (
    STATE_DIR,
    login_of,
    needs_log,
    open_log,
    server_url,
)
from corral.services.cli.jobfile import BadInput
from corral.services.intake.rate import Rate
from corral.services.runtime import identities


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


def intake_rate(per_s: float, burst: int, whose: str = "tenant") -> Rate | None:
    """An intake's rate per tenant from ``--tenant-rate`` and ``--tenant-burst`` (0: none);
    ``whose`` "node": per node, from ``--node-rate`` and ``--node-burst``."""
    if per_s == 0:
        return None
    try:
        return Rate(per_s, burst)
    except ValueError as e:
        raise BadInput(f"--{whose}-rate {per_s:g} --{whose}-burst {burst}: {e}") from None


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
    rate = intake_rate(args.tenant_rate, args.tenant_burst)
    node_rate = intake_rate(args.node_rate, args.node_burst, "node")
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
        if args.role == intake_service.ROLE:
            creds["rate"] = rate
            creds["node_rate"] = node_rate
        run_one = stateless[args.role](server_url(args.server), **creds, **reconnecting(args.reconnect_s))
        announce(args.role, holder, "started; no lease: every replica answers its share")

        async def serve_one() -> None:
            async with metrics.serving(
                f"corral-{args.role}", args.metrics_port, args.metrics_host, args.metrics_token_file
            ):
                await run_one(stop_on_signals())

        ended(serve_one)
        return
    needs_log(f"serve {args.role}", login)

    async def run() -> None:
        async with metrics.serving(
            f"corral-{args.role}", args.metrics_port, args.metrics_host, args.metrics_token_file
        ):
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
    from corral.events.nats_client import open_client
    from corral.services.agent import discovery
    from corral.services.agent.intake import IntakeReports
    from corral.services.agent.sandbox import isolation
    from corral.services.agent.service import NodeAgent
    from corral.services.runtime import metrics
    from corral.services.runtime.output import JetStreamOutput
    from corral.services.runtime.shell import stop_on_signals
    from corral.services.runtime.views import KvNodeViews

    if not args.node:
        raise BadInput("serve agent: name the node with --node")
    login = login_of(args, identities.agent(args.node))
    if login is not None and args.sandbox == "none":
        # With a login its tenants share the node: unsandboxed, a job sees the host's whole root
        # as the agent's user (the password in its environment, its credentials file among it).
        raise BadInput(
            "serve agent --sandbox none: with a login, tenants share the node and a job runs "
            "sandboxed (bwrap) or not at all"
        )
    creds: dict[str, Any] = {"user": login.user, "password": login.password} if login else {}
    creds.update(reconnecting(args.reconnect_s))
    work = Path(args.work_dir or Path(STATE_DIR) / "nodes" / args.node)
    try:
        # A GPU node whose driver is broken must not offer simulated GPUs to the placer.
        found = discovery.discover(args.node, fallback=None if args.gpus == "nvml" else "h100-8x")
    except discovery.NvmlUnavailable as e:
        raise BadInput(f"serve agent --gpus nvml: {e}") from None
    if args.max_workers is not None:
        if not 1 <= args.max_workers <= MAX_WORKERS_PER_NODE:
            raise BadInput(f"serve agent --max-workers {args.max_workers}: 1..{MAX_WORKERS_PER_NODE}")
        inventory = msgspec.structs.replace(found.inventory, max_workers=args.max_workers)
        found = msgspec.structs.replace(found, inventory=inventory)

    announce(
        "agent", f"agent-{args.node}@{socket.gethostname()}:{os.getpid()}", f"started for node {args.node}"
    )

    async def run() -> None:
        # The agent's own figures (its process, its exports); the cluster's come from the read service.
        async with metrics.serving(
            "corral-agent", args.metrics_port, args.metrics_host, args.metrics_token_file
        ):
            await run_agent()

    async def run_agent() -> None:
        # Its reports go to the intake (it may not write the log): a plain NATS connection.
        try:
            nc = await open_client(
                server_url(args.server),
                name=f"agent-{args.node}",
                inbox_prefix=identities.agent_inbox(args.node),
                **creds,
            )
        except Exception as e:
            raise LogError(f"cannot connect to {server_url(args.server)}: {e}") from e
        try:
            agent = NodeAgent(
                args.node,
                IntakeReports(nc, args.node),
                KvNodeViews(nc),
                found=found,
                work_dir=work,
                checkpoint_root=args.checkpoint_dir,
                publish=nc.publish,
                output=JetStreamOutput(nc),
                heartbeat_interval=args.heartbeat_s,
                hidden=list(args.hide or ()),
                # With a login, its tenants share the node.
                **isolation(login is not None, args.sandbox)._asdict(),
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
            with contextlib.suppress(Exception):  # the server may be gone already
                await nc.close()

    ended(run)


def ended(serve: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service until it stops; one whose connection to NATS gave up (an outage longer
    than it reconnects for) exits 1 with one line, for its supervisor to start it again; one
    whose metrics cannot listen where they were asked to, a person's mistake, exits 2."""
    from corral.services.runtime.metrics import Unavailable

    try:
        asyncio.run(serve())
    except LogError as e:
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(1)
    except Unavailable as e:
        raise BadInput(str(e)) from None
