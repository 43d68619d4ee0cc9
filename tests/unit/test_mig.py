"""MIG geometry: every profile starts only where NVIDIA places it, instances never overlap, and the
layouts that follow are exactly the known ones (77 distinct profile mixes, ignoring +me, on an
A100-80GB or H100; see the GPU facts reference, section 1). The last tests drive the same layouts
through the claim checks the fold uses, so what the geometry allows is what the fold accepts."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest

from corral.events.decisions import GpuClaim, MigSlot, Placement, WorkerSlot
from corral.events.jobs import JobSpec, Resources
from corral.events.nodes import NodeInventory
from corral.projections import claims, indexes, mig
from corral.projections.state import JobState, State
from corral.services.agent.inventory import h100_8x_mig
from tests.builders import LogBuilder

MIG_MODELS = ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL", "H200-141GB"]
# Profile class -> (memory slices, allowed starts, SM slices), as `nvidia-smi mig -lgipp` prints them.
PUBLISHED = {
    "1g": (1, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g+me": (1, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g.2s": (2, (0, 2, 4, 6), 1),
    "2g": (2, (0, 2, 4), 2),
    "3g": (4, (0, 4), 3),
    "4g": (4, (0,), 4),
    "7g": (8, (0,), 7),
}
NAMES = {
    "A100-80GB": {
        "1g": "1g.10gb", "1g+me": "1g.10gb+me", "1g.2s": "1g.20gb", "2g": "2g.20gb",
        "3g": "3g.40gb", "4g": "4g.40gb", "7g": "7g.80gb",
    },
    "H200-141GB": {
        "1g": "1g.18gb", "1g+me": "1g.18gb+me", "1g.2s": "1g.35gb", "2g": "2g.35gb",
        "3g": "3g.71gb", "4g": "4g.71gb", "7g": "7g.141gb",
    },
}  # fmt: skip
Slot = tuple[str, int]  # (profile name, start slice)


def plain(model: str) -> list[str]:
    return sorted(n for n in mig.profiles(model) if not n.endswith("+me"))


@cache
def layouts(model: str) -> frozenset[frozenset[Slot]]:
    """Every set of non-overlapping instances (ignoring +me), found with ``free_starts`` alone."""
    found: set[frozenset[Slot]] = set()

    def grow(used: int, layout: frozenset[Slot]) -> None:
        if layout in found:
            return
        found.add(layout)
        for name in plain(model):
            p = mig.profile(model, name)
            assert p is not None
            for start in mig.free_starts(model, name, used):
                grow(used | mig.mask(p, start), layout | {(name, start)})

    grow(0, frozenset())
    return frozenset(found)


def mixes(model: str) -> set[tuple[tuple[str, int], ...]]:
    return {tuple(sorted(Counter(n for n, _ in lay).items())) for lay in layouts(model) if lay}


# -- the profile table ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(NAMES))
def test_profiles_have_the_published_geometry(model: str) -> None:
    for cls, name in NAMES[model].items():
        p = mig.profile(model, name)
        size, starts, compute = PUBLISHED[cls]
        assert p is not None and (p.size, p.starts, p.compute) == (size, starts, compute), name


@pytest.mark.parametrize("model", MIG_MODELS)
def test_every_model_has_the_seven_profile_classes(model: str) -> None:
    assert mig.supports_mig(model)
    got = sorted((p.size, p.starts, p.compute) for p in mig.profiles(model).values())
    assert got == sorted(PUBLISHED.values())
    assert sum(n.endswith("+me") for n in mig.profiles(model)) == 1


@pytest.mark.parametrize("model", ["T4", "L40S", "", "h100-80gb"])
def test_models_without_mig(model: str) -> None:
    assert not mig.supports_mig(model) and mig.profiles(model) == {}
    assert mig.profile(model, "1g.10gb") is None
    assert not mig.fits(model, "1g.10gb", 0, 0) and mig.free_starts(model, "1g.10gb", 0) == []


def test_profile_of_another_model_does_not_exist() -> None:
    assert mig.profile("H100-80GB", "1g.5gb") is None and not mig.fits("H100-80GB", "1g.5gb", 0, 0)


@pytest.mark.parametrize("model", MIG_MODELS)
def test_every_allowed_start_fits_inside_the_gpu(model: str) -> None:
    for name, p in mig.profiles(model).items():
        assert p.starts and p.max_count >= 1, name
        for start in p.starts:
            assert start >= 0 and start + p.size <= mig.SLICES, (name, start)
            assert start % p.size == 0 or p.size == 1, (name, start)  # instances align to their size


# -- where one instance may go --------------------------------------------------------------------


@pytest.mark.parametrize("model", MIG_MODELS)
def test_on_an_empty_gpu_a_profile_fits_exactly_at_its_allowed_starts(model: str) -> None:
    for name, p in mig.profiles(model).items():
        for start in range(-2, mig.SLICES + 2):
            assert mig.fits(model, name, start, 0) == (start in p.starts), (name, start)
        assert mig.free_starts(model, name, 0) == list(p.starts)


@pytest.mark.parametrize("model", ["A100-80GB", "H100-80GB"])
def test_two_instances_fit_together_iff_their_slices_do_not_overlap(model: str) -> None:
    slots = [(n, s) for n, p in mig.profiles(model).items() for s in p.starts]
    for a, sa in slots:
        pa = mig.profile(model, a)
        assert pa is not None
        for b, sb in slots:
            pb = mig.profile(model, b)
            assert pb is not None
            apart = sa + pa.size <= sb or sb + pb.size <= sa
            assert mig.fits(model, b, sb, mig.mask(pa, sa)) == apart, (a, sa, b, sb)


def test_mask_is_the_slices_an_instance_occupies() -> None:
    p3 = mig.profile("H100-80GB", "3g.40gb")
    p1 = mig.profile("H100-80GB", "1g.20gb")
    assert p3 is not None and p1 is not None
    assert mig.mask(p3, 0) == 0b0000_1111 and mig.mask(p3, 4) == 0b1111_0000
    assert mig.mask(p1, 6) == 0b1100_0000


def test_free_starts_skip_taken_slices() -> None:
    used = mig.mask(mig.profile("H100-80GB", "2g.20gb"), 2)  # type: ignore[arg-type]
    assert mig.free_starts("H100-80GB", "1g.10gb", used) == [0, 1, 4, 5, 6]
    assert mig.free_starts("H100-80GB", "3g.40gb", used) == [4]
    assert mig.free_starts("H100-80GB", "4g.40gb", used) == []
    assert mig.free_starts("H100-80GB", "7g.80gb", used) == []


# -- every layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["A100-80GB", "H100-80GB"])
def test_there_are_77_distinct_profile_mixes(model: str) -> None:
    assert len(mixes(model)) == 77


@pytest.mark.parametrize("model", MIG_MODELS)
def test_every_model_shares_the_same_layouts(model: str) -> None:
    """Names differ by memory size; the geometry, and so the layouts, do not."""
    rename = {name: (p.size, p.starts) for name, p in mig.profiles(model).items()}
    shape = {frozenset((rename[n], s) for n, s in lay) for lay in layouts(model)}
    ref = {name: (p.size, p.starts) for name, p in mig.profiles("H100-80GB").items()}
    assert shape == {frozenset((ref[n], s) for n, s in lay) for lay in layouts("H100-80GB")}


@pytest.mark.parametrize("model", ["A100-80GB", "H100-80GB"])
def test_every_layout_respects_memory_compute_and_counts(model: str) -> None:
    for lay in layouts(model):
        sizes = [(mig.profile(model, n), s) for n, s in lay]
        assert all(p is not None for p, _ in sizes)
        used = [slot for p, s in sizes if p is not None for slot in range(s, s + p.size)]
        assert len(used) == len(set(used)) and set(used) <= set(range(mig.SLICES))
        assert sum(p.compute for p, _ in sizes if p is not None) <= 7
        for name, count in Counter(n for n, _ in lay).items():
            p = mig.profile(model, name)
            assert p is not None and count <= p.max_count


@pytest.mark.parametrize(
    "layout",
    [
        [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)],
        [("1g.10gb", s) for s in (0, 1, 2, 3, 6)] + [("2g.20gb", 4)],
        [("3g.40gb", 0), ("3g.40gb", 4)],
        [("4g.40gb", 0), ("3g.40gb", 4)],
        [("1g.10gb", s) for s in range(7)],
        [("1g.20gb", s) for s in (0, 2, 4, 6)],
        [("7g.80gb", 0)],
    ],
    ids=["3-2-1-1", "2-1-1-1-1-1", "3-3", "4-3", "seven-1g", "four-1g-2-slices", "7g"],
)
def test_nvidia_guide_examples_are_layouts(layout: list[Slot]) -> None:
    assert frozenset(layout) in layouts("A100-80GB")


def test_maximal_layouts_leave_no_room() -> None:
    model = "H100-80GB"
    for lay in layouts(model):
        grown = [other for other in layouts(model) if lay < other]
        used = 0
        for n, s in lay:
            p = mig.profile(model, n)
            assert p is not None
            used |= mig.mask(p, s)
        room = any(mig.free_starts(model, n, used) for n in plain(model))
        assert room == bool(grown)


# -- the fold's claim checks accept exactly these layouts -----------------------------------------

MIG_NODE = "mig-0"


def _one_gpu_state() -> State:
    inv = h100_8x_mig(MIG_NODE)
    return LogBuilder().node(MIG_NODE, NodeInventory(inv.cpu_milli, inv.memory_mib, inv.gpus[:1])).fold()


def _claim(state: State, job_id: str, profile: str, start: int) -> None:
    """Check and take one instance for a new one-worker job; ClaimError if it is refused."""
    job = JobState(job_id, "t", JobSpec(queue="q", resources=Resources(gpus=1, mig=profile)), 0, 0.0)
    indexes.add(state, job)
    p = Placement(job_id, 0, (WorkerSlot(0, MIG_NODE, (GpuClaim(0, mig=MigSlot(profile, start)),)),))
    claims.check(state, job, p)
    claims.take(state, job, p)


def test_claims_accept_every_layout_and_refuse_everything_that_does_not_fit() -> None:
    model = "H100-80GB"
    candidates = [(n, s) for n in plain(model) for s in range(mig.SLICES)]
    for lay in layouts(model):
        state = _one_gpu_state()
        for i, (name, start) in enumerate(sorted(lay)):
            _claim(state, f"j{i}", name, start)
        g = state.nodes[MIG_NODE].gpus[0]
        assert len(g.mig) == len(lay) and g.used_milli == sum(g.holders.values()) <= 1000
        for name, start in candidates:
            if lay | {(name, start)} in layouts(model) and (name, start) not in lay:
                continue
            with pytest.raises(claims.ClaimError) as exc:
                claims.check(state, _job(name), _placement(name, start))
            assert exc.value.reason.code == "mig"


def _job(profile: str) -> JobState:
    return JobState("x", "t", JobSpec(queue="q", resources=Resources(gpus=1, mig=profile)), 0, 0.0)


def _placement(profile: str, start: int) -> Placement:
    return Placement("x", 0, (WorkerSlot(0, MIG_NODE, (GpuClaim(0, mig=MigSlot(profile, start)),)),))


def test_one_me_instance_per_gpu() -> None:
    state = _one_gpu_state()
    _claim(state, "a", "1g.10gb+me", 0)
    with pytest.raises(claims.ClaimError, match=r"\+me"):
        claims.check(state, _job("1g.10gb+me"), _placement("1g.10gb+me", 3))
    _claim(state, "b", "1g.10gb", 3)


def test_two_me_instances_in_one_gang_are_refused() -> None:
    state = _one_gpu_state()
    job = JobState(
        "g", "t", JobSpec(queue="q", replicas=2, resources=Resources(gpus=1, mig="1g.10gb+me")), 0, 0.0
    )
    slot = [WorkerSlot(r, MIG_NODE, (GpuClaim(0, mig=MigSlot("1g.10gb+me", r)),)) for r in (0, 1)]
    with pytest.raises(claims.ClaimError, match=r"\+me"):
        claims.check(state, job, Placement("g", 0, tuple(slot)))
