"""MIG geometry: which GPU instance profiles exist on which GPU, and where each may start.

A MIG GPU has 8 memory slices. A GPU instance occupies ``[start, start + size)`` of them; a set
of instances is valid iff every start is allowed for its profile and no ranges overlap (NVIDIA MIG
user guide, ``nvidia-smi mig -lgipp`` on A100-40GB and H100). Published placements are identical
on A100 and H100; H200 is assumed to follow them (NVML's possible-placements call is the source of
truth on real hardware).
"""

from __future__ import annotations

from typing import NamedTuple


class Profile(NamedTuple):
    size: int  # memory slices
    starts: tuple[int, ...]
    max_count: int
    compute: int  # SM slices


# By profile class, in the order of NVIDIA's profile table.
_CLASSES: dict[str, Profile] = {
    "1g": Profile(1, (0, 1, 2, 3, 4, 5, 6), 7, 1),
    "1g+me": Profile(1, (0, 1, 2, 3, 4, 5, 6), 1, 1),
    "1g.2s": Profile(2, (0, 2, 4, 6), 4, 1),
    "2g": Profile(2, (0, 2, 4), 3, 2),
    "3g": Profile(4, (0, 4), 2, 3),
    "4g": Profile(4, (0,), 1, 4),
    "7g": Profile(8, (0,), 1, 7),
}

# Profile names per GPU model (memory rounded as NVIDIA names them).
_NAMES: dict[str, dict[str, str]] = {
    "A100-40GB": {
        "1g.5gb": "1g", "1g.5gb+me": "1g+me", "1g.10gb": "1g.2s", "2g.10gb": "2g",
        "3g.20gb": "3g", "4g.20gb": "4g", "7g.40gb": "7g",
    },
    "A100-80GB": {
        "1g.10gb": "1g", "1g.10gb+me": "1g+me", "1g.20gb": "1g.2s", "2g.20gb": "2g",
        "3g.40gb": "3g", "4g.40gb": "4g", "7g.80gb": "7g",
    },
    "H100-NVL": {
        "1g.12gb": "1g", "1g.12gb+me": "1g+me", "1g.24gb": "1g.2s", "2g.24gb": "2g",
        "3g.47gb": "3g", "4g.47gb": "4g", "7g.94gb": "7g",
    },
    "H200-141GB": {
        "1g.18gb": "1g", "1g.18gb+me": "1g+me", "1g.35gb": "1g.2s", "2g.35gb": "2g",
        "3g.71gb": "3g", "4g.71gb": "4g", "7g.141gb": "7g",
    },
}  # fmt: skip
_NAMES["H100-80GB"] = _NAMES["A100-80GB"]

SLICES = 8


def supports_mig(model: str) -> bool:
    return model in _NAMES


def profiles(model: str) -> dict[str, Profile]:
    """Every profile name valid on ``model``, with its geometry."""
    return {name: _CLASSES[cls] for name, cls in _NAMES.get(model, {}).items()}


def profile(model: str, name: str) -> Profile | None:
    cls = _NAMES.get(model, {}).get(name)
    return None if cls is None else _CLASSES[cls]


def mask(p: Profile, start: int) -> int:
    """The memory slices an instance at ``start`` occupies, as a bit mask."""
    return ((1 << p.size) - 1) << start


def fits(model: str, name: str, start: int, used: int) -> bool:
    """Whether profile ``name`` may start at ``start`` on a GPU whose taken slices are ``used``."""
    p = profile(model, name)
    return p is not None and start in p.starts and not (mask(p, start) & used)


def free_starts(model: str, name: str, used: int) -> list[int]:
    p = profile(model, name)
    if p is None:
        return []
    return [s for s in p.starts if not (mask(p, s) & used)]
