"""The cluster's figures the read service exports: every series stays, at 0 when there is
nothing to count, so that a graph falls to 0 rather than stopping at its last value."""

from __future__ import annotations

from corral.services.query.figures import cluster_figures
from tests.builders import Cluster, LogBuilder, job, on


def test_fragmentation_falls_to_zero_when_the_last_job_ends() -> None:
    lb = LogBuilder().queue("team-a").nodes(Cluster(1))
    lb.submit("team-a", "a", job().gpus(3)).accept("a").admit("a")
    lb.place(on("node-00", 0, 1, 2, job_id="a")).started("node-00", "a")
    lb.submit("team-a", "b", job().gpus(7)).accept("b")  # 7 GPUs wanted, 5 free: stranded
    state = lb.fold()
    ((stranded, model),) = cluster_figures(state)["corral.cluster.gpus.fragmented"]
    assert stranded > 0 and model == {"corral.gpu.model": "H100-80GB"}
    lb.request("team-a", "cancel", {"job_id": "b"}).exited("node-00", "a", code=0)
    state = lb.fold()
    assert (state.jobs["a"].phase, state.jobs["b"].phase) == ("succeeded", "cancelled")
    assert cluster_figures(state)["corral.cluster.gpus.fragmented"] == [
        (0.0, {"corral.gpu.model": "H100-80GB"})
    ]
