"""What the metrics count of a log: only what the fold accepted, timed in log time."""

from __future__ import annotations

import pytest

from corral.projections.fold import apply
from corral.projections.state import State
from corral.services.runtime import metrics
from tests.builders import Cluster, LogBuilder, job, on


def counted(lb: LogBuilder) -> tuple[State, dict[str, float]]:
    telemetry = metrics.Telemetry(otlp=False)
    watch = metrics.FoldWatch(telemetry)
    state = State()
    for record in lb.records:
        seen = watch.before(state, record)
        apply(state, record)
        watch.after(state, record, seen)
    figures: dict[str, float] = {}
    for line in telemetry.prometheus_text().decode().splitlines():
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
    lb = LogBuilder().queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "a", job().gpus(8)).at(1000.0).accept("a").at(1010.0).admit("a")
    lb.at(1310.0).withdraw("a", admit_after=1320.0).at(1320.0).admit("a")
    lb.at(1330.0).place(on("node-00", *range(8), job_id="a"))
    state, got = counted(lb)
    assert state.jobs["a"].phase == "placed"
    assert got["corral_job_placement_duration_seconds_count"] == 1
    # Placed 330 s after it was queued, not 20 s after it was admitted again.
    assert got["corral_job_placement_duration_seconds_sum"] == 1330.0 - 1000.0
    assert got["corral_job_admission_duration_seconds_sum"] == (1010.0 - 1000.0) + (1320.0 - 1310.0)


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
