"""The read service's view of the jobs the fold let go stays bounded, per tenant and in all.

It kept every job let go, about 4 KiB each (a full history, far more), so a cluster letting
100,000 jobs a day go grew the read service's file by about 420 MB a day until it restarted.
Each case folds a log of jobs let go at once (retention 0) of two tenants through the real
``JobView`` with small bounds, and asks the read service's ``answer`` as a tenant would: the
oldest let go go first, one tenant's churn takes none of the other's, a job still kept is
listed and explained, and one no longer kept is told so to its owner only.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events.jobs import CancelJob
from corral.projections.fold import apply
from corral.projections.state import State
from corral.services.query.decide import Ask, answer, output_scope
from corral.services.query.view import JobView
from tests.builders import Cluster, LogBuilder, job


def let_go(log: LogBuilder, tenant: str, job_id: str) -> int:
    """Submit, accept and cancel a job: with retention 0 the next record lets it go. Returns
    the position of its submit."""
    at = log.submit(tenant, job_id, job()).last_seq
    log.accept(job_id)
    log.request(tenant, "cancel", CancelJob(job_id=job_id, reason="done"))
    return at


def churn_log(quiet: int, churn: int) -> LogBuilder:
    """``quiet`` of tenant q's jobs let go first, then ``churn`` of tenant c's."""
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    for i in range(quiet):
        let_go(log, "q", f"q{i}")
    for i in range(churn):
        let_go(log, "c", f"c{i}")
    log.cordon("node-00", False)  # the last one let go too
    return log


def kept(view: JobView) -> dict[str, list[str]]:
    """Each tenant's jobs the view keeps, oldest let go first."""
    out: dict[str, list[str]] = {}
    for tenant, job_id in view.db.execute("SELECT tenant, id FROM let_go ORDER BY let_go_seq, submitted_seq"):
        out.setdefault(tenant, []).append(job_id)
    (workers,) = view.db.execute("SELECT count(*) FROM let_go_workers").fetchone()
    assert workers == sum(map(len, out.values()))  # each job's workers go with it
    return out


def ask(view: JobView, asker: str, question: str, **kw: Any) -> dict[str, Any]:
    return answer(view.state, view.history, asker, question, Ask(**kw), view)


def test_one_tenants_churn_pushes_out_its_own_oldest_not_another_tenants() -> None:
    view = JobView(":memory:", per_tenant=10, in_all=14)
    statements: list[str] = []
    view.db.set_trace_callback(statements.append)
    view.fold(churn_log(quiet=5, churn=60).records)
    view.db.set_trace_callback(None)
    assert not view.state.jobs
    held = kept(view)
    # c at most 10 of its own; 15 in all is past 14, and c has the most: its oldest goes again
    assert held == {"q": [f"q{i}" for i in range(5)], "c": [f"c{i}" for i in range(51, 60)]}
    # Letting jobs go out looks them up by index: no statement scans the table.
    for sql in statements:
        if sql.lstrip().upper().startswith(("SELECT", "DELETE")):
            plan = " ".join(str(row[-1]) for row in view.db.execute("EXPLAIN QUERY PLAN " + sql))
            assert "SCAN let_go" not in plan, (sql, plan)


def test_past_the_bound_in_all_the_tenant_holding_the_most_loses_its_oldest() -> None:
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    for i in range(30):  # interleaved: a let go more often than b
        let_go(log, "a", f"a{i}")
        if i % 3 == 0:
            let_go(log, "b", f"b{i}")
    log.cordon("node-00", False)
    view = JobView(":memory:", per_tenant=100, in_all=12)
    for rec in log.records:  # one record a batch, as a service following the log folds them
        view.fold([rec])
    held = kept(view)
    assert sum(map(len, held.values())) == 12
    assert held == {"a": [f"a{i}" for i in range(24, 30)], "b": [f"b{i}" for i in range(12, 30, 3)]}


def test_a_kept_old_job_is_listed_and_explained() -> None:
    view = JobView(":memory:", per_tenant=10, in_all=14)
    view.fold(churn_log(quiet=5, churn=60).records)
    listed = ask(view, "q", "jobs", all=True)
    assert [row["id"] for row in listed["jobs"]] == [f"q{i}" for i in range(5)]
    assert listed["more_let_go"] == 0
    told = ask(view, "q", "explain", job="q0")
    assert told["job"]["id"] == "q0" and "let go from the cluster's state" in told["text"]
    listed = ask(view, "c", "jobs", all=True)
    assert [row["id"] for row in listed["jobs"]] == [f"c{i}" for i in range(51, 60)]
    assert ask(view, "admin", "jobs", all=True)["more_let_go"] == 0


def test_a_job_no_longer_kept_is_told_so_to_its_owner_and_no_one_else() -> None:
    log = churn_log(quiet=5, churn=60)
    view = JobView(":memory:", per_tenant=10, in_all=14)
    view.fold(log.records)
    told = ask(view, "c", "explain", job="c0")["error"]
    assert told.startswith("no job c0 ") and "it no longer keeps 51 of your jobs" in told
    assert "older than the read service keeps, and the log has it" in told
    # q lost nothing: c's id, kept or not, is no job of q's, as one never used
    assert ask(view, "q", "explain", job="c0") == {"seq": view.state.seq, "error": "no job c0"}
    assert ask(view, "q", "explain", job="c59") == {"seq": view.state.seq, "error": "no job c59"}
    assert "it no longer keeps 51 jobs" in ask(view, "admin", "explain", job="c0")["error"]
    scope = output_scope(view.state, "c", Ask("c0"), view.placed, view)
    assert isinstance(scope, dict) and "older than the read service keeps" in scope["error"]


def test_the_verdict_on_a_submit_whose_job_is_no_longer_kept_is_unknown() -> None:
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    first = let_go(log, "a", "a0")
    for i in range(1, 5):
        let_go(log, "a", f"a{i}")
    log.cordon("node-00", False)
    view = JobView(":memory:", per_tenant=2, in_all=10)
    view.fold(log.records)
    got = ask(view, "a", "verdict", job="a0", after=first, verb="submit")
    assert got["verdict"] == "unknown" and "no longer kept" in got["reason"], got


def test_the_file_stops_growing_once_at_the_bound(tmp_path: Path) -> None:
    path = str(tmp_path / "view.sqlite")
    view = JobView(path, per_tenant=40, in_all=60)
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    view.fold(log.records)
    pages: list[int] = []
    for r in range(8):
        done = len(log.records)
        for i in range(40):
            let_go(log, "c" if i % 4 else "q", f"j{r}-{i}")
        view.fold(log.records[done:])
        (count,) = view.db.execute("PRAGMA page_count").fetchone()
        pages.append(count)
    held = kept(view)
    assert (len(held["c"]), len(held["q"])) == (30, 30)  # q kept as much as c, at last
    assert len(set(pages[3:])) == 1, pages  # the pages freed are used again
    view.close()


def test_a_file_given_is_counted_and_held_to_the_bounds_it_is_opened_with(tmp_path: Path) -> None:
    path = str(tmp_path / "view.sqlite")
    log = churn_log(quiet=5, churn=20)
    view = JobView(path, per_tenant=100, in_all=100)
    view.fold(log.records[:-1])
    view.close()
    view = JobView(path, per_tenant=10, in_all=100)
    view.fold(log.records)  # folded again from the start, as the read service does
    assert kept(view) == {"q": [f"q{i}" for i in range(5)], "c": [f"c{i}" for i in range(10, 20)]}
    assert ask(view, "c", "jobs", all=True)["more_let_go"] == 0
    view.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM let_go").fetchone() == (15,)


def test_a_file_opened_again_counts_the_jobs_dropped_once(tmp_path: Path) -> None:
    # Folded again from its start, the jobs dropped before came and went again: the owner was
    # told twice as many were no longer kept.
    path = str(tmp_path / "view.sqlite")
    log = churn_log(quiet=0, churn=20)
    for _ in range(2):
        view = JobView(path, per_tenant=10, in_all=100)
        view.fold(log.records)
        told = ask(view, "c", "explain", job="c0")["error"]
        assert "no longer keeps 10 of your jobs" in told, told
        assert view.kept_total == 10
        view.close()


def test_a_file_opened_again_with_lower_bounds_counts_each_job_dropped_once(tmp_path: Path) -> None:
    # Opened again with lower bounds, the rows a fold before kept were dropped at the first
    # batch, then came again as the log was folded from its start, and were counted again.
    path = str(tmp_path / "view.sqlite")
    log = churn_log(quiet=0, churn=20)
    view = JobView(path, per_tenant=100, in_all=100)
    view.fold(log.records)
    view.close()
    view = JobView(path, per_tenant=10, in_all=100)
    for record in log.records:  # a batch at a time, as the read service folds
        view.fold([record])
    assert kept(view) == {"c": [f"c{i}" for i in range(10, 20)]}
    told = ask(view, "c", "explain", job="c0")["error"]
    assert "no longer keeps 10 of your jobs" in told, told


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=40),
    st.integers(1, 6),
    st.integers(1, 12),
    st.integers(1, 5),
)
def test_the_view_keeps_what_dropping_the_oldest_of_whoever_holds_the_most_keeps(
    owners: list[str], per_tenant: int, in_all: int, batch: int
) -> None:
    # Who holds the most is kept as a heap of each tenant's count as it last moved, not found
    # by a look at every tenant each batch: it must drop exactly what that look would.
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    for i, tenant in enumerate(owners):
        let_go(log, tenant, f"{tenant}{i}")
    log.cordon("node-00", False)  # the last one let go too
    # Which jobs each record lets go, from a fold record by record.
    state, let_go_at = State(), []
    for record in log.records:
        before = set(state.jobs)
        apply(state, record)
        let_go_at.append(sorted(before - set(state.jobs), key=lambda j: int(j[1:])))
    view = JobView(":memory:", per_tenant=per_tenant, in_all=in_all)
    model: dict[str, list[str]] = {}
    for start in range(0, len(log.records), batch):
        view.fold(log.records[start : start + batch])
        for job_id in (j for gone in let_go_at[start : start + batch] for j in gone):
            model.setdefault(job_id[0], []).append(job_id)
        for jobs in model.values():
            del jobs[: max(0, len(jobs) - per_tenant)]
        while sum(map(len, model.values())) > in_all:
            most = min(model, key=lambda t: (-len(model[t]), t))
            model[most].pop(0)
        assert kept(view) == {t: jobs for t, jobs in model.items() if jobs}


def test_the_counts_of_jobs_no_longer_kept_stay_bounded_however_many_tenants() -> None:
    # Without logins any name is a tenant: one job under each new name, let go past the bound
    # in all, was a row of the counts of jobs no longer kept, each for good.
    log = LogBuilder().nodes(Cluster(1)).retention(0.0).queue("team-a")
    tenants = [f"t{i}" for i in range(2_000)]
    for t in tenants:
        let_go(log, t, f"{t}-job")
    log.cordon("node-00", False)
    view = JobView(":memory:", per_tenant=10, in_all=5, dropped_kept=16)
    view.fold(log.records)
    (rows,) = view.db.execute("SELECT count(*) FROM let_go_dropped").fetchone()
    assert rows <= 17  # the latest 16 tenants' own, and no tenant's
    assert ask(view, "admin", "explain", job="t0-job")["error"].count("no longer keeps 1995 jobs") == 1
    # A tenant whose own count went is told its job may be among those no longer kept; one
    # whose count is kept, how many of its own.
    told = ask(view, "t0", "explain", job="t0-job")["error"]
    assert "may no longer keep some of your jobs" in told and "the log has it" in told, told
    assert "no longer keeps 1 of your jobs" in ask(view, "t1994", "explain", job="t1994-job")["error"]
