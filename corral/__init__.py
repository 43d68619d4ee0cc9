"""corral: an event-sourced GPU scheduler and cluster orchestrator.

The code lives in three packages, all imported under this one name: ``corral.events`` (the
language: event and request types, the codec, the log), ``corral.projections`` (the fold and the
rules it enforces) and ``corral.services`` (the services, the CLI, the simulators). In the source
tree they are the top-level folders ``events/``, ``projections/`` and ``services/``, linked here;
the wheel carries them as real subpackages of ``corral``. Nothing is ever importable as a bare
``events`` or ``services``: those names belong to other projects on the package index.

What a user may rely on is what this module exports (``__all__``): the job, queue and request
types a client publishes, the codec that writes and reads them, the log and its two
implementations, and the fold that turns a log into the cluster's state. Everything else is
internal and may change between versions.
"""

from importlib.metadata import PackageNotFoundError, version

from corral.events.base import Event, Reason
from corral.events.codec import DecodeError, Envelope, decode_body, decode_envelope, encode, seal
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import CancelJob, JobSpec, Mount, ResizeJob, Resources, SubmitJob, Topology
from corral.events.log import Append, ConflictError, EventLog, InMemoryLog, LogError, Record
from corral.events.queues import (
    ApplyCohort,
    ApplyPriorityClass,
    ApplyQueue,
    CohortSpec,
    CordonNode,
    DeleteCohort,
    DeleteNode,
    DeletePriorityClass,
    DeleteQueue,
    PriorityClassSpec,
    QueueSpec,
    Quota,
)
from corral.projections.fold import apply, fold
from corral.projections.state import JobState, NodeState, State

try:
    __version__ = version("corral")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Append",
    "ApplyCohort",
    "ApplyPriorityClass",
    "ApplyQueue",
    "CancelJob",
    "CohortSpec",
    "ConflictError",
    "CordonNode",
    "DecodeError",
    "DeleteCohort",
    "DeleteNode",
    "DeletePriorityClass",
    "DeleteQueue",
    "Envelope",
    "Event",
    "EventLog",
    "InMemoryLog",
    "JetStreamLog",
    "JobSpec",
    "JobState",
    "LogError",
    "Mount",
    "NodeState",
    "PriorityClassSpec",
    "QueueSpec",
    "Quota",
    "Reason",
    "Record",
    "ResizeJob",
    "Resources",
    "State",
    "SubmitJob",
    "Topology",
    "__version__",
    "apply",
    "decode_body",
    "decode_envelope",
    "encode",
    "fold",
    "seal",
]
