"""The ``corral`` command: its parser, and how each failure ends (its line on stderr and exit status).

Every failure a person can cause (a wrong flag, an unreachable server, a bad job file) is one line
on stderr and exit status 2, never a traceback.

The verbs, by what they act on: jobs (``jobs.py``), the cluster (``cluster.py``, ``serve.py``),
queues (``queues.py``), the log as a whole (``logtools.py``) and ``corral sim`` (``sim.py``). How
it reaches a corral, and as whom: ``services/cli/access.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import corral
from corral.events.log import LogError
from corral.events.nats_client import RECONNECT_FOR
from corral.events.nodes import MAX_WORKERS
from corral.events.queues import RetentionSpec
from corral.services.cli import logfile, screen, when
from corral.services.cli.access import STATE_DIR, Failure
from corral.services.cli.cluster import (
    cmd_dashboard,
    cmd_demo,
    cmd_deploy,
    cmd_node,
    cmd_nodes,
    cmd_status,
    cmd_up,
)
from corral.services.cli.display import PHASES
from corral.services.cli.jobfile import BadInput
from corral.services.cli.jobs import (
    cmd_cancel,
    cmd_explain,
    cmd_jobs,
    cmd_logs,
    cmd_resize,
    cmd_submit,
    cmd_whatif,
)
from corral.services.cli.logtools import cmd_log_export, cmd_log_import, cmd_replay
from corral.services.cli.queues import (
    cmd_cohort_delete,
    cmd_priority_class_delete,
    cmd_queue_apply,
    cmd_queue_delete,
    cmd_queue_fair_share,
    cmd_queue_retention,
    cmd_queues,
)
from corral.services.cli.serve import HEARTBEAT, LOST_AFTER, cmd_serve
from corral.services.client import CorralError, Refused, TimedOut
from corral.services.intake import rate
from corral.services.runtime import identities


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"corral: {message} (see corral --help)\n")


# -- parser -------------------------------------------------------------------------------------


def add_tenant_rate(p: argparse.ArgumentParser) -> None:
    """The intake's rate per tenant (``services/intake/rate.py``), for ``up`` and ``serve``."""
    p.add_argument(
        "--tenant-rate",
        type=float,
        default=rate.DEFAULT.per_s,
        help="intake: requests a second each tenant may keep sending to this replica, one counted "
        f"for each {rate.TOKEN_BYTES} bytes a request starts; past it, answered 429 with when to "
        f"retry (0: no limit; default {rate.DEFAULT.per_s:g})",
    )
    p.add_argument(
        "--tenant-burst",
        type=int,
        default=rate.DEFAULT.burst,
        help="intake: requests a tenant may send at once after a quiet while "
        f"(default {rate.DEFAULT.burst:,})",
    )
    p.add_argument(
        "--node-rate",
        type=float,
        default=rate.NODE_DEFAULT.per_s,
        help="intake: reports a second each node's agent may keep sending to this replica, counted "
        f"as requests are; past it, answered 429 and sent again when told (0: no limit; default "
        f"{rate.NODE_DEFAULT.per_s:g})",
    )
    p.add_argument(
        "--node-burst",
        type=int,
        default=rate.NODE_DEFAULT.burst,
        help="intake: reports a node may send at once after a quiet while "
        f"(default {rate.NODE_DEFAULT.burst:,})",
    )


def add_observing(p: argparse.ArgumentParser) -> None:
    from corral.services.runtime.logs import LEVELS

    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port at /metrics (0: any free one; default: none). "
        "OTLP export too when OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    p.add_argument(
        "--metrics-host",
        help="the address /metrics listens on (default: 127.0.0.1, this machine only; 0.0.0.0: "
        "every interface, as a container scraped from outside needs)",
    )
    p.add_argument(
        "--metrics-token-file",
        help="answer /metrics only to scrapers bearing the token in this file (Prometheus: "
        "authorization.credentials_file); a job's workers reach this host's loopback too "
        "(corral up --auth: DATA/metrics-token, made the first time, unless given)",
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
    add_tenant_rate(up)
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
        "--gpus",
        choices=["auto", "nvml"],
        default="auto",
        help="agent: where its GPUs come from: 'nvml' reads them or exits with NVML's reason (a GPU "
        "node); 'auto' (default) registers a simulated 8xH100 node where NVML cannot be read",
    )
    sv.add_argument(
        "--max-workers",
        type=int,
        help=f"agent: the most workers its node runs at once, as a kubelet's --max-pods "
        f"(default {MAX_WORKERS})",
    )
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
    add_tenant_rate(sv)
    add_observing(sv)
    sv.add_argument(
        "--reconnect-s",
        type=float,
        default=RECONNECT_FOR,
        help="seconds to try the servers, at start or after losing them, before exiting 1, for a supervisor "
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
        ("delete", "forget a node taken out for good (drain it first); registering it again brings it back"),
    ):
        nv = ndsub.add_parser(verb, parents=[common], help=what)
        nv.add_argument("node")
        if verb in ("cordon", "drain"):
            nv.add_argument("--reason", default="", help="why, for `corral explain` of the jobs it moves")
        if verb == "uncordon":
            nv.add_argument(
                "--repaired",
                action="store_true",
                help="its GPUs were reset or replaced: clear the failures recorded on them (XIDs)",
            )
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
    qf.add_argument(
        "--short-jobs",
        "--short-jobs-gpu-s",
        dest="short_jobs",
        default="0",
        help="the short-job lane: a job expected to need at most this much GPU time (runtime "
        "estimate times GPUs; 1h is one GPU-hour) goes before fair-share order among jobs that "
        "borrow equally far (0, the default: no lane; the command sets both settings)",
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
    qr.add_argument(
        "--jobs-per-tenant",
        type=int,
        default=RetentionSpec().jobs_per_tenant,
        help="the most jobs one tenant may have in the state, finished ones not let go included; "
        "submissions past it are refused (default %(default)s; the command sets every setting)",
    )
    qr.add_argument(
        "--spec-bytes-per-tenant",
        type=int,
        default=RetentionSpec().spec_bytes_per_tenant,
        help="the most bytes one tenant's jobs in the state may hold in their specs (command, env, "
        "mounts, labels...); submissions past it are refused (default %(default)s)",
    )
    qr.set_defaults(fn=cmd_queue_retention)
    deletes = (
        ("delete", cmd_queue_delete, "delete a queue that has no unfinished jobs"),
        ("delete-cohort", cmd_cohort_delete, "delete a cohort no queue or cohort is in, its quota not lent"),
        ("delete-priority-class", cmd_priority_class_delete, "delete a class no unfinished job names"),
    )
    for verb, fn, what in deletes:
        qd = qsub.add_parser(verb, parents=[common], help=what)
        qd.add_argument("name")
        qd.set_defaults(fn=fn)
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
    # Only a verb that runs a command takes one after ``--``; to any other, ``--`` is argparse's
    # end of options: ``corral resize j1 -- 4`` read "the following arguments are required:
    # replicas", its replicas taken for a command.
    verb = next((a for a in argv if not a.startswith("-")), None)
    if "--" in argv and verb in ("submit", "whatif"):
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
        if args.command:
            parser().error("give the command after --command or after --, not both")
        if not command:
            parser().error("nothing after --: give the command to run")
        args.command = command
    return args


# Verbs that print what a job wrote, as it wrote it (``screen``).
_RAW = frozenset({"logs"})


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.verb not in _RAW:
        screen.install()
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
    except LogError as e:
        # The log answered once and then not (a NATS cluster without a majority, electing the
        # stream's leader): a command reading it is unreachable corral, not a crash.
        print(f"corral: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
