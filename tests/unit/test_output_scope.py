"""Whose output the read service shows as a job's (``decide.OutputScope``, ``view.JobView``): its
run's subjects, of the workers the fold placed for it, on their nodes, in their attempts, from
its submission to the next submission of its id; and what a question about output may carry.

A node agent may write any job's subjects under its own node (NATS cannot tell a job from
another), and a job id is free again once its job was let go, while the output stream keeps a
week: without the scope an agent could make up a job's output, and a tenant given a reused id
would read the output of the job that had it before.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

import pytest

from corral.services.query.decide import Ask, BadAsk, OutputScope, output_scope, parse_ask
from corral.services.query.service import (
    PAGE_BYTES,
    ReadingSlots,
    _first_lines,
    _last_lines,
    _Tail,
)
from corral.services.query.view import JobView
from corral.services.runtime import output
from tests.builders import Cluster, LogBuilder, job, on, placement, whole, worker

N0, N1 = "node-00", "node-01"


def reused() -> tuple[LogBuilder, float, float]:
    """Tenant a's gang ``x`` ran on both nodes, in two attempts, and was let go; tenant b then got
    the id ``x`` for a job on node-01. The submission times of the two (their runs: ``runs``)."""
    log = LogBuilder().nodes(Cluster(2)).retention(0.0).queue("team-a")
    a_at = log.time
    log.submit("a", "x", job().gpus(1).replicas(2).restarts(1)).accept("x").admit("x", replicas=2)
    log.place(placement("x", worker(0, N0, whole(0)), worker(1, N1, whole(0))))
    log.started(N0, "x", rank=0).started(N1, "x", rank=1)
    log.exited(N0, "x", rank=0, code=1).exited(N1, "x", rank=1, code=0, stopped=True)
    log.requeue("x", attempt=0).admit("x", attempt=1, replicas=2)
    log.place(placement("x", worker(0, N1, whole(1)), worker(1, N1, whole(2)), attempt=1))
    log.started(N1, "x", rank=0, attempt=1).started(N1, "x", rank=1, attempt=1)
    log.exited(N1, "x", rank=0, attempt=1).exited(N1, "x", rank=1, attempt=1)
    log.cordon(N0, False)  # let go before this record (a retention of 0)
    b_at = log.time
    log.submit("b", "x", job().gpus(1)).accept("x").admit("x")
    log.place(on(N1, 3, job_id="x"))
    return log, a_at, b_at


def runs() -> tuple[int, int]:
    """The runs of a's ``x`` and b's: the log positions of their submissions."""
    log, _, _ = reused()
    submits = [r.seq for r in log.records if r.subject.endswith(".submit")]
    assert len(submits) == 2
    return submits[0], submits[1]


@pytest.fixture
def view() -> JobView:
    log, _, _ = reused()
    v = JobView(":memory:")
    v.fold(log.records)
    return v


def test_a_job_is_its_placed_workers_from_its_submission(view: JobView) -> None:
    _, _, b_at = reused()
    assert view.state.jobs["x"].tenant == "b"
    _, b_run = runs()
    assert view.state.jobs["x"].submitted_seq == b_run
    scope = output_scope(view.state, "b", Ask(job="x"), view.placed, view)
    assert scope == OutputScope(frozenset({(N1, 0, 0)}), b_run, b_at, math.inf)
    assert scope.shows(N1, 0, 0, b_at + 5)
    assert not scope.shows(N0, 0, 0, b_at + 5), "a node it never ran on"
    assert not scope.shows(N1, 1, 0, b_at + 5), "an attempt it never had"
    assert not scope.shows(N1, 0, 1, b_at + 5), "a rank it never had"
    assert not scope.shows(N1, 0, 0, b_at - 1), "the job that had its id before"


def test_a_job_let_go_is_read_up_to_the_next_of_its_id(view: JobView) -> None:
    _, a_at, b_at = reused()
    scope = output_scope(view.state, "a", Ask(job="x"), view.placed, view)
    assert isinstance(scope, OutputScope)
    assert scope.workers == {(N0, 0, 0), (N1, 0, 1), (N1, 1, 0), (N1, 1, 1)}
    assert (scope.run, scope.since, scope.until) == (runs()[0], a_at, b_at)
    assert scope.shows(N1, 0, 1, b_at - 1) and not scope.shows(N1, 0, 1, b_at)
    # the admin reads the newest: b's
    told = output_scope(view.state, "admin", Ask(job="x"), view.placed, view)
    assert isinstance(told, OutputScope) and (told.run, told.since) == (runs()[1], b_at)
    assert isinstance(output_scope(view.state, "c", Ask(job="x"), view.placed, view), dict)


@pytest.mark.parametrize(
    "subject",
    [
        "corral.out.n.j.4.\u00b2.0",  # a digit to isdigit, not to int
        "corral.out.n.j.4.\u0661.0",  # an Arabic-Indic one: int reads it as 1
        "corral.out.n.j.\u0661.0.0",
        "corral.out.n.j.4.01.0",
        "corral.out.n.j.04.1.0",
        "corral.out.n.j.4.0.-1",
        "corral.out.n.j.4.0.1.2",
        "corral.out.n.j.4.0." + "9" * 19,
        "corral.out.n.j.0.0",  # no run: as older agents wrote
    ],
)
def test_a_subject_with_odd_numbers_is_no_workers(subject: str) -> None:
    assert output.parse(subject) is None


@pytest.mark.parametrize("field", ["rank", "tail", "cursor", "after"])
def test_numbers_past_64_bits_are_an_unreadable_question(field: str) -> None:
    with pytest.raises(BadAsk):
        parse_ask(b'{"job": "x", "%s": 18446744073709551615}' % field.encode())


def test_what_an_agent_not_corrals_own_left_in_a_line_is_not_sent_to_a_terminal() -> None:
    assert output.shown("a\x1b[2Jb\x00\x9b") == "a\\x1b[2Jb\\x00\\x9b"


def test_a_tail_taken_from_the_newest_back_holds_the_newest_lines_that_fit_one_answer() -> None:
    """However many workers and lines a tail is offered, newest first, it stops once the next
    line would not fit one answer, and answers its lines in the order stored."""
    tail = _Tail(2**63 - 1)
    line = "y" * 1000 + "\n"
    offered = 0
    for seq in range(2000, 0, -1):
        if tail.full:
            break
        tail.add(output.Source(f"node-{seq % 7}", "x", 4, 0, seq % 13), f"{seq}:" + line * 20)
        offered += 1
    assert tail.full and offered < 20  # a dozen messages fill it: nothing older is asked for
    lines = tail.lines()
    assert sum(len(json.dumps(row, separators=(",", ":"))) + 1 for row in lines) <= PAGE_BYTES
    assert lines[-1][3] == "y" * 1000 and lines[-20][3] == "2000:" + "y" * 1000


def test_a_tail_keeps_each_workers_last_lines_and_says_when_it_has_them_all() -> None:
    a, b = output.Source("n", "x", 4, 0, 0), output.Source("n", "x", 4, 0, 1)
    tail = _Tail(2)
    tail.add(a, "a3\na4\n")  # newest first
    tail.add(b, "b1\nb2\nb3\n")
    assert not tail.complete([("n", 0, 0), ("n", 0, 1), ("n", 0, 2)])
    tail.add(a, "a1\na2\n")  # older than a's two: none taken
    assert tail.complete([("n", 0, 0), ("n", 0, 1)]) and not tail.complete(None)
    assert [row[3] for row in tail.lines()] == ["b2", "b3", "a3", "a4"]


def test_a_message_of_bare_newlines_is_split_only_as_far_as_one_answer_shows() -> None:
    text = "\n" * 65536
    first, count = _first_lines(text, 100)
    assert first == [""] * 100 and count == 65536
    assert _last_lines(text, 3) == ["", "", ""]
    assert _first_lines("a\nb", 10) == (["a", "b"], 2) and _first_lines("", 10) == ([], 0)
    assert _last_lines("a\nb\n", 5) == ["a", "b"] and _last_lines("\n", 1) == [""]
    tail = _Tail(2**63 - 1)
    tail.add(output.Source("n", "x", 4, 0, 0), text)
    assert tail.full and 0 < len(tail.lines()) < PAGE_BYTES // 12


async def test_one_asker_holds_at_most_its_share_of_the_reading_slots() -> None:
    slots = ReadingSlots(in_all=8, per_asker=2)
    held = asyncio.Event()
    release = asyncio.Event()
    inside: list[str] = []

    async def read(asker: str) -> None:
        async with slots.held(asker):
            inside.append(asker)
            held.set()
            await release.wait()

    flood = [asyncio.create_task(read("a")) for _ in range(8)]
    await held.wait()
    for _ in range(5):
        await asyncio.sleep(0)  # every one of a's reads that may start has
    assert inside == ["a", "a"]
    b = asyncio.create_task(read("b"))
    await asyncio.wait_for(_until(lambda: "b" in inside), 5.0)  # b's read starts, a's flood aside
    release.set()
    await asyncio.wait_for(asyncio.gather(*flood, b), 5.0)
    assert inside.count("a") == 8 and not slots._of  # nothing kept of askers done reading


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0)
