"""Traceparents of events when spans are not exported: the job's trace goes on, the span is new."""

from __future__ import annotations

import re

import pytest

from corral.services.runtime import tracing

W3C = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_child_joins_its_parents_trace_with_a_span_of_its_own() -> None:
    got = W3C.match(tracing.child_traceparent(PARENT))
    assert got is not None
    assert got[1] == "0af7651916cd43dd8448eb211c80319c"
    assert got[2] != "b7ad6b7169203331"
    assert got[3] == "01"


def test_a_parent_not_sampled_stays_not_sampled() -> None:
    got = W3C.match(tracing.child_traceparent(PARENT[:-2] + "00"))
    assert got is not None and got[3] == "00"


@pytest.mark.parametrize(
    "parent",
    [None, "", "garbage", "00-ab-cd-01", "00-00000000000000000000000000000000-b7ad6b7169203331-01"],
    ids=["none", "empty", "garbage", "short-ids", "zero-trace"],
)
def test_without_a_valid_parent_a_new_trace_starts(parent: str | None) -> None:
    first, second = tracing.child_traceparent(parent), tracing.child_traceparent(parent)
    a, b = W3C.match(first), W3C.match(second)
    assert a is not None and b is not None
    assert a[1] != b[1]  # each a trace of its own
    assert a[1] != "0" * 32 and a[3] == "01"


def test_without_export_an_event_carries_a_child_of_its_jobs_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_exporting", False)
    made = tracing.event_traceparent("placer.JobsPlaced", PARENT, {"corral.job": "j1"}, "placer")
    got = W3C.match(made or "")
    assert got is not None and got[1] == "0af7651916cd43dd8448eb211c80319c"
