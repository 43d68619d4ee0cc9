"""The log as a whole, to and from a JSON Lines file: ``log export``, ``log import`` and ``replay``
(the state rebuilt from a file or the server, or with ``--verify`` every decision re-run).

Each reads or writes the log itself, so it needs the services' login on a server with logins.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from corral.events.log import Append, LogError, Record
from corral.projections.fold import fold
from corral.projections.state import State
from corral.services.cli import logfile, progress, when
from corral.services.cli.access import (
    Failure,
    login_of,
    needs_log,
    open_log,
    server_url,
)
from corral.services.cli.display import emit, job_table, node_table
from corral.services.cli.jobfile import BadInput
from corral.services.query import present
from corral.services.runtime import identities


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
            # Records appended after a live log's own would be folded again as if they had just
            # happened: jobs submitted anew, nodes shut down, placements made twice.
            held = await log.last_seq()
            if held:
                raise Failure(
                    f"the log at {server_url(args.server)} already holds records (the last at "
                    f"position {held}): import "
                    "sets a log up in a server with no corral yet (a new data directory)"
                )
            items = [Append(r.subject, r.data, headers=kept_headers(r.headers)) for r in records]
            results: list[Any] = []
            with progress.shown("importing", len(items), "records", scale=True) as done:
                for i in range(0, len(items), IMPORT_BATCH):
                    results += await log.append_many(items[i : i + IMPORT_BATCH])
                    done(len(items[i : i + IMPORT_BATCH]))
            failed = [r for r in results if isinstance(r, LogError)]
            if failed:
                raise Failure(f"{len(failed)} of {len(items)} records were refused: {failed[0]}")
            dropped = sum(1 for r in results if getattr(r, "duplicate", False))
            if dropped:
                raise Failure(f"{dropped} of {len(items)} records were taken for duplicates and not stored")
            return len(items)
        finally:
            await log.close()

    print(f"imported {asyncio.run(run())} records from {args.file}")


IMPORT_BATCH = 1000  # records appended at once: the bar moves, and the batch still pipelines


def kept_headers(headers: dict[str, str] | None) -> dict[str, str] | None:
    """A record's headers as imported: not the server's own (``Nats-*``). A stored message id
    made a later record of the same id a duplicate the server dropped without a word, and a
    rollup or expected-sequence header would have the server act on the log being rebuilt."""
    if not headers:
        return headers
    kept = {k: v for k, v in headers.items() if not k.lower().startswith("nats-")}
    return kept or None


FOLD_BATCH = 5000  # records folded between two moves of the bar


def cmd_replay(args: argparse.Namespace) -> None:
    if args.until is not None and args.until < 0:  # else the state before the log: no error
        raise BadInput(f"--until: {args.until} is not a log sequence (0 or more)")
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
    # A replay reads every tenant's records (the log, or its file): ``--tenant`` narrows the
    # jobs it lists to that tenant's, as every list does.
    tenant = args.tenant
    jobs = [j for j in state.jobs.values() if tenant is None or j.tenant == tenant]
    if args.output == "json":
        shown = present.full(state)
        if tenant is not None:
            shown["jobs"] = {j.id: shown["jobs"][j.id] for j in jobs}
        emit(args, shown)
        return
    s = present.summary(state)
    print(f"state at seq {s['seq']}: {s['nodes']} nodes, {s['gpus']} GPUs, {s['jobs']} jobs")
    phases = present.phases_text(s["phases"])
    print(f"phases: {phases}; rejected {s['rejected']} (void {s['void']}); faults {s['faults']}")
    print()
    print(node_table([present.node_row(n) for n in sorted(state.nodes.values(), key=lambda n: n.name)]))
    print()
    if tenant is not None:
        print(f"jobs of tenant {tenant}: {len(jobs)} of {len(state.jobs)}")
    print(job_table([present.job_row(j) for j in jobs]))
