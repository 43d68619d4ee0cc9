"""The one reading of a worker's resources, by table: MIG before a fraction, a fraction only of
one GPU, whole GPUs otherwise, and every rule that reads a shape agreeing with it."""

from __future__ import annotations

import pytest

from corral.events.decisions import GpuClaim, MigSlot
from corral.events.jobs import Resources
from corral.projections import claims, quota
from corral.projections.claims import ClaimError
from corral.projections.placement.framework import Need
from corral.projections.shape import Shape, kind_of

CASES = [
    # id, resources, kind, gpus, milli, milli per worker (None: depends on the GPU model)
    ("cpu-only", Resources(gpus=0), "cpu", 0, 0, 0),
    ("one-whole", Resources(gpus=1), "whole", 1, 1000, 1000),
    ("eight-whole", Resources(gpus=8), "whole", 8, 1000, 8000),
    ("quarter", Resources(gpus=1, gpu_milli=250), "fraction", 1, 250, 250),
    ("almost-whole", Resources(gpus=1, gpu_milli=999), "fraction", 1, 999, 999),
    ("milli-1000-is-whole", Resources(gpus=1, gpu_milli=1000), "whole", 1, 1000, 1000),
    ("no-milli-is-whole", Resources(gpus=1, gpu_milli=0), "whole", 1, 1000, 1000),
    ("fraction-of-many-is-whole", Resources(gpus=4, gpu_milli=500), "whole", 4, 1000, 4000),
    ("mig", Resources(gpus=1, mig="3g.40gb"), "mig", 1, 0, None),
    ("mig-before-fraction", Resources(gpus=1, gpu_milli=250, mig="1g.10gb"), "mig", 1, 0, None),
    ("mig-before-count", Resources(gpus=2, mig="1g.10gb"), "mig", 1, 0, None),
    ("mig-without-gpus", Resources(gpus=0, mig="1g.10gb"), "mig", 1, 0, None),
]

BY_TABLE = pytest.mark.parametrize(
    ("res", "kind", "gpus", "milli", "per_worker"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)


@BY_TABLE
def test_shape_of_resources(res: Resources, kind: str, gpus: int, milli: int, per_worker: int | None) -> None:
    shape = Shape.of(res)
    assert (shape.kind, shape.gpus, shape.milli, shape.mig) == (kind, gpus, milli, res.mig)
    assert (shape.cpu, shape.memory) == (res.cpu_milli, res.memory_mib)
    assert kind_of(res.gpus, res.gpu_milli, res.mig) == kind
    if per_worker is not None:
        assert shape.gpu_milli == per_worker
        # quota charges what the shape holds; the tables show the same number of GPUs
        assert quota.worker_milli(res) == per_worker
        assert shape.gpus_short() == (f"{per_worker / 1000:g} GPU" if per_worker else "no GPU")
    else:
        assert shape.gpus_short() == f"MIG {res.mig}"
    # the placer's need is the same shape, with the job's model constraints beside it
    need = Need.of(res)
    assert (need.kind, need.gpus, need.milli, need.mig) == (kind, gpus, milli, res.mig)


@BY_TABLE
def test_the_fold_accepts_exactly_the_claims_of_the_shape(
    res: Resources, kind: str, gpus: int, milli: int, per_worker: int | None
) -> None:
    """The claims a worker of each shape must make; the fold refuses any other shape of claim."""
    if kind == "mig":
        right: tuple[GpuClaim, ...] = (GpuClaim(0, milli=0, mig=MigSlot(res.mig or "", 0)),)
        wrong: tuple[GpuClaim, ...] = (GpuClaim(0),)
    elif kind == "fraction":
        right, wrong = (GpuClaim(0, milli=milli),), (GpuClaim(0),)
    elif kind == "whole":
        right = tuple(GpuClaim(g) for g in range(gpus))
        wrong = (GpuClaim(0, milli=500),)
    else:
        right, wrong = (), (GpuClaim(0),)
    claims.check_worker_shape(res, right)
    with pytest.raises(ClaimError):
        claims.check_worker_shape(res, wrong)


def test_text() -> None:
    assert Shape.of(Resources(gpus=8)).gpus_text() == "8 whole GPUs"
    assert Shape.of(Resources(gpus=1)).gpus_text() == "1 whole GPU"
    assert Shape.of(Resources(gpus=1, gpu_milli=250)).gpus_text() == "250 milli-GPU of one GPU"
    assert Shape.of(Resources(mig="3g.40gb")).gpus_text() == "one MIG 3g.40gb instance"
    assert Shape.of(Resources(gpus=0)).gpus_text() == "no GPU"
    assert Shape.of(Resources(gpus=1, gpu_milli=250)).gpus_short() == "0.25 GPU"
    assert Shape.of(Resources(mig="3g.40gb")).gpus_short() == "MIG 3g.40gb"
