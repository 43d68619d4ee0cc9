"""corral's Python client, public as ``corral.client``: submit, wait, cancel, resize, list and
explain and watch jobs (a waiting one with its forecast start), ask what if a job were
submitted now (and, as the admin, cordon, drain and uncordon nodes and delete queues), from a
script or a notebook (``Client``) or asyncio (``AsyncClient``), with typed results and the
CLI's errors, and read what a job's workers print (``logs``: its tail, one rank, following it
as it comes), from any machine that reaches the cluster. The ``corral`` command's job verbs
are built on it.
"""

from corral.services.client.aio import AsyncClient
from corral.services.client.results import (
    Applied,
    AsOf,
    Busy,
    CorralError,
    Eta,
    Explanation,
    Forbidden,
    HistoryEntry,
    Invalid,
    Job,
    NoSuchJob,
    OutputLine,
    Reason,
    Refusal,
    Refused,
    Rejected,
    Submitted,
    TimedOut,
    Unreachable,
    WhatIf,
)
from corral.services.client.sync import Client

__all__ = [
    "Applied",
    "AsOf",
    "AsyncClient",
    "Busy",
    "Client",
    "CorralError",
    "Eta",
    "Explanation",
    "Forbidden",
    "HistoryEntry",
    "Invalid",
    "Job",
    "NoSuchJob",
    "OutputLine",
    "Reason",
    "Refusal",
    "Refused",
    "Rejected",
    "Submitted",
    "TimedOut",
    "Unreachable",
    "WhatIf",
]
