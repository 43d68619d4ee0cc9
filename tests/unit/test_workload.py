"""The synthetic workload every fold benchmark and several properties fold
(``bench.workload.synthetic_log``): it always comes to the length asked."""

from __future__ import annotations

from bench.workload import synthetic_log
from corral.events import codec
from corral.events.jobs import CancelJob


def test_a_jammed_cluster_has_its_waiting_jobs_cancelled_and_the_log_goes_on() -> None:
    # Seed 2956 on 8 nodes: at some point nothing runs and what waits can never be admitted or
    # placed; the generator looped for ever. Its owners cancel what waits, and it goes on.
    log = synthetic_log(3_000, seed=2956, nodes=8)
    assert len(log) == 3_000
    cancels = [a for a in log if a.subject.endswith(".cancel")]
    assert cancels and all(isinstance(codec.decode_request("cancel", a.data), CancelJob) for a in cancels)
