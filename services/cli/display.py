"""How the verbs print what they get: tables for people, JSON for programs (``-o json``).

The job and node tables are the same wherever they appear (``jobs``, ``nodes``, ``replay``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, get_args

from corral.projections.lifecycle import Phase
from corral.services.cli import table
from corral.services.client.results import AsOf
from corral.services.query import present


def emit(args: argparse.Namespace, data: Any, headers: Sequence[str] | None = None) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    elif headers is not None:
        print(table.render(headers, [[row.get(h, "") for h in headers] for row in data]))
    else:
        print(data)


def say_if_stale(as_of: AsOf | None) -> None:
    """One line on stderr when the read service answered from a state it cannot bring up to
    date (the log has no stream leader, NATS does not answer): what was shown is as of then."""
    if as_of is not None and not as_of.current:
        print(f"corral: {as_of.text}", file=sys.stderr, flush=True)


JOB_COLUMNS = [
    "id", "tenant", "queue", "phase", "attempt", "workers", "gpus", "nodes", "starts", "reason"
]  # fmt: skip
NODE_COLUMNS = ["name", "condition", "profile", "model", "gpus", "free", "health", "mig", "why"]
PHASES = get_args(Phase)


def job_table(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    """Jobs for people: workers as running of most (``3 of 2..4`` for an elastic job), GPUs as
    what the job asks in all (``4×8 GPU``), a job that ended as where it was (``was on node-01``)."""
    text = table.render(JOB_COLUMNS, job_cells(rows, JOB_COLUMNS))
    return text if header else "\n".join(text.splitlines()[1:])


_JOB_TEXTS = {"workers": present.workers_text, "gpus": present.wants_text, "nodes": present.nodes_text}


def job_cells(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> list[list[Any]]:
    """``columns`` of job rows (``present.job_row``) as every table writes them."""
    return [[_JOB_TEXTS[c](r) if c in _JOB_TEXTS else r.get(c, "") for c in columns] for r in rows]


def node_table(rows: Sequence[dict[str, Any]]) -> str:
    texts = {"health": present.health_text, "mig": present.mig_text}
    return table.render(
        NODE_COLUMNS, [[texts[c](r) if c in texts else r.get(c, "") for c in NODE_COLUMNS] for r in rows]
    )
