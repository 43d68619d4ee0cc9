"""The health monitor visits, each tick, only the nodes that may have a fact to state
(``HeartbeatTracker.evaluate``): over random runs of registrations, heartbeats (late, missing,
not ok, with bad counters, lost GPUs and XIDs), facts from the log, cordons and clears, it states
exactly what visiting every node states, tick by tick."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.events.base import Event
from corral.events.heartbeats import GpuHealthSample, Heartbeat, XidReport
from corral.events.nodes import GpuHealthChanged, NodeConditionChanged, NodeCordoned, NodeRegistered
from corral.services.agent.inventory import cluster
from corral.services.health.decide import HeartbeatTracker

NODES = dict(cluster(4, "h100-8x"))
NAMES = sorted(NODES)
LATE = NAMES[-1]  # heartbeats before it is registered, if ever


def _sample(node: str, gpu: int, bad: str) -> GpuHealthSample:
    info = NODES[node].gpus[gpu]
    fields: dict[str, object] = {"index": gpu, "uuid": info.uuid, "nvlinks_active": info.nvlinks}
    if bad == "ecc":
        fields["ecc_uncorrected"] = 1
    elif bad == "lost":
        fields["lost"] = True
    elif bad == "links":
        fields["nvlinks_active"] = 0
    return GpuHealthSample(**fields)  # type: ignore[arg-type]


node = st.sampled_from(NAMES)
gpu = st.integers(0, 1)  # few, so that a clear finds the GPU an XID marked
steps = st.one_of(
    st.tuples(st.just("register"), node),
    st.tuples(
        st.just("beat"),
        node,
        st.booleans(),  # ok
        st.lists(st.tuples(gpu, st.sampled_from(["", "", "ecc", "lost", "links"])), max_size=2),
        st.lists(st.tuples(st.integers(-1, 1), st.sampled_from([13, 48, 63, 79, 92])), max_size=1),
    ),
    st.tuples(st.just("fact"), node, st.sampled_from(["ready", "suspect", "lost"]), gpu, st.booleans()),
    st.tuples(st.just("cordon"), node, st.booleans()),
    st.tuples(st.just("clear"), node, gpu),
)


def _apply(t: HeartbeatTracker, step: tuple[object, ...], now: float, seq: dict[str, int]) -> None:
    kind, *args = step
    if kind == "register":
        (name,) = args
        t.observe(NodeRegistered(node=name, inventory=NODES[name]), now)  # type: ignore[arg-type]
    elif kind == "beat":
        name, ok, bad, xids = args
        seq[name] = seq.get(name, 0) + 1  # type: ignore[index]
        bad_by_gpu = dict(bad)  # type: ignore[call-overload]
        samples = tuple(_sample(name, g, bad_by_gpu.get(g, "")) for g in range(8))  # type: ignore[arg-type]
        beat = Heartbeat(
            node=name,  # type: ignore[arg-type]
            seq=seq[name],  # type: ignore[index]
            gpus=samples,
            xids=tuple(XidReport(g, x) for g, x in xids),  # type: ignore[attr-defined]
            ok=ok,  # type: ignore[arg-type]
        )
        t.record(name, now, beat)  # type: ignore[arg-type]
    elif kind == "fact":
        name, condition, g, healthy = args
        body: Event = NodeConditionChanged(node=name, condition=condition, reason="log")  # type: ignore[arg-type]
        t.observe(body, now)
        t.observe(
            GpuHealthChanged(node=name, gpu=g, healthy=healthy, signal="" if healthy else "xid:48"), now
        )  # type: ignore[arg-type]
    elif kind == "cordon":
        name, drain = args
        t.observe(NodeCordoned(node=name, cordoned=True, drain=drain, reason="admin"), now)  # type: ignore[arg-type]
    elif kind == "clear":
        name, g = args
        t.clear(name, g)  # type: ignore[arg-type]


rounds = st.tuples(
    st.sampled_from([1.0, 1.0, 2.5, 5.0, 20.0]),  # seconds since the last round
    st.sets(node, max_size=2),  # nodes that stop (or start again) sending heartbeats
    st.lists(steps, max_size=3),  # what else happens
)


@settings(max_examples=300, deadline=None)
@given(st.lists(rounds, max_size=25), st.sampled_from([(3, 60.0), (3, 10.0), (1, 5.0)]))
def test_visiting_the_nodes_that_may_have_a_fact_states_what_visiting_every_node_does(
    run: list[tuple[float, set[str], list[tuple[object, ...]]]], limits: tuple[int, float]
) -> None:
    """Each round: every node not silent heartbeats, all well; then the round's other steps;
    then both trackers evaluate. All nodes but ``LATE`` are registered at the start."""
    suspect_after, lost_after = limits
    some = HeartbeatTracker(interval=1.0, suspect_after=suspect_after, lost_after=lost_after)
    every = HeartbeatTracker(interval=1.0, suspect_after=suspect_after, lost_after=lost_after)
    seqs: tuple[dict[str, int], dict[str, int]] = ({}, {})
    now = 1000.0
    for t, seq in zip((some, every), seqs, strict=True):
        for name in NAMES:
            if name != LATE:
                _apply(t, ("register", name), now, seq)
    silent: set[str] = set()
    for dt, toggled, extra in run:
        now += dt
        silent ^= toggled
        beats = [("beat", name, True, [], []) for name in NAMES if name not in silent]
        for step in [*beats, *extra]:
            for t, seq in zip((some, every), seqs, strict=True):
                _apply(t, step, now, seq)
        assert some.evaluate(now) == every.evaluate(now, every_node=True)
