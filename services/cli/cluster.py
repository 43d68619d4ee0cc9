"""The operator's verbs on a corral as a whole: start one (``up``, ``demo``), set up a deployment
(``deploy``), see its services (``status``), its nodes (``nodes``; ``node cordon|drain|uncordon``)
and a live page of it (``dashboard``).

``corral serve`` (one service as its own process) is ``serve.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path

import msgspec

from corral.events import subjects
from corral.events.log import LogError
from corral.services.cli import flags
from corral.services.cli.access import (
    Failure,
    admin_client,
    answer_of,
    as_client,
    ask_every_page,
    login_of,
    needs_log,
    open_log,
    remote_state,
    server_url,
)
from corral.services.cli.display import emit, node_table
from corral.services.cli.jobfile import BadInput
from corral.services.cli.serve import intake_rate, observe, serve_roles
from corral.services.query import present
from corral.services.runtime import identities


def _not_a_data_directory(data: Path) -> str:
    """Why ``data`` could not be made or used as a data directory (it, or a directory above it,
    is a file; the nearest that exists is not ours to write); "" if it could. Nothing is made:
    a refused start leaves nothing behind."""
    for path in (data, *data.parents):
        if not path.exists():
            continue
        if not path.is_dir():
            return "not a directory" if path == data else f"{path} is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path} is not writable"
        return ""
    return ""


def cmd_up(args: argparse.Namespace) -> None:
    from corral.events.server import ServerError
    from corral.services.agent.inventory import MIXED
    from corral.services.cli.up import PartStopped, Refused, Settings, run_cluster
    from corral.services.runtime.metrics import Unavailable

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
    data = Path(args.data)
    why = _not_a_data_directory(data)
    if why:
        raise BadInput(f"--data {args.data}: {why}")
    if not args.auth and (data / identities.CREDENTIALS).exists():
        # Started again without --auth, a corral set up with logins would take anyone's requests
        # as any tenant's and run their jobs unsandboxed: it is not done for a forgotten flag.
        raise BadInput(
            f"--data {args.data} was set up with logins ({identities.CREDENTIALS}): give --auth, "
            "or remove that file to run it without"
        )
    settings = Settings(
        auth=args.auth,
        tenants=tenants,
        nats_servers=args.cluster or 1,
        replicas=args.replicas,
        tenant_rate=intake_rate(args.tenant_rate, args.tenant_burst),
        node_rate=intake_rate(args.node_rate, args.node_burst, "node"),
    )
    observe(args)
    try:
        asyncio.run(
            run_cluster(
                args.server,
                args.nodes,
                args.profile,
                data,
                args.port,
                settings,
                args.metrics_port,
                args.metrics_host,
                args.metrics_token_file,
            )
        )
    except (Refused, Unavailable, ServerError) as e:  # ServerError: a port in use, a store unreadable
        raise Failure(str(e)) from None
    except PartStopped as e:  # not a person's mistake: status 1, for a supervisor to restart it
        print(f"corral: {e}", file=sys.stderr)
        sys.exit(1)


def cmd_deploy(args: argparse.Namespace) -> None:
    """What compose.yaml's init services run: NATS configs and logins, then the stream."""
    from corral.services.cli import deploy

    if args.step == "nats-config":
        servers = flags.names(args.servers, "server")
        if not servers:
            raise BadInput("deploy nats-config: name the nats-servers with --servers")
        try:
            written = deploy.nats_config(
                Path(args.out), servers, flags.names(args.nodes, "node"), flags.names(args.tenants, "tenant")
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


def cmd_status(args: argparse.Namespace) -> None:
    """Every live replica of every service with a lease, as each last posted itself."""
    from corral.services.runtime import status

    login = login_of(args, identities.SERVICES)
    needs_log("status", login, reads="every service's status board")

    async def read() -> tuple[dict[str, str], list[status.ServiceStatus]]:
        log = await open_log(server_url(args.server), login)
        try:
            return await status.read(log.nc)
        finally:
            await log.close()

    try:
        holders, replicas = asyncio.run(read())
    except status.Unreadable as e:
        raise Failure(f"cannot read every service's status: {e}") from None
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
    # A role whose every replica stopped leaves the board: said here, not left out unnoticed.
    posted = {r.role for r in replicas}
    missing = [role for role, how in serve_roles().items() if how == "leased" and role not in posted]
    if args.output == "json":
        emit(
            args,
            {
                "leases": holders,
                "replicas": [msgspec.to_builtins(r) for r in replicas],
                "missing": missing if replicas else [],
            },
        )
        return
    if not rows:
        print("no service has posted its status (none running, or none with a lease)")
        return
    blank = dict.fromkeys(rows[0], "")
    rows += [{**blank, "ROLE": role, "REPLICA": "none running", "LEADS": "no"} for role in missing]
    emit(args, rows, list(rows[0]))


def cmd_nodes(args: argparse.Namespace) -> None:
    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        rows = answer_of(ask_every_page(server_url(args.server), client, "nodes"), "nodes")
    else:
        state = asyncio.run(remote_state(server_url(args.server), login))
        rows = [present.node_row(n) for n in sorted(state.nodes.values(), key=lambda n: n.name)]
    if args.output == "json":
        emit(args, rows)
    else:
        print(node_table(rows))


def cmd_node(args: argparse.Namespace) -> None:
    """Cordon, drain, uncordon or delete a node: the admin's request, answered with its verdict."""
    with admin_client(args) as client:
        if args.node_verb == "uncordon":
            client.uncordon(args.node, repaired=args.repaired)
            cleared = "; its GPUs' recorded failures cleared" if args.repaired else ""
            print(f"{args.node} uncordoned: work may land on it again{cleared}")
            return
        if args.node_verb == "delete":
            client.delete_node(args.node)
            print(f"{args.node} deleted: the cluster no longer knows it")
            return
        drain = args.node_verb == "drain"
        client.cordon(args.node, args.reason, drain=drain)
    if drain:
        print(f"{args.node} draining: no new work, and its jobs move to other nodes")
    else:
        print(f"{args.node} cordoned: no new work lands on it; what runs there keeps running")


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
        await serve(feed, args.host, args.port, stop_on_signals(), key=secrets.token_urlsafe(24))

    try:
        asyncio.run(run())
    except OSError as e:
        raise Failure(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
