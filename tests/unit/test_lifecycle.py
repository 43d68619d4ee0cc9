"""The lifecycle table, walked whole: every (phase, trigger) pair outside the table is an illegal
transition, and the docstring's diagram is the table's. Plus the shape every operator relies on:
final phases are final, anything else can be cancelled, and every phase can be reached. That the
fold really takes each edge, on real records, is ``test_lifecycle_edges.py``."""

from __future__ import annotations

import itertools

import pytest

from corral.projections import lifecycle
from corral.projections.lifecycle import (
    FINAL,
    HOLDS_GPUS,
    HOLDS_QUOTA,
    PHASES,
    TRANSITIONS,
    TRIGGERS,
    IllegalTransition,
    Phase,
    Trigger,
    advance,
)

PAIRS = list(itertools.product(PHASES, TRIGGERS))
EDGES = [p for p in PAIRS if p in TRANSITIONS]
ILLEGAL = [p for p in PAIRS if p not in TRANSITIONS]


def _id(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


def test_table_speaks_only_of_known_phases_and_triggers() -> None:
    for (phase, trigger), target in TRANSITIONS.items():
        assert phase in PHASES and trigger in TRIGGERS and target in PHASES


def test_every_pair_is_walked() -> None:
    assert len(EDGES) + len(ILLEGAL) == len(PHASES) * len(TRIGGERS)
    assert EDGES and ILLEGAL


def test_the_docstring_draws_the_table() -> None:
    drawn = "\n".join("    " + line for line in lifecycle.diagram().split("\n"))
    assert drawn in (lifecycle.__doc__ or ""), f"draw the table in the docstring as:\n{drawn}"


def test_the_diagram_names_every_edge() -> None:
    lines = lifecycle.diagram().split("\n")
    for (phase, trigger), target in TRANSITIONS.items():
        drawn = [line for line in lines if line.endswith(f"─{trigger}→ {target}")]
        assert any(phase in line or line.startswith("any phase") for line in drawn), (phase, trigger)


@pytest.mark.parametrize("pair", ILLEGAL, ids=_id)
def test_pair_outside_the_table_is_illegal(pair: tuple[Phase, Trigger]) -> None:
    with pytest.raises(IllegalTransition) as exc:
        advance(*pair)
    assert (exc.value.phase, exc.value.trigger) == pair
    assert pair[0] in str(exc.value) and pair[1] in str(exc.value)


@pytest.mark.parametrize("phase", sorted(FINAL))
def test_final_phase_has_no_exit(phase: Phase) -> None:
    assert [t for (p, t) in TRANSITIONS if p == phase] == []


@pytest.mark.parametrize("phase", [p for p in PHASES if p not in FINAL])
def test_every_live_phase_can_be_cancelled(phase: Phase) -> None:
    assert advance(phase, "cancel") == "cancelled"


def test_every_phase_is_reachable_from_submitted() -> None:
    seen, frontier = {"submitted"}, ["submitted"]
    while frontier:
        here = frontier.pop()
        for (phase, _), target in TRANSITIONS.items():
            if phase == here and target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(PHASES)


def test_every_live_phase_can_still_end() -> None:
    """No phase is a trap: from any phase a final one can be reached without cancelling."""
    for start in PHASES:
        seen, frontier = {start}, [start]
        while frontier:
            here = frontier.pop()
            for (phase, trigger), target in TRANSITIONS.items():
                if phase == here and trigger != "cancel" and target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert seen & FINAL, start


def test_rejection_only_from_submitted() -> None:
    assert [p for (p, t) in TRANSITIONS if t == "reject"] == ["submitted"]


def test_resource_holding_phases() -> None:
    assert HOLDS_GPUS < HOLDS_QUOTA
    assert not (HOLDS_QUOTA & FINAL)
    assert {"placed", "starting", "running", "checkpointing"} == HOLDS_GPUS
