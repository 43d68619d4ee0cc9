"""The admin's verbs on queues: ``queue apply`` (a file of cohorts, queues, priority classes,
fair-share and retention settings), ``queue fair-share``, ``queue retention``, ``queue delete``
and ``queues`` (quota, usage and fair share per queue).

The admin's requests go through the intake, in order, or with the services' login straight into
the log.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import msgspec

from corral.events import codec, subjects
from corral.events.log import Append, LogError
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
from corral.projections.fold import apply_event
from corral.projections.indexes import SPEC_BYTES
from corral.projections.state import State
from corral.services.cli import flags
from corral.services.cli.access import (
    Failure,
    admin_client,
    answer_of,
    as_client,
    ask,
    login_of,
    open_log,
    remote_state,
    server_url,
)
from corral.services.cli.display import emit
from corral.services.cli.jobfile import BadInput, convert, load_document
from corral.services.client import AsyncClient, CorralError, Invalid, Refused
from corral.services.runtime import identities


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
    malformed = not_valid(requests)
    if malformed:
        told = f"{len(malformed)} of {len(requests)} changes not valid, none sent"
        raise BadInput(f"{args.file}: {told}: " + "; ".join(malformed))
    send_admin(args, requests)
    counts = ", ".join(
        _count(n, what)
        for n, what in (
            (len(doc.priority_classes), "priority class"),
            (len(doc.cohorts), "cohort"),
            (len(doc.queues), "queue"),
        )
    )
    fair = ", fair share" if doc.fair_share is not None else ""
    fair += ", retention" if doc.retention is not None else ""
    print(f"applied {counts}{fair}")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}es" if what.endswith("s") else f"{n} {what}s"


# The queue file's durations, by path: written as people write them ("7d", "1h30m") or in
# seconds; the log stores seconds.
QUEUE_FILE_DURATIONS = (
    ("fair_share", "half_life_s", False),
    ("fair_share", "short_job_gpu_s", True),  # GPU time, written as a duration ("1h": a GPU-hour)
    ("retention", "finished_s", True),
)


def durations_in(doc: Any, where: str) -> Any:
    """``doc`` with each of its durations in seconds, or a BadInput naming the one that is not."""
    if not isinstance(doc, dict):
        return doc
    for part, field, zero in QUEUE_FILE_DURATIONS:
        section = doc.get(part)
        if isinstance(section, dict) and field in section:
            section = {**section, field: flags.seconds(section[field], f"{where}: {part}.{field}", zero=zero)}
            doc = {**doc, part: section}
    return doc


def cmd_queue_fair_share(args: argparse.Namespace) -> None:
    half_life = flags.seconds(args.half_life, "--half-life", zero=False)
    short = flags.seconds(args.short_jobs, "--short-jobs")
    spec = FairShareSpec(half_life_s=half_life, short_job_gpu_s=short)
    send_admin(args, [("fair-share", ApplyFairShare(fair_share=spec), "cluster")])
    lane = f"jobs of at most {short:g} GPU-seconds go first" if short else "no short-job lane"
    print(f"fair share: past GPU time halves every {half_life:g} s from now on; {lane}")


def cmd_queue_retention(args: argparse.Namespace) -> None:
    keep = flags.seconds(args.finished, "--finished")
    if args.jobs_per_tenant < 1:
        raise BadInput(f"--jobs-per-tenant: {args.jobs_per_tenant} is not a number of jobs, 1 or more")
    most_bytes = args.spec_bytes_per_tenant
    if most_bytes < SPEC_BYTES:
        raise BadInput(
            f"--spec-bytes-per-tenant: {most_bytes} is less than a job's spec holds ({SPEC_BYTES})"
        )
    spec = RetentionSpec(
        finished_s=keep, jobs_per_tenant=args.jobs_per_tenant, spec_bytes_per_tenant=most_bytes
    )
    send_admin(args, [("retention", ApplyRetention(retention=spec), "cluster")])
    print(
        f"retention: finished jobs leave the state {keep:g} s after they end, from now on; "
        f"a tenant may have at most {args.jobs_per_tenant} jobs in it, holding at most "
        f"{most_bytes} bytes of specs"
    )


def not_valid(requests: list[tuple[str, Any, str]]) -> list[str]:
    """Why the fold would refuse each of ``requests`` as malformed whatever the cluster holds
    (a quota out of bounds, a weight of 0, cohorts of the file whose parents loop), folded in
    order into an empty state by the fold itself: a file with one is sent not at all, where
    sending its changes one by one applied those before and after it."""
    state = State()
    found = []
    for seq, (verb, body, _) in enumerate(requests, 1):
        before = state.rejected_total
        apply_event(state, seq, subjects.request(identities.ADMIN, verb), body, 0.0, identities.ADMIN)
        if state.rejected_total > before and state.rejections[-1].code == "malformed":
            found.append(state.rejections[-1].message)
    return found


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
        """Each change through the intake, in order (parents before children), and the fold's
        verdict on it: one the fold refused (a cohort whose parents loop, a quota out of
        bounds) is said with why, and the command fails, rather than reported applied."""
        user, password = (None, None) if client is None else (client.user, client.password)
        refused: list[str] = []
        try:
            async with AsyncClient(
                server_url(args.server), tenant=identities.ADMIN, user=user, password=password
            ) as corral:
                for verb, body, name in requests:
                    try:
                        await corral.apply(verb, name, body)
                    except (Refused, Invalid) as e:
                        said = str(e)  # the fold's reason names its subject most often
                        named = said.startswith(f"{verb} {name}")
                        refused.append(said if named else f"{verb} {name}: {said}")
        except CorralError as e:
            raise Failure(str(e)) from None
        if refused:
            why = f"{len(refused)} of {len(requests)} changes refused: " + "; ".join(refused)
            raise Refused("refused", why)

    async def run() -> None:
        log = await open_log(server_url(args.server), login)
        try:
            for r in await log.append_many(items):
                if isinstance(r, LogError):
                    raise Failure(f"the log refused a change: {r}")
        finally:
            await log.close()

    # The services' login writes straight into the log (it has no intake to answer it); any
    # other, or none on a server without logins, goes through the intake as the admin.
    asyncio.run(run() if login is not None and login.reads_log else send())


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


def cmd_queues(args: argparse.Namespace) -> None:
    from corral.services.query.queues import queue_rows

    login = login_of(args, args.tenant)
    client = as_client(login)
    if client is not None:
        rows = answer_of(ask(server_url(args.server), client, "queues"), "queues")
    else:
        rows = queue_rows(asyncio.run(remote_state(server_url(args.server), login)))
    if args.output != "json":  # a limit not set is no limit: "-", as a queue in no cohort
        rows = [{k: "-" if v is None and k.endswith("_limit") else v for k, v in r.items()} for r in rows]
    emit(args, rows, list(rows[0]) if rows else ["queue"])


def cmd_queue_delete(args: argparse.Namespace) -> None:
    with admin_client(args) as client:
        client.delete_queue(args.name)
    print(f"deleted queue {args.name}")


def cmd_cohort_delete(args: argparse.Namespace) -> None:
    with admin_client(args) as client:
        client.delete_cohort(args.name)
    print(f"deleted cohort {args.name}")


def cmd_priority_class_delete(args: argparse.Namespace) -> None:
    with admin_client(args) as client:
        client.delete_priority_class(args.name)
    print(f"deleted priority class {args.name}")
