"""The fold's caches of keys it would otherwise make again per job (``indexes.ask_key``,
``indexes.host_shape``, ``indexes.queued_keys``, ``runtimes.classes``): the values come from
tenants, so the caches stay bounded in entries and bytes, and a burst of distinct values (a
tenant's, or months of jobs whose commands differ run to run) does not leave them full of values
nobody asks for again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.events.jobs import JobSpec, Resources
from corral.projections import indexes, runtimes


@pytest.fixture(autouse=True)
def empty() -> Iterator[None]:
    caches = (indexes._ask_keys, indexes._shape_keys, indexes._queued_keys, runtimes._known)
    for c in caches:
        c.clear()
    yield
    for c in caches:
        c.clear()


def spec(i: int, command: tuple[str, ...] = ("train",)) -> JobSpec:
    return JobSpec(queue="q", command=(*command, f"--seed={i}"), resources=Resources(memory_mib=1024 + i))


def test_values_asked_for_after_a_burst_of_others_are_kept() -> None:
    for i in range(runtimes._MAX_KNOWN + 10):
        s = spec(i)
        runtimes.classes("team-a", s)
        indexes.ask_key(s.resources)
        indexes.host_shape(s)
        indexes.queued_keys(s)
    later = spec(-1)
    runtimes.classes("team-a", later)
    indexes.ask_key(later.resources)
    indexes.host_shape(later)
    indexes.queued_keys(later)
    assert ("team-a", "", later.command, later.resources, 1, "q") in runtimes._known
    assert later.resources in indexes._ask_keys
    assert (later.resources, later.topology, 1, False) in indexes._shape_keys
    known = ("q", later.resources, 1, None, later.topology, later.preemptible, later.priority_class)
    assert known in indexes._queued_keys
    assert len(runtimes._known) <= runtimes._MAX_KNOWN
    assert len(indexes._ask_keys) <= indexes._MAX_KEYS
    assert len(indexes._shape_keys) <= indexes._MAX_KEYS
    assert len(indexes._queued_keys) <= indexes._MAX_KEYS


def test_a_long_value_is_not_kept() -> None:
    long = spec(0, command=("x" * 100_000,))
    big = Resources(gpu_models=tuple(f"model-{i}" for i in range(10_000)))
    assert runtimes.classes("team-a", long) == runtimes._classes("team-a", long)
    named = JobSpec(queue="q", name="train", command=("x" * 100_000,))
    assert runtimes.classes("team-a", named) == runtimes._classes("team-a", named)
    assert indexes.ask_key(big) == indexes.ask_key(Resources(gpu_models=big.gpu_models))
    assert indexes.host_shape(JobSpec(queue="q", resources=big))
    assert indexes.queued_keys(JobSpec(queue="q", resources=big))
    assert not runtimes._known and not indexes._ask_keys and not indexes._shape_keys
    assert not indexes._queued_keys
