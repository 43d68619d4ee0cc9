"""The health monitor's policy: which GPU signals are ignored, recorded, alerted on, drain a GPU
or drain the node; and the node state machine ready → suspect → lost → (probation) → ready.

Time is injected: every test says ``now``; no test waits.
"""

from __future__ import annotations

import msgspec
import pytest

from corral.events import subjects
from corral.events.heartbeats import GpuHealthSample, XidReport
from corral.events.nodes import GpuHealthChanged, NodeConditionChanged, NodeCordoned, NodeRegistered
from corral.events.queues import CordonNode
from corral.services.health.decide import (
    MAX_NOTICES,
    MAX_WHY,
    MAX_XIDS,
    QUARANTINE_AFTER,
    XID_ACTIONS,
    Action,
    Heartbeat,
    HeartbeatTracker,
    Notice,
    sample_signals,
    xid_action,
)
from tests.builders import Cluster, LogBuilder

N0, N1 = "node-00", "node-01"
T0 = 1000.0

# -- XIDs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        *[pytest.param(x, "ignore", id=f"xid{x}-application") for x in (13, 31, 43, 45, 68)],
        *[
            pytest.param(x, "gpu", id=f"xid{x}-drain-gpu")
            for x in (48, 62, 64, 74, 94, 95, 109, 119, 120, 140)
        ],
        pytest.param(79, "node", id="xid79-off-the-bus-drains-node"),
        pytest.param(63, "record", id="xid63-remap-recorded"),
        pytest.param(92, "alert", id="xid92-sbe-rate-alert"),
        pytest.param(61, "gpu", id="xid61-unknown-drains-gpu"),
        pytest.param(999, "gpu", id="xid999-nvml-unknown"),
        pytest.param(4242, "gpu", id="new-xid"),
    ],
)
def test_xid_policy(xid: int, action: Action) -> None:
    assert xid_action(xid) == action


def test_no_application_xid_makes_a_gpu_unhealthy() -> None:
    assert {x for x, a in XID_ACTIONS.items() if a == "ignore"} == {13, 31, 43, 45, 68}


# -- health counters -------------------------------------------------------------------------------


def sample(**fields: object) -> GpuHealthSample:
    base: dict[str, object] = {"index": 0, "uuid": "GPU-node-00-00", "nvlinks_active": 18}
    return GpuHealthSample(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        pytest.param(sample(), [], id="healthy"),
        pytest.param(sample(ecc_uncorrected=None, remap_pending=False), [], id="not-supported-is-silent"),
        pytest.param(sample(ecc_corrected=12), [], id="corrected-ecc-ignored"),
        pytest.param(sample(ecc_uncorrected=2), [("ecc:uncorrected:2", "gpu")], id="uncorrectable-ecc"),
        pytest.param(sample(remap_pending=True), [("row-remap:pending", "gpu")], id="remap-pending"),
        pytest.param(sample(remap_failed=True), [("row-remap:failed", "gpu")], id="remap-failed"),
        pytest.param(
            sample(retired_pages_pending=True), [("page-retire:pending", "gpu")], id="retire-pending"
        ),
        pytest.param(sample(nvlinks_active=16), [("nvlink:down:2", "gpu")], id="nvlinks-down"),
        pytest.param(sample(lost=True), [("gpu:lost", "node")], id="gpu-lost"),
        pytest.param(sample(unkillable=True), [("process:unkillable", "gpu")], id="unkillable-process"),
        pytest.param(sample(temperature_c=91, utilisation_pct=100), [], id="hot-and-busy-is-fine"),
    ],
)
def test_sample_signals(s: GpuHealthSample, expected: list[tuple[str, Action]]) -> None:
    assert sample_signals(s, expected_nvlinks=18) == expected


def test_pcie_gpus_expect_no_nvlinks() -> None:
    assert sample_signals(sample(nvlinks_active=0), expected_nvlinks=0) == []


# -- the tracker -----------------------------------------------------------------------------------


def verdict(gpu: int, healthy: bool, signal: str = "", node: str = N0) -> GpuHealthChanged:
    """The monitor's verdict on GPU ``gpu`` of a builder's node, named by its UUID too."""
    return GpuHealthChanged(node=node, gpu=gpu, healthy=healthy, signal=signal, uuid=f"GPU-{node}-{gpu:02d}")


class Clock:
    """A monitor's view: a tracker synced to a folded log, heartbeats fed at chosen times."""

    def __init__(self, nodes: int = 2) -> None:
        self.state = LogBuilder().nodes(Cluster(nodes)).fold()
        self.t = HeartbeatTracker(interval=5.0, suspect_after=3, lost_after=60.0, probation=30.0)
        self.t.sync(self.state, T0)
        self.seq = 0

    def beat(self, now: float, node: str = N0, ok: bool = True, **kw: object) -> None:
        self.seq += 1
        inv = self.state.nodes[node].inventory
        gpus = kw.pop("gpus", None)
        if gpus is None:
            gpus = tuple(
                GpuHealthSample(index=g.index, uuid=g.uuid, nvlinks_active=g.nvlinks) for g in inv.gpus
            )
        self.t.record(node, now, Heartbeat(node=node, seq=self.seq, gpus=gpus, ok=ok, **kw))  # type: ignore[arg-type]

    def beats(self, start: float, end: float, node: str = N0, every: float = 5.0) -> None:
        now = start
        while now <= end:
            self.beat(now, node)
            now += every

    def conditions(self, now: float, node: str = N0) -> list[str]:
        return [
            e.condition
            for e in self.t.evaluate(now)
            if isinstance(e, NodeConditionChanged) and e.node == node
        ]


def test_a_node_that_heartbeats_stays_ready_and_nothing_is_written() -> None:
    c = Clock()
    for i in range(20):
        c.beat(T0 + 5 * i, N0)
        c.beat(T0 + 5 * i, N1)
        assert c.t.evaluate(T0 + 5 * i + 1) == []


def test_missed_heartbeats_make_a_node_suspect_then_lost_once_each() -> None:
    c = Clock(nodes=1)
    c.beat(T0)
    assert c.conditions(T0 + 15) == []  # three intervals: not yet more than three missed
    assert c.conditions(T0 + 15.1) == ["suspect"]
    assert c.conditions(T0 + 30) == []  # already suspect: said once
    assert c.conditions(T0 + 60.1) == ["lost"]
    assert c.conditions(T0 + 600) == []


def test_a_node_that_never_heartbeats_is_counted_from_when_the_monitor_learnt_of_it() -> None:
    c = Clock(nodes=1)
    assert c.conditions(T0 + 10) == []
    assert c.conditions(T0 + 61) == ["lost"]  # straight to lost: it was silent all along


def test_a_lost_node_is_ready_again_only_after_a_probation_of_healthy_heartbeats() -> None:
    c = Clock(nodes=1)
    c.beat(T0)
    assert c.conditions(T0 + 61) == ["lost"]
    c.beats(T0 + 100, T0 + 125)
    assert c.conditions(T0 + 126) == []  # 25 s of heartbeats: still on probation
    c.beats(T0 + 130, T0 + 130)
    assert c.conditions(T0 + 131) == ["ready"]


def test_a_gap_during_probation_starts_it_again() -> None:
    c = Clock(nodes=1)
    c.beat(T0)
    c.conditions(T0 + 61)
    c.beats(T0 + 100, T0 + 120)
    c.beats(T0 + 140, T0 + 160)  # a 20 s gap: more than three intervals
    assert c.conditions(T0 + 161) == []  # 60 s since the first heartbeat, but only 20 s unbroken
    c.beats(T0 + 165, T0 + 170)
    assert c.conditions(T0 + 171) == ["ready"]


def test_heartbeats_from_an_unwell_agent_do_not_count_towards_probation() -> None:
    c = Clock(nodes=1)
    c.beat(T0)
    c.conditions(T0 + 16)
    for i in range(10):
        c.beat(T0 + 20 + 5 * i, ok=False)
    assert c.conditions(T0 + 70) == []  # heartbeats arrive, so not lost, but not trusted either
    c.beats(T0 + 75, T0 + 105)
    assert c.conditions(T0 + 106) == ["ready"]


def test_a_ready_node_whose_agent_says_it_cannot_start_workers_is_suspect_until_well_again() -> None:
    # Its work directory full: every job placed there would fail to start and be charged a
    # restart, so it takes no work from the first heartbeat that says so.
    c = Clock(nodes=1)
    c.beat(T0)
    c.beat(T0 + 5, ok=False, why="/work has 0 MiB free")
    [changed] = [e for e in c.t.evaluate(T0 + 6) if isinstance(e, NodeConditionChanged)]
    assert (changed.condition, changed.reason) == ("suspect", "/work has 0 MiB free")
    c.beat(T0 + 10, ok=False, why="/work has 0 MiB free")
    assert c.conditions(T0 + 11) == []  # said once
    c.beats(T0 + 15, T0 + 40)
    assert c.conditions(T0 + 41) == []  # on probation
    c.beats(T0 + 45, T0 + 45)
    assert c.conditions(T0 + 46) == ["ready"]


def test_what_an_agent_says_is_wrong_reaches_the_log_as_one_bounded_line() -> None:
    # The reason is kept in the log for good: an agent taken over sent 200 KB of escape codes.
    c = Clock(nodes=1)
    c.beat(T0)
    c.beat(T0 + 5, ok=False, why="\x1b[2J\nfull" + "x" * 200_000)
    [changed] = [e for e in c.t.evaluate(T0 + 6) if isinstance(e, NodeConditionChanged)]
    assert changed.reason.startswith("[2J full") and len(changed.reason) <= MAX_WHY
    assert changed.reason.isprintable()


def test_a_suspect_node_recovers_through_probation_too() -> None:
    c = Clock(nodes=1)
    c.beat(T0)
    assert c.conditions(T0 + 16) == ["suspect"]
    c.beats(T0 + 20, T0 + 45)
    assert c.conditions(T0 + 46) == []
    c.beats(T0 + 50, T0 + 50)
    assert c.conditions(T0 + 51) == ["ready"]


def test_a_repeated_heartbeat_is_ignored() -> None:
    c = Clock(nodes=1)
    c.beat(T0)
    hb = Heartbeat(node=N0, seq=c.seq)
    c.t.record(N0, T0 + 14, hb)  # the same heartbeat again, late: not a sign of life
    assert c.conditions(T0 + 15.1) == ["suspect"]


def test_a_heartbeat_whose_sequence_goes_back_is_the_agents_next_run() -> None:
    # One heartbeat with a sequence of 2**62 (or an agent restarted after its clock stepped
    # back) had every later one dropped as old: the node went suspect, then lost, for good.
    c = Clock(nodes=1)
    c.beat(T0)
    c.t.record(N0, T0 + 1, Heartbeat(node=N0, seq=2**62))
    c.beats(T0 + 5, T0 + 100)  # the agent's own sequence, far below
    assert c.conditions(T0 + 101) == []


def test_nodes_the_log_does_not_know_get_no_facts() -> None:
    c = Clock(nodes=1)
    c.t.record("stranger", T0, Heartbeat(node="stranger", seq=1, xids=(XidReport(0, 79),)))
    assert [e for e in c.t.evaluate(T0 + 1000) if getattr(e, "node", None) == "stranger"] == []


def test_a_resynced_tracker_does_not_repeat_what_the_log_says() -> None:
    log = LogBuilder().nodes(Cluster(1)).condition(N0, "lost").gpu_health(N0, 3, False, "xid:79")
    t = HeartbeatTracker()
    t.sync(log.fold(), T0)
    assert t.evaluate(T0 + 1) == []  # lost already; GPU 3 unhealthy already


# -- GPU health and cordons ------------------------------------------------------------------------


def test_a_critical_xid_makes_the_gpu_unhealthy_once_and_it_stays_so() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=2, xid=48),))
    assert c.t.evaluate(T0 + 1) == [verdict(2, False, "xid:48")]
    c.beat(T0 + 5)
    assert c.t.evaluate(T0 + 6) == []  # sticky until a person clears it
    c.t.clear(N0, 2)
    assert c.t.evaluate(T0 + 7) == [verdict(2, True)]


def test_application_xids_change_nothing() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=tuple(XidReport(gpu=0, xid=x) for x in (13, 31, 43, 45, 68)))
    assert c.t.evaluate(T0 + 1) == [] and c.t.take_notices() == []


def test_xid_79_drains_the_node() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=5, xid=79),))
    assert c.t.evaluate(T0 + 1) == [
        verdict(5, False, "xid:79"),
        NodeCordoned(node=N0, cordoned=True, drain=True, reason="xid:79 on GPU 5"),
    ]
    c.beat(T0 + 5, xids=(XidReport(gpu=6, xid=79),))
    assert c.t.evaluate(T0 + 6) == [verdict(6, False, "xid:79")]


def test_recorded_and_alerted_xids_are_notices_not_facts() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=1, xid=63), XidReport(gpu=1, xid=92)))
    assert c.t.evaluate(T0 + 1) == []
    assert c.t.take_notices() == [
        (Notice(N0, 1, "xid:63", "record"), 1),
        (Notice(N0, 1, "xid:92", "alert"), 1),
    ]
    assert c.t.take_notices() == []


def test_a_flood_of_xids_is_counted_and_bounded_and_still_fails_the_gpu_it_names() -> None:
    # 50,000 XIDs a heartbeat were each a notice kept and logged: a million warnings a tick from
    # one node's agent. Repeats are counted, a node's distinct notices bounded, and an XID that
    # fails a GPU is taken before any number of notices.
    c = Clock(nodes=1)
    flood = tuple(XidReport(gpu=i % 8, xid=63) for i in range(50_000)) + (XidReport(gpu=3, xid=79),)
    c.beat(T0, xids=flood)
    c.beat(T0 + 0.5, xids=tuple(XidReport(gpu=-1, xid=92) for _ in range(50_000)))
    events = c.t.evaluate(T0 + 1)
    assert verdict(3, False, "xid:79") in events
    notices = dict(c.t.take_notices())
    # Past ``MAX_XIDS``, each (GPU, XID) once: 8 GPUs' XID 63 and the unnamed GPU's 92.
    assert notices[Notice(N0, -1, "xid:92", "alert")] == 1
    assert len(notices) == 9 and sum(notices.values()) == 9
    # One GPU's storm of an XID that fails it does not crowd out another GPU's, or the node's.
    c = Clock(nodes=1)
    c.beat(T0, xids=(*(XidReport(gpu=0, xid=74) for _ in range(2 * MAX_XIDS)), XidReport(gpu=5, xid=48)))
    assert {e.gpu for e in c.t.evaluate(T0 + 1) if isinstance(e, GpuHealthChanged)} == {0, 5}
    # Past ``MAX_NOTICES`` distinct ones a node's are only counted.
    t = HeartbeatTracker()
    for i in range(MAX_NOTICES + 10):
        t._notice(Notice(N0, i, "xid:63", "record"))
    taken = t.take_notices()
    assert len(taken) == MAX_NOTICES + 1 and taken[-1] == (Notice(N0, -1, "", "record"), 10)


def test_counter_signals_clear_when_the_counters_do() -> None:
    c = Clock(nodes=1)
    inv = c.state.nodes[N0].inventory
    healthy = [GpuHealthSample(index=g.index, uuid=g.uuid, nvlinks_active=18) for g in inv.gpus]
    bad = list(healthy)
    bad[4] = GpuHealthSample(index=4, uuid=inv.gpus[4].uuid, nvlinks_active=18, remap_pending=True)
    c.beat(T0, gpus=tuple(bad))
    assert c.t.evaluate(T0 + 1) == [verdict(4, False, "row-remap:pending")]
    c.beat(T0 + 5, gpus=tuple(bad))
    assert c.t.evaluate(T0 + 6) == []
    c.beat(T0 + 10, gpus=tuple(healthy))  # the GPU was reset
    assert c.t.evaluate(T0 + 11) == [verdict(4, True)]


def test_a_gpu_an_unkillable_process_holds_is_unhealthy_until_the_process_is_gone() -> None:
    # Work placed on it would never start (its agent starts nothing on GPUs a worker holds).
    c = Clock(nodes=1)
    inv = c.state.nodes[N0].inventory
    healthy = [GpuHealthSample(index=g.index, uuid=g.uuid, nvlinks_active=18) for g in inv.gpus]
    stuck = list(healthy)
    stuck[2] = msgspec.structs.replace(healthy[2], unkillable=True)
    c.beat(T0, gpus=tuple(stuck))
    assert c.t.evaluate(T0 + 1) == [verdict(2, False, "process:unkillable")]
    c.beat(T0 + 5, gpus=tuple(healthy))  # it ended at last
    assert c.t.evaluate(T0 + 6) == [verdict(2, True)]


def test_nvlinks_down_are_measured_against_registration() -> None:
    c = Clock(nodes=1)
    inv = c.state.nodes[N0].inventory
    gpus = [GpuHealthSample(index=g.index, uuid=g.uuid, nvlinks_active=18) for g in inv.gpus]
    gpus[7] = GpuHealthSample(index=7, uuid=inv.gpus[7].uuid, nvlinks_active=12, nvlinks_down=6)
    c.beat(T0, gpus=tuple(gpus))
    assert c.t.evaluate(T0 + 1) == [verdict(7, False, "nvlink:down:6")]


def test_a_gpu_nvml_no_longer_lists_drains_the_node() -> None:
    c = Clock(nodes=1)
    inv = c.state.nodes[N0].inventory
    # GPU 3 fell off the bus: NVML renumbers the rest, so samples are matched by UUID, not index.
    gpus = tuple(
        GpuHealthSample(index=i, uuid=g.uuid, nvlinks_active=18)
        for i, g in enumerate(inv.gpus[:3] + inv.gpus[4:])
    )
    c.beat(T0, gpus=gpus)
    assert c.t.evaluate(T0 + 1) == [
        verdict(3, False, "gpu:missing"),
        NodeCordoned(node=N0, cordoned=True, drain=True, reason="gpu:missing on GPU 3"),
    ]


def test_observing_its_own_events_keeps_the_tracker_quiet() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=0, xid=79),))
    events = c.t.evaluate(T0 + 1)
    for ev in events:
        c.t.observe(ev, T0 + 2)
    assert c.t.evaluate(T0 + 3) == []


def test_a_reregistered_node_keeps_its_gpus_verdicts_as_the_fold_does() -> None:
    # The agent restarted and registered the node again: the fold keeps a failed GPU failed
    # (``fold_nodes._registered``), so the monitor neither writes its verdict again nor forgets
    # it; and a GPU whose fault was not sticky is said well once its counters are clean (the
    # monitor took it for healthy after the registration, so it never said so, and the fold
    # kept it failed for good).
    c = Clock(nodes=1)
    inv = c.state.nodes[N0].inventory
    clean = [GpuHealthSample(index=g.index, uuid=g.uuid, nvlinks_active=g.nvlinks) for g in inv.gpus]
    ecc = list(clean)
    ecc[2] = GpuHealthSample(
        index=2, uuid=inv.gpus[2].uuid, nvlinks_active=inv.gpus[2].nvlinks, ecc_uncorrected=3
    )
    c.beat(T0, xids=(XidReport(gpu=1, xid=95),), gpus=tuple(ecc))
    said = c.t.evaluate(T0 + 1)
    assert [(e.gpu, e.healthy) for e in said if isinstance(e, GpuHealthChanged)] == [(1, False), (2, False)]
    c.t.observe(NodeRegistered(node=N0, inventory=inv), T0 + 2)
    c.beat(T0 + 5, gpus=tuple(ecc))
    assert c.t.evaluate(T0 + 6) == []
    c.beat(T0 + 10, gpus=tuple(clean))  # the driver reload cleared the volatile ECC count
    assert c.t.evaluate(T0 + 11) == [verdict(2, True)]


def test_an_admin_uncordon_of_a_repaired_node_clears_its_gpus_failures_in_the_log_and_the_monitor() -> None:
    # A failed GPU stayed failed for good: the fold kept it so across the agent's registrations,
    # and no request cleared it, however the GPU was reset or replaced.
    log = LogBuilder().nodes(Cluster(1)).gpu_health(N0, 5, False, "xid:79").cordon(N0, True, drain=True)
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=5, xid=79),))
    for ev in c.t.evaluate(T0 + 1):
        c.t.observe(ev, T0 + 1)
    repaired = CordonNode(node=N0, cordoned=False, repaired=True)
    state = log.request("admin", "cordon", repaired).fold()
    assert [g.healthy for g in state.nodes[N0].gpus] == [True] * 8 and not state.nodes[N0].cordoned
    c.t.observe(repaired, T0 + 100)
    c.beat(T0 + 105)
    assert c.t.evaluate(T0 + 106) == []  # in line with the log: nothing to say
    # Repaired goes with an uncordon only.
    state = log.request("admin", "cordon", CordonNode(node=N0, cordoned=True, repaired=True)).fold()
    assert state.rejections[-1].code == "malformed"


def test_the_health_monitor_never_uncordons() -> None:
    log = LogBuilder().nodes(Cluster(1)).cordon(N0, True, drain=True)
    t = HeartbeatTracker()
    t.sync(log.fold(), T0)
    t.record(N0, T0, Heartbeat(node=N0, seq=1))
    assert [e for e in t.evaluate(T0 + 1) if isinstance(e, NodeCordoned)] == []


def test_after_an_admin_uncordons_a_new_xid_79_cordons_again() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=5, xid=79),))
    for ev in c.t.evaluate(T0 + 1):
        c.t.observe(ev, T0 + 1)
    c.t.observe(CordonNode(node=N0, cordoned=False), T0 + 100)  # repaired and uncordoned by hand
    c.t.clear(N0, 5)
    c.beat(T0 + 105)
    assert c.t.evaluate(T0 + 106) == [verdict(5, True)]
    c.beat(T0 + 110, xids=(XidReport(gpu=2, xid=79),))
    assert NodeCordoned(node=N0, cordoned=True, drain=True, reason="xid:79 on GPU 2") in c.t.evaluate(
        T0 + 111
    )


@pytest.mark.parametrize("xid", [999, 79, 48])
def test_an_xid_the_agent_could_not_name_a_gpu_for_drains_the_node_and_fails_no_gpu(xid: int) -> None:
    # Every GPU was failed at once, each job on the node interrupted without its grace, for an
    # XID NVML could not attribute (a GPU fallen off the bus answers no UUID) or an agent that
    # cannot watch its GPUs: no GPU is known bad, none can be trusted. Drained, each job
    # checkpoints within its grace; the samples name a GPU that fell off the bus.
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=-1, xid=xid),))
    events = c.t.evaluate(T0 + 1)
    why = f"xid:{xid} on a GPU the agent could not name"
    assert events == [NodeCordoned(node=N0, cordoned=True, drain=True, reason=why)]


def test_an_application_xid_the_agent_could_not_name_a_gpu_for_changes_nothing() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=-1, xid=13),))
    assert c.t.evaluate(T0 + 1) == []


def renumbered(c: Clock) -> NodeRegistered:
    """node-00 registered again without its GPU 0 (fallen off the bus): the others renumbered."""
    inv = c.state.nodes[N0].inventory
    left = [msgspec.structs.replace(g, index=i) for i, g in enumerate(inv.gpus[1:])]
    return NodeRegistered(node=N0, inventory=msgspec.structs.replace(inv, gpus=left))


def test_an_xid_names_its_gpu_by_uuid_across_a_registration_that_renumbered_the_gpus() -> None:
    # The agent's report names GPU 3 of its new registration, which the monitor has not folded
    # yet: by index it failed the GPU at 3 of the old layout, a healthy one, for good.
    c = Clock(nodes=1)
    bad = c.state.nodes[N0].inventory.gpus[4].uuid  # index 3 once GPU 0 is gone
    c.beat(T0, xids=(XidReport(gpu=3, xid=48, uuid=bad),))
    assert c.t.evaluate(T0 + 1) == [verdict(4, False, "xid:48")]


def test_an_xid_on_a_gpu_of_a_registration_not_folded_yet_is_marked_once_it_is() -> None:
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=8, xid=48, uuid="GPU-node-00-new"),))
    assert c.t.evaluate(T0 + 1) == []
    inv = c.state.nodes[N0].inventory
    extra = msgspec.structs.replace(inv.gpus[0], index=8, uuid="GPU-node-00-new")
    c.t.observe(
        NodeRegistered(node=N0, inventory=msgspec.structs.replace(inv, gpus=[*inv.gpus, extra])), T0 + 2
    )
    said = [e for e in c.t.evaluate(T0 + 3) if isinstance(e, GpuHealthChanged)]
    assert said == [GpuHealthChanged(node=N0, gpu=8, healthy=False, signal="xid:48", uuid="GPU-node-00-new")]


def test_xids_an_agent_names_for_gpus_it_never_registered_are_kept_a_bounded_few() -> None:
    # A careless or hostile agent naming GPUs by UUIDs it never registers: each is kept for a
    # registration to come, at most ``_EARLY`` a node, and fails nothing meanwhile.
    from corral.services.health.decide import _EARLY

    c = Clock(nodes=1)
    made_up = tuple(XidReport(gpu=9, xid=48, uuid=f"GPU-made-up-{i}") for i in range(10 * _EARLY))
    c.beat(T0, xids=made_up)
    assert c.t.evaluate(T0 + 1) == [] and len(c.t._nodes[N0].early) == _EARLY


def test_a_verdict_judged_before_a_registration_renumbered_the_gpus_is_void_and_stated_again() -> None:
    # The monitor judged GPU 2 of the layout it knew; the agent registered again without GPU 0
    # before the verdict was appended: by index it failed the GPU now at 2, a healthy one, and
    # the bad one (now at 1) stayed placeable.
    log = LogBuilder().nodes(Cluster(1))
    c = Clock(nodes=1)
    c.beat(T0, xids=(XidReport(gpu=2, xid=48, uuid="GPU-node-00-02"),))
    (judged,) = c.t.evaluate(T0 + 1)
    again = renumbered(c)
    state = log.event(subjects.node(N0), again).event(subjects.node(N0), judged).fold()
    assert state.rejections[-1].code == "void", state.rejections
    assert [g.healthy for g in state.nodes[N0].gpus] == [True] * 7
    c.t.observe(again, T0 + 2)  # the monitor's own fold: the registration, then the refusal
    c.t.adopt(N0, state)
    (stated,) = c.t.evaluate(T0 + 3)
    assert stated == GpuHealthChanged(node=N0, gpu=1, healthy=False, signal="xid:48", uuid="GPU-node-00-02")
    state = log.event(subjects.node(N0), stated).fold()
    assert [g.info.uuid for g in state.nodes[N0].gpus if not g.healthy] == ["GPU-node-00-02"]
    # The GPU judged was the last one: its index is past the node's GPUs now, void as well.
    last = GpuHealthChanged(node=N0, gpu=7, healthy=False, signal="xid:48", uuid="GPU-node-00-07")
    state = log.event(subjects.node(N0), last).fold()
    assert state.rejections[-1].code == "void", state.rejections[-1]


def test_lost_nodes_are_not_visited_until_heard_again_and_then_earn_trust_back() -> None:
    # Every node ever lost stayed among those visited at every evaluation: a monitor of months
    # spent its ticks on them. A silent lost node is visited again only once it is heard.
    c = Clock(nodes=40)
    for name in c.state.nodes:
        c.t.observe(NodeConditionChanged(node=name, condition="lost", reason="log"), T0)
    assert c.t.evaluate(T0 + 1) == [] and c.t._unready == set()
    assert c.t.evaluate(T0 + 500) == []
    c.beats(T0 + 600, T0 + 640)  # node-00 back, healthy for 40 s: past its probation
    assert c.conditions(T0 + 640) == ["ready"]
    assert c.t._unready == set()


def test_names_heard_but_never_registered_are_let_go_once_silent() -> None:
    t = HeartbeatTracker(interval=5.0, suspect_after=3, lost_after=60.0)
    for i in range(1_000):
        t.record(f"made-up-{i}", T0, Heartbeat(node=f"made-up-{i}", seq=1))
    assert t.evaluate(T0 + 1) == [] and len(t._nodes) == 1_000
    assert t.evaluate(T0 + 16) == [] and t._nodes == {} and t._stamps == {}
    t.record("made-up-1", T0 + 20, Heartbeat(node="made-up-1", seq=2))  # heard again: known again
    assert set(t._nodes) == {"made-up-1"}


def test_a_standby_lets_go_of_names_never_registered_without_evaluating() -> None:
    # A standby records every heartbeat and never evaluates: a flood of names made up, one every
    # tenth of a second, must not stay in it for good; a registered node stays, silent or not.
    t = HeartbeatTracker(interval=5.0, suspect_after=3, lost_after=60.0)
    t.observe(next(Cluster(1).events()), T0)
    for i in range(10_000):
        name = f"made-up-{i}"
        t.record(name, T0 + i / 10, Heartbeat(node=name, seq=1))
    assert N0 in t._nodes
    assert len(t._nodes) <= 2_048 and len(t._stamps) <= 2_048
    assert len(t._heard) <= 4 * len(t._nodes) + 64
    assert "made-up-9999" in t._nodes  # heard of lately: kept
    t.record("made-up-0", T0 + 1_001, Heartbeat(node="made-up-0", seq=2))  # heard again: known again
    assert "made-up-0" in t._nodes


def test_a_deleted_node_is_forgotten_and_never_turns_lost() -> None:
    from corral.events.queues import DeleteNode

    c = Clock(nodes=2)
    c.beats(T0, T0 + 20, node=N0)
    c.beats(T0, T0 + 20, node=N1)
    assert c.t.observe(DeleteNode(node=N1), T0 + 21)
    assert N1 not in c.t._nodes
    c.beats(T0 + 25, T0 + 200, node=N0)
    facts = c.t.evaluate(T0 + 200)
    assert not [e for e in facts if getattr(e, "node", None) == N1]


def test_a_node_that_failed_starts_in_a_row_is_cordoned_by_a_monitor_that_starts_after() -> None:
    # The count is the fold's: a monitor that takes over, or starts from a snapshot, cordons a
    # node the log says failed its last starts, unless it is cordoned already.
    state = LogBuilder().nodes(Cluster(3)).fold()
    jobs = tuple(f"j{i}" for i in range(QUARANTINE_AFTER + 4))
    state.nodes[N0].start_faults = jobs[:QUARANTINE_AFTER]
    state.nodes[N1].start_faults = jobs[: QUARANTINE_AFTER - 1]
    state.nodes["node-02"].start_faults, state.nodes["node-02"].cordoned = jobs, True
    t = HeartbeatTracker()
    t.sync(state, T0)
    out = t.evaluate(T0)
    assert out == [
        NodeCordoned(
            node=N0,
            cordoned=True,
            reason=f"quarantined: the starts of {QUARANTINE_AFTER} jobs in a row failed"
            " for the node's own fault",
        )
    ]
    assert t.evaluate(T0 + 1) == []
    assert not t.start_faults(N0, QUARANTINE_AFTER + 1, "again")  # cordoned: nothing more to say
    assert not t.start_faults(N1, QUARANTINE_AFTER - 1, "once more")
    assert t.start_faults(N1, QUARANTINE_AFTER, "x" * 10_000)
    [(cordon)] = t.evaluate(T0 + 2)
    assert isinstance(cordon, NodeCordoned) and cordon.node == N1 and len(cordon.reason) <= MAX_WHY


def test_a_quarantine_not_yet_said_is_dropped_once_the_node_is_cordoned_or_its_cordon_lifted() -> None:
    # A standby replica folds what the holder folds but never evaluates: a quarantine it noted
    # for a node the holder then cordoned, and a person later uncordoned, must not be said again
    # once it takes over (the fold forgot the run of failed starts with the uncordon).
    state = LogBuilder().nodes(Cluster(2)).fold()
    t = HeartbeatTracker()
    t.sync(state, T0)
    assert t.evaluate(T0) == []
    assert t.start_faults(N0, QUARANTINE_AFTER, "disk full")  # noted, not evaluated (a standby)
    said = "quarantined: the starts of 3 jobs in a row failed for the node's own fault"
    t.observe(NodeCordoned(node=N0, cordoned=True, reason=said), T0 + 1)  # the holder's
    t.observe(CordonNode(node=N0, cordoned=False), T0 + 2)  # a person lifts it
    assert t.evaluate(T0 + 3) == []
    # An admin's cordon before the monitor evaluated settles it too: nothing to say once lifted.
    assert t.start_faults(N1, QUARANTINE_AFTER, "disk full")
    t.observe(CordonNode(node=N1, cordoned=True, reason="looking at it"), T0 + 4)
    t.observe(CordonNode(node=N1, cordoned=False), T0 + 5)
    assert t.evaluate(T0 + 6) == []
