"""The inventory check agrees with the placer, over random clusters and random jobs.

On an empty cluster (every GPU free and healthy, no node cordoned, some nodes maybe lost), a job
the check accepts is placed by the placer's own cycle (``services.placer.decide``) as soon as it
is admitted, and a job the check refuses is not; a refusal always says why. Jobs range past what
the nodes have: more GPUs, CPU or memory per worker, models and MIG profiles no node has, node
selectors no node matches, and gangs larger than any island, node, rack or the whole cluster.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from corral.events import subjects
from corral.events.decisions import JobsPlaced
from corral.events.jobs import Admission, JobsAdmitted, JobSpec, Resources, Topology
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.projections import quota
from corral.projections.placement.inventory import CODE, never_fits
from corral.services.agent.inventory import PROFILES
from corral.services.placer.decide import decide
from tests.builders import TRAIN, Cluster, LogBuilder

QUEUE = QueueSpec("team-a", quotas={quota.ANY: Quota(1_000_000)})
MODELS = [(), (), (), (), ("H100-80GB",), ("A100-80GB", "T4"), ("A100-40GB",), ("B200",)]
MIG_PROFILES = ["1g.10gb", "3g.40gb", "7g.80gb", "1g.5gb"]


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    kind = draw(st.sampled_from(["whole", "whole", "whole", "share", "mig", "cpu"]))
    # Mostly what nodes have, now and then more than any has.
    cpu = draw(st.sampled_from([1000, 1000, 1000, 32_000, 32_000, 200_000, 300_000]))
    mem = draw(st.sampled_from([1024, 1024, 1024, 131_072, 3 * 1024 * 1024]))
    models = draw(st.sampled_from(MODELS))
    if kind == "whole":
        gpus = draw(st.sampled_from([1, 2, 4, 8, 16]))
        res = Resources(gpus=gpus, cpu_milli=cpu, memory_mib=mem, gpu_models=models)
    elif kind == "share":
        res = Resources(gpus=1, gpu_milli=500, cpu_milli=cpu, memory_mib=mem, gpu_models=models)
    elif kind == "mig":
        res = Resources(gpus=1, mig=draw(st.sampled_from(MIG_PROFILES)), cpu_milli=cpu, memory_mib=mem)
    else:
        res = Resources(gpus=0, cpu_milli=cpu, memory_mib=mem)
    pack = draw(st.sampled_from(["none", "none", "nvlink", "node", "rack", "spread"]))
    selector = draw(
        st.sampled_from([{}, {}, {}, {}, {}, {"rack": "rack-1"}, {"profile": "t4-2x"}, {"pool": "x"}])
    )
    return JobSpec(
        queue="team-a",
        replicas=draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4, 6])),
        resources=res,
        topology=Topology(pack, draw(st.booleans())),  # type: ignore[arg-type]
        node_selector=selector,
        command=TRAIN,
    )


@st.composite
def clusters(draw: st.DrawFn) -> LogBuilder:
    log = LogBuilder().admin("queue", ApplyQueue(queue=QUEUE))
    profiles = draw(st.lists(st.sampled_from(sorted(PROFILES)), min_size=1, max_size=5))
    for i, profile in enumerate(profiles):
        for name, inv in Cluster(1, profile, prefix=f"n{i}").nodes:
            log.node(name, msgspec.structs.replace(inv, labels={**inv.labels, "rack": f"rack-{i % 2}"}))
            if i and draw(st.integers(0, 4)) == 0:
                log.condition(name, "lost")  # left: neither the check nor the placer counts it
    return log


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), specs())
def test_the_check_accepts_what_the_placer_places_on_an_empty_cluster(log: LogBuilder, spec: JobSpec) -> None:
    log.submit("alice", "j", spec).accept("j")
    gpus = quota.admission_gpus(quota.ANY, quota.worker_milli(spec.resources) * spec.replicas)
    admitted = JobsAdmitted(
        based_on=log.last_seq, now=2000.0, admissions=(Admission("j", 0, spec.replicas, gpus),)
    )
    log.event(subjects.decision("admission"), admitted)
    state = log.fold()
    assert state.jobs["j"].phase == "admitted", state.rejections[-1:]
    why = never_fits(state, state.jobs["j"])
    placed = any(isinstance(e, JobsPlaced) for e in decide(state, 2000.0))
    event("placed" if placed else f"refused: {why.message.split(';')[0][:40] if why else '?'}")
    assert placed == (why is None), why
    if why is not None:
        assert why.code == CODE and why.message and not why.preemption_helps
