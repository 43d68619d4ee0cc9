"""Job family: what tenants ask for and what admission and the fold say about jobs.

Subjects: requests on ``corral.in.<tenant>.<verb>``; admission's events on ``corral.ev.job.<id>``.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

import msgspec

from corral.events.base import Decision, Event, Index, Int, Reason, Request

TopologyPack = Literal["none", "nvlink", "node", "rack", "block", "spread"]
RestartPolicy = Literal["never", "on-failure", "always"]


class Topology(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """Where the gang's workers should sit relative to each other."""

    pack: TopologyPack = "none"
    required: bool = False


# An image reference as a registry names one (the distribution reference grammar):
# ``[registry[:port]/]path[:tag][@sha256:digest]``, the path of lower-case components. Anything
# else is refused before it reaches an engine's command line, where a leading ``-`` would be read
# as an option (``--volume=/:/host``) and a transport would read a host path as the image
# (``dir:/etc``, ``oci-archive:/data/x.tar``).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_REGISTRY = rf"(?:(?:{_HOST}(?:\.{_HOST})+|localhost)(?::[0-9]+)?|{_HOST}:[0-9]+)/"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_REGISTRY})?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
# Transports an engine reads before a reference; a job names none.
_TRANSPORTS = (
    "docker:", "docker-archive:", "docker-daemon:", "oci:", "oci-archive:", "dir:", "containers-storage:",
    "ostree:", "sif:", "tarball:",
)  # fmt: skip


def image_problem(image: str) -> str:
    """Why ``image`` is not an image reference, or ``""``."""
    if image.startswith(_TRANSPORTS) or IMAGE_REFERENCE.fullmatch(image) is None:
        return "image must be a reference such as registry.example/team/train:1.2 (no transport, no option)"
    return ""


class Mount(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    source: str
    target: str
    read_only: bool = True


def mount_problem(m: Mount, container: bool) -> str:
    """Why no node could give ``m`` to a worker, whatever it holds, or ``""``: a target must be an
    absolute path below / that hides none of /proc, /dev and /sys; a container's ``-v`` cannot
    name a path with ':' or ','. Admission refuses such a job; the agent checks it again."""
    target = PurePosixPath(m.target)
    if not target.is_absolute() or ".." in target.parts or len(target.parts) < 2:
        return f"mount target {m.target} must be an absolute path below /"
    if target.parts[1] in ("proc", "dev", "sys"):
        where = "container's" if container else "sandbox's"
        return f"mount target {m.target} would hide the {where} /{target.parts[1]}"
    if container:
        for path in (m.source, m.target):
            if ":" in path or "," in path:
                return f"mount path {path} holds ':' or ',', which a container volume cannot name"
    return ""


class Resources(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """What one worker of the gang needs.

    GPUs are asked for in one of three shapes: ``gpus`` whole GPUs; ``gpu_milli`` thousandths of
    one shared GPU (``gpus`` must then be 1); or one ``mig`` profile such as ``"3g.40gb"``.
    """

    gpus: Int = 0
    gpu_milli: Int = 1000
    mig: str | None = None
    cpu_milli: Int = 1000
    memory_mib: Int = 1024
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_mib: Int = 0


# The most workers a job may have: admission refuses a larger submission, the fold a larger resize.
MAX_REPLICAS = 1024
# The most GPU models a job may name: the fold refuses a submission naming more.
MAX_GPU_MODELS = 16


class JobSpec(msgspec.Struct, frozen=True, omit_defaults=True, gc=False, forbid_unknown_fields=True):
    """Everything a tenant says about a job. Validated by admission, never trusted by the fold
    beyond what its own arithmetic needs."""

    queue: str
    name: str = ""
    priority_class: str = "normal"
    replicas: Int = 1
    min_replicas: Int | None = None
    resources: Resources = Resources()
    topology: Topology = Topology()
    preemptible: bool = True
    checkpointable: bool = False
    grace_seconds: float = 30.0
    runtime_estimate_s: float | None = None
    restart_policy: RestartPolicy = "on-failure"
    max_restarts: Int = 3
    command: tuple[str, ...] = ()
    image: str | None = None
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    labels: dict[str, str] = {}
    node_selector: dict[str, str] = {}


def run_problem(spec: JobSpec) -> str:
    """Why a node could start nothing for ``spec``, or ``""``: a worker runs the job's command,
    or a container image's own entrypoint, and a job with neither would be admitted and placed
    only to fail to start on every node, and so would one whose program is named "". Admission
    rejects it; the CLI and the client say so before sending it."""
    if spec.command and not spec.command[0]:
        # No program has an empty name: every start would fail ("No such file"), restart after
        # restart, the job's GPUs held for nothing.
        return "command: its program (the first argument) is empty"
    if spec.command or spec.image is not None:
        return ""
    return "nothing to run: give a command, or an image whose entrypoint runs"


# -- requests (corral.in.<tenant>.<verb>) ---------------------------------------------------------


class SubmitJob(Request, frozen=True, kw_only=True):
    """``request_id`` names the job: the same id sent twice is one job."""

    request_id: str
    job: JobSpec


class CancelJob(Request, frozen=True, kw_only=True):
    job_id: str
    reason: str = ""  # the job's reason once cancelled: ``said_reason`` keeps REASON_CHARS of it


REASON_CHARS = 512  # of a tenant's reason kept: it is shown in every listing of the job


def said_reason(text: str) -> str:
    """A tenant's reason as corral keeps and shows it: at most ``REASON_CHARS`` characters."""
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


class ResizeJob(Request, frozen=True, kw_only=True):
    """Change an elastic job's wanted replica count within its min..max."""

    job_id: str
    replicas: Int


# -- admission's facts (corral.ev.job.<id>) -------------------------------------------------------


class JobAccepted(Event, frozen=True, kw_only=True):
    """The request passed validation; the job waits in its queue."""

    job_id: str
    priority: Int


class JobPriorityChanged(Event, frozen=True, kw_only=True):
    """The scheduler moves a waiting or running job to another priority, with why: for a policy
    whose priorities follow what a job has received so far (Tiresias's least-attained-service
    queues: a job that ran long enough drops to the lower queue, one that waited long enough in
    it comes back up). Whom the preemption rule lets a job stop, and who may stop it, follow."""

    job_id: str
    priority: Int
    reason: Reason


class JobRejected(Event, frozen=True, kw_only=True):
    """A request that will never run, with why. ``request_seq`` points at the request."""

    job_id: str
    request_seq: Int
    reason: Reason


class PendingReasonChanged(Event, frozen=True, kw_only=True):
    job_id: str
    reasons: tuple[Reason, ...]


class Admission(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Quota held for a whole gang: ``replicas`` workers, ``gpus`` per GPU model (``"*"`` = any)."""

    job_id: str
    attempt: Index
    replicas: Int
    gpus: dict[str, Int] = {}


class JobsAdmitted(Decision, frozen=True, kw_only=True):
    """One admission cycle's proposals; the fold accepts or voids each one independently.

    ``growths`` are running elastic jobs admitted at more replicas than they hold (each names
    the job's new total, not the increase); they are checked after ``admissions``, in order."""

    admissions: tuple[Admission, ...]
    growths: tuple[Admission, ...] = ()


class AdmissionWithdrawn(Event, frozen=True, kw_only=True):
    """An admitted job gives its quota back and waits in its queue again, at the same attempt (it
    never ran): no node of the cluster can host it any more (a node left, or its GPUs changed),
    and it waits until one that can registers; or it was placed nowhere for the placement
    timeout, and ``admit_after`` (log time) is when it may be admitted again (Kueue's
    ``waitForPodsReady`` requeue with its back-off). ``reason`` says which. Of a running elastic
    job, only its growth is withdrawn (reason ``growth-timeout``): its added ranks were placed
    nowhere for the timeout; it runs on at the workers it has, and grows again from
    ``admit_after``."""

    job_id: str
    attempt: Index
    reason: Reason
    admit_after: float = 0.0


class JobRequeued(Event, frozen=True, kw_only=True):
    """A stopped or interrupted job goes back to its queue for another attempt."""

    job_id: str
    attempt: Index
    reason: Reason
    resume_from: str | None = None
