"""What the metrics count of a log: only what the fold accepted, timed in log time."""

from __future__ import annotations

import re

import pytest

from corral.events import subjects as subj
from corral.events.decisions import PreemptionRequested, Victim
from corral.projections.fold import apply
from corral.projections.state import State
from corral.services.runtime import metrics
from tests.builders import Cluster, LogBuilder, job, on


def exported(lb: LogBuilder, start: int = 0) -> tuple[State, str]:
    """The state ``lb``'s log folds to, and what the metrics of it read, as Prometheus reads them:
    watched from its ``start``-th record, as by a read service started from a snapshot there."""
    telemetry = metrics.Telemetry(otlp=False)
    watch = metrics.FoldWatch(telemetry)
    state = State()
    for record in lb.records[:start]:
        apply(state, record)
    for record in lb.records[start:]:
        seen = watch.before(state, record)
        apply(state, record)
        watch.after(state, record, seen)
    return state, telemetry.prometheus_text().decode()


def counted(lb: LogBuilder, start: int = 0) -> tuple[State, dict[str, float]]:
    state, text = exported(lb, start)
    figures: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("corral_job_"):
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            figures[name] = figures.get(name, 0.0) + value
    return state, figures


def test_a_voided_placement_counts_for_nothing_and_waits_run_from_the_queue() -> None:
    lb = LogBuilder().queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "a", job().gpus(8)).submit("team-a", "b", job().gpus(8))
    lb.at(1990.0).accept("a").accept("b").at(2000.0).admit("a", "b")
    lb.at(2010.0).place(on("node-00", *range(8), job_id="a"))
    lb.place(on("node-00", *range(8), job_id="b"))  # the same GPUs: the fold voids it
    state, got = counted(lb)
    assert (state.jobs["a"].phase, state.jobs["b"].phase) == ("placed", "admitted")
    assert got["corral_job_admission_duration_seconds_count"] == 2
    assert got["corral_job_placement_duration_seconds_count"] == 1
    # From a's acceptance into its queue (1990), not from its admission (2000).
    assert got["corral_job_placement_duration_seconds_sum"] == 2010.0 - 1990.0
    assert got["corral_job_admission_duration_seconds_sum"] == (2000.0 - 1990.0) + (2000.0 - 1991.0)


def test_a_job_withdrawn_for_its_placement_timeout_waits_on_from_when_it_entered_the_queue() -> None:
    lb = LogBuilder(start_time=900.0).queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "a", job().gpus(8)).at(1000.0).accept("a").at(1010.0).admit("a")
    lb.at(1310.0).withdraw("a", admit_after=1320.0).at(1320.0).admit("a")
    lb.at(1330.0).place(on("node-00", *range(8), job_id="a"))
    state, got = counted(lb)
    assert state.jobs["a"].phase == "placed"
    assert got["corral_job_placement_duration_seconds_count"] == 1
    # Placed 330 s after it was queued, not 20 s after it was admitted again.
    assert got["corral_job_placement_duration_seconds_sum"] == 1330.0 - 1000.0
    assert got["corral_job_admission_duration_seconds_sum"] == (1010.0 - 1000.0) + (1320.0 - 1310.0)


def test_a_watch_started_from_a_snapshot_leaves_out_the_waits_it_did_not_see_start() -> None:
    """A job admitted before the snapshot entered its queue at a time the state does not keep:
    its time to place is left out, never counted from its admission; a job queued after it is
    counted as the fold of the whole log counts it."""
    lb = LogBuilder(start_time=900.0).queue("team-a").nodes(Cluster(2))
    lb.submit("team-a", "a", job().gpus(8)).at(1000.0).accept("a").at(1010.0).admit("a")
    snapshot = len(lb.records)
    lb.at(1030.0).place(on("node-00", *range(8), job_id="a"))
    lb.submit("team-a", "b", job().gpus(8)).at(1040.0).accept("b").at(1050.0).admit("b")
    lb.at(1060.0).place(on("node-01", *range(8), job_id="b"))
    whole_log, got = counted(lb)
    from_snapshot, since = counted(lb, snapshot)
    assert whole_log == from_snapshot
    assert got["corral_job_placement_duration_seconds_count"] == 2
    assert got["corral_job_placement_duration_seconds_sum"] == (1030.0 - 1000.0) + (1060.0 - 1040.0)
    assert since["corral_job_placement_duration_seconds_count"] == 1
    assert since["corral_job_placement_duration_seconds_sum"] == 1060.0 - 1040.0


def test_a_watch_started_from_a_snapshot_leaves_out_a_wait_withdrawn_before_it() -> None:
    """Withdrawn before the snapshot and admitted again after it, a job's wait began before the
    withdrawal the state no longer shows: left out, not counted from the withdrawal."""
    lb = LogBuilder(start_time=900.0).queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "a", job().gpus(8)).at(1000.0).accept("a").at(1010.0).admit("a")
    lb.at(1310.0).withdraw("a", admit_after=1320.0)
    snapshot = len(lb.records)
    lb.at(1320.0).admit("a").at(1330.0).place(on("node-00", *range(8), job_id="a"))
    _, got = counted(lb)
    _, since = counted(lb, snapshot)
    assert got["corral_job_placement_duration_seconds_sum"] == 1330.0 - 1000.0
    assert since["corral_job_admission_duration_seconds_sum"] == 1320.0 - 1310.0  # the state's
    assert since.get("corral_job_placement_duration_seconds_count", 0) == 0


def test_a_preemption_counts_its_reason_and_the_work_lost_since_the_checkpoint() -> None:
    lb = LogBuilder().queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "low", job().gpus(8)).accept("low", priority=1).admit("low")
    lb.place(on("node-00", *range(8), job_id="low")).at(3000.0).started("node-00", "low")
    lb.at(3600.0).checkpoint("node-00", "low", step=100)
    lb.submit("team-a", "high", job().gpus(8)).accept("high", priority=100)
    lb.at(5400.0).preempt("high", "low")
    state, got = counted(lb)
    assert state.jobs["low"].preemptions == 1
    assert got["corral_job_preemptions_total"] == 1
    # What it loses is known once it stops.
    assert "corral_job_preemption_lost_gpu_time_hours_total" not in got
    lb.at(5760.0).exited("node-00", "low", code=143, stopped=True)
    state, got = counted(lb)
    assert state.jobs["low"].phase == "preempted"
    # 8 GPUs from the checkpoint at log time 3600 to its stop at 5760, saving nothing meanwhile.
    assert got["corral_job_preemption_lost_gpu_time_hours_total"] == pytest.approx(8 * 0.6)


def test_a_victim_that_checkpoints_when_asked_loses_only_the_work_after_that_checkpoint() -> None:
    lb = LogBuilder().queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "low", job().gpus(8).checkpointable()).accept("low", priority=1).admit("low")
    lb.place(on("node-00", *range(8), job_id="low")).at(3000.0).started("node-00", "low")
    lb.at(3600.0).checkpoint("node-00", "low", step=100)
    lb.submit("team-a", "high", job().gpus(8)).accept("high", priority=100)
    lb.at(7200.0).preempt("high", "low")
    lb.at(7236.0).checkpoint("node-00", "low", step=200)
    lb.at(7272.0).exited("node-00", "low", code=0, stopped=True)
    state, got = counted(lb)
    assert state.jobs["low"].phase == "preempted"
    assert got["corral_job_preemptions_total"] == 1
    # Not the hour since step 100 the request found unsaved: step 200 saved it; 8 GPUs for the
    # 36 s from step 200 to its stop are lost.
    assert got["corral_job_preemption_lost_gpu_time_hours_total"] == pytest.approx(8 * 36 / 3600)


def test_a_job_moved_to_make_room_counts_as_a_move_not_a_stop() -> None:
    # On node-00, a1 holds GPUs 0-3 and a2 4-5; on node-01, a3 holds 0-5: b1 (4 GPUs) fits on
    # node-00 once a2 moves to node-01's free GPUs 6-7.
    lb = LogBuilder().queues("a", "b").nodes(Cluster(2))
    for name, gpus, node, at in (("a1", 4, "node-00", 0), ("a2", 2, "node-00", 4), ("a3", 6, "node-01", 0)):
        lb.submit("a", name, job("a").gpus(gpus)).accept(name).admit(name)
        lb.place(on(node, *range(at, at + gpus), job_id=name)).started(node, name)
    lb.submit("b", "b1", job("b").gpus(4)).accept("b1").admit("b1")
    lb.at(lb.time + 3600)
    b1_there, a2_there = on("node-00", 4, 5, 6, 7, job_id="b1"), on("node-01", 6, 7, job_id="a2")
    body = PreemptionRequested(
        based_on=lb.last_seq,
        now=lb.time,
        beneficiary="b1",
        victims=(Victim("a2", 0),),
        deadline=lb.time + 30,
        moves=(b1_there, a2_there),
    )
    lb.event(subj.decision("preemptor"), body)
    state, text = exported(lb)
    assert state.jobs["a2"].phase == "checkpointing"
    kind = r'corral_job_preemptions_total\{[^}]*corral_preemption_kind="(\w+)"[^}]*\} (\S+)'
    counts = re.findall(kind, text)
    # Moved to make room, as consolidation does: not stopped for a higher priority or for quota.
    assert counts == [("move", "1.0")]
