"""A worker's resource shape: how it uses GPUs (whole ones, a fraction of one, or a MIG slice),
with the CPU and memory beside them.

A job says it in the user's fields of ``Resources`` (``gpus``, ``gpu_milli``, ``mig``), and
those fields can say contradictory things (a MIG profile with ``gpus: 2``; ``gpu_milli: 500``
with ``gpus: 4``). Admission refuses such jobs, but every rule that reads a shape (the fold's
claims and quota, the placer's chain, admission's order, elastic growth, the agents' environment,
what tables show) must read it the same way, or the fold and a service would disagree about what
a worker holds. So the reading is written once, here:

- a MIG profile makes a MIG slice, whatever else is said;
- else one GPU with ``0 < gpu_milli < 1000`` is a fraction of that GPU;
- else ``gpus`` whole GPUs (``gpu_milli`` is then ignored), and no GPU at all is CPU only.

``kind_of`` is that rule on bare numbers (the fold's hot paths and the trace replays call it
without building anything); ``Shape.of`` is the value the rest of the code passes around.

And which GPUs a worker may be placed on (``placed_resources``): a job that names several GPU
models runs on the one its admission counts against, as the fold's claims and the placer's
chain both read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from corral.events.jobs import Resources
from corral.projections.state import WHOLE, JobState

ShapeKind = Literal["cpu", "whole", "fraction", "mig"]
NO_GPU = "no GPU"  # a worker's GPU part, in a table cell, where it asks for none


def workers_text(n: int) -> str:
    """``n`` workers for people: ``1 worker``, ``4 workers``."""
    return f"{n} worker{'' if n == 1 else 's'}"


def kind_of(gpus: int, gpu_milli: int, mig: str | None) -> ShapeKind:
    """How a worker asking for ``gpus`` GPUs of ``gpu_milli`` each (and ``mig``) uses GPUs."""
    if mig is not None:
        return "mig"
    if gpus <= 0:
        return "cpu"
    if gpus == 1 and 0 < gpu_milli < WHOLE:
        return "fraction"
    return "whole"


def kind(res: Resources) -> ShapeKind:
    return kind_of(res.gpus, res.gpu_milli, res.mig)


def gpu_less(res: Resources) -> bool:
    """Whether a worker of ``res`` asks for no GPU: such a job holds no quota and rides on the
    GPU work's CPU and memory (``preemption.rides``, ``thrash.capped``)."""
    return kind(res) == "cpu"


@dataclass(frozen=True, slots=True)
class Shape:
    """What one worker holds, read once from ``Resources``."""

    kind: ShapeKind
    gpus: int  # GPUs per worker: the whole count, 1 for a fraction or a MIG slice, 0 for CPU only
    milli: int  # of each GPU: 1000 for whole GPUs, the fraction's milli, 0 for MIG and CPU only
    mig: str | None  # the MIG profile, for a MIG slice
    cpu: int  # milli-CPU
    memory: int  # MiB

    @classmethod
    def of(cls, res: Resources) -> Shape:
        k = kind(res)
        if k == "mig":
            gpus, milli = 1, 0
        elif k == "cpu":
            gpus, milli = 0, 0
        elif k == "fraction":
            gpus, milli = 1, res.gpu_milli
        else:
            gpus, milli = res.gpus, WHOLE
        return cls(k, gpus, milli, res.mig, res.cpu_milli, res.memory_mib)

    @property
    def gpu_milli(self) -> int:
        """Milli-GPU one worker holds, for every kind but MIG (whose share depends on the GPU
        model it lands on: ``projections.quota`` and ``claims`` work it out)."""
        return self.gpus * self.milli

    def gpus_text(self) -> str:
        """The GPU part, as tables and reasons say it: ``8 whole GPUs``, ``250 milli-GPU of one
        GPU``, ``one MIG 3g.40gb instance``, ``no GPU``."""
        if self.kind == "whole":
            return f"{self.gpus} whole GPU{'s' if self.gpus > 1 else ''}"
        if self.kind == "fraction":
            return f"{self.milli} milli-GPU of one GPU"
        if self.kind == "mig":
            return f"one MIG {self.mig} instance"
        return "no GPU"

    def gpus_short(self) -> str:
        """The GPU part in a table cell: ``8 GPU``, ``0.25 GPU``, ``MIG 3g.40gb``, ``no GPU``."""
        if self.kind == "mig":
            return f"MIG {self.mig}"
        if self.kind == "cpu":
            return NO_GPU
        return f"{self.gpu_milli / WHOLE:g} GPU"


def placed_resources(job: JobState) -> Resources:
    """What ``job``'s workers are placed with: its resources, but where it names several GPU
    models and its admission counts against one of them (a quota of that model, Kueue's flavor),
    that model only. Else a job charged to one model's quota could run on another's GPUs, which
    that other model's quota holders would then wait for, with nobody borrowing them to reclaim."""
    res = job.spec.resources
    adm = job.admission
    if adm is None or len(res.gpu_models) < 2 or len(adm.gpus) != 1:
        return res
    (key,) = adm.gpus
    if key not in res.gpu_models:
        return res  # counted against every model (``*``): any of them
    return msgspec.structs.replace(res, gpu_models=(key,))
