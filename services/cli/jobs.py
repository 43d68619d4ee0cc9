"""A tenant's verbs on jobs: ``submit`` (a job file or flags), ``whatif``, ``cancel``, ``resize``,
``jobs``, ``logs`` and ``explain``.

Each asks through the Python client as the command's login (``access.client_for``): requests go
through the intake and wait for their verdict, answers come from the read service.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from corral.events import subjects
from corral.events.jobs import JobSpec, Resources, Topology, run_problem
from corral.projections.fold import fold
from corral.projections.shape import workers_text
from corral.services.cli import flags, logfile
from corral.services.cli.access import (
    Failure,
    client_for,
    tenant_of,
)
from corral.services.cli.display import PHASES, emit, job_table, say_if_stale
from corral.services.cli.jobfile import BadInput, command_here, convert, load_document
from corral.services.query import present

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
        # The command after ``--`` is the one thing a file may leave to the command line.
        beside = [
            k for k, default in JOB_FLAGS.items() if k != "command" and getattr(args, k, default) != default
        ]
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
        problem = run_problem(spec)
        if problem:
            raise BadInput(f"{args.file}: {problem}")
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
        "runtime_estimate_s": flags.duration(args.runtime_estimate, "--runtime-estimate"),
        "grace_seconds": flags.duration(args.grace, "--grace"),
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
        env=flags.pairs(args.env, "--env"),
        labels=flags.pairs(args.label, "--label"),
        node_selector=flags.pairs(args.node_selector, "--node-selector"),
        mounts=tuple(flags.mount(m) for m in args.mount or ()),
        **{k: v for k, v in given.items() if v is not None},
    )
    problem = run_problem(spec)
    if problem and spec.command:
        raise BadInput(problem)  # as admission would say it, before anything is sent
    if problem:
        # Admission would reject it; said here, before anything is sent, in the flags' words.
        verb = getattr(args, "verb", "submit")
        raise BadInput(
            f"nothing to run: give the command after -- (corral {verb} --queue {args.queue} -- "
            "python train.py), or an --image whose entrypoint runs"
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
    most = f"at most {workers_text(args.replicas)}"
    print(f"{args.job} resized to {most}" if done.applied else f"resize of {args.job} to {most} requested")


def cmd_jobs(args: argparse.Namespace) -> None:
    """The jobs the cluster holds; with ``--all``, also those it let go after their retention
    period (the newest ``MAX_LET_GO``), from the read service's view of the log. ``--watch``
    then prints each job that changed, each time the log moves on (JSON Lines with ``-o json``)."""
    phases = set(flags.names(args.state, "--state"))
    unknown = sorted(phases - set(PHASES))
    if unknown:
        raise BadInput(f"--state {unknown[0]}: not a phase; phases: {', '.join(PHASES)}")

    def shown(jobs: Sequence[Any], now: float | None = None) -> list[dict[str, Any]]:
        # The read service shows a tenant its own jobs only; the admin's may be narrowed here
        # (``--tenant T``; ``--tenant admin`` is the admin acting as itself: every job).
        # A waiting job's forecast start: in how long from ``now``, else when (what --watch
        # shows, so that a row changes only when its forecast does).
        return [
            {
                **msgspec.structs.asdict(j),
                "eta": None if j.eta is None else msgspec.to_builtins(j.eta),
                "starts": "" if j.eta is None else present.eta_text(msgspec.to_builtins(j.eta), now),
            }
            for j in jobs
            if args.tenant in (None, subjects.ADMIN, j.tenant)
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
            say_if_stale(client.as_of)
            return
        seen: dict[str, dict[str, Any]] = {}
        stale_since: float | None = None
        for i, jobs in enumerate(client.watch(all=args.all)):
            changed = [r for r in shown(jobs) if seen.get(r["id"]) != r]
            seen.update((r["id"], r) for r in changed)
            as_of = client.as_of
            if as_of is not None and as_of.stale_since != stale_since:  # said as it changes
                if as_of.current:
                    print(f"corral: the log is read again, as of position {as_of.seq}", file=sys.stderr)
                stale_since = as_of.stale_since
                say_if_stale(as_of)
            if args.output == "json":
                for r in changed:
                    print(json.dumps(r, sort_keys=True), flush=True)
            elif changed or i == 0:
                print(job_table(changed, header=i == 0), flush=True)


def cmd_whatif(args: argparse.Namespace) -> None:
    """What corral would do with the job if it were submitted now; nothing is written. Asked of
    the forecast role, which answers for the asking tenant only; ``--log FILE`` answers from an
    exported log instead, on this machine."""
    from corral.services.forecast import whatif

    job_id, spec = paths_here(*job_from_args(args))
    if args.log:
        state = fold(logfile.read(args.log))
        print(whatif.report(state, tenant_of(args), job_id or "", spec, state.time))
        return
    with client_for(args) as client:
        told = client.whatif(spec, job_id)
        say_if_stale(client.as_of)
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
        say_if_stale(client.as_of)
    if not printed and not args.follow and args.tail != 0:
        which = f" rank {args.rank}" if args.rank is not None else ""
        raise Failure(f"no output of job {args.job}{which} (yet)")


def cmd_explain(args: argparse.Namespace) -> None:
    with client_for(args, reading=True) as client:
        told = client.explain(args.job)
    emit(args, msgspec.to_builtins(told) if args.output == "json" else told.text)
    say_if_stale(client.as_of)
