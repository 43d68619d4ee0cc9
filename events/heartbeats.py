"""Heartbeats: what a node agent tells the health monitor every interval, on core NATS.

They travel on ``corral.hb.<node>``, not in the log: the monitor turns them into logged facts
(``NodeConditionChanged``, ``GpuHealthChanged``) only when something changes. Like every message
here they are JSON, so an agent in any language can send them. An agent's own clock is never in
them: the monitor stamps each with its receive time.
"""

from __future__ import annotations

import msgspec

from corral.events.base import Int


class GpuHealthSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """One GPU's health counters and load at one moment, as heartbeats carry them.

    ``None`` means NVML cannot tell on this GPU (NotSupported); the health policy then ignores
    that signal. ``lost`` means NVML answered ``GpuIsLost`` for it.
    """

    index: Int
    uuid: str
    lost: bool = False
    ecc_uncorrected: Int | None = None  # volatile count since the last driver load or reset
    ecc_corrected: Int | None = None
    remap_pending: bool = False
    remap_failed: bool = False
    retired_pages_pending: bool = False
    nvlinks_active: Int = 0
    nvlinks_down: Int = 0  # links that exist but are not active
    utilisation_pct: Int | None = None
    memory_used_mib: Int | None = None
    temperature_c: Int | None = None
    power_w: float | None = None
    clock_event_reasons: Int = 0  # NVML clocks event reasons bit mask (thermal, power, …)
    # A process the agent sent SIGKILL a while ago (``UNKILLABLE_S``) still holds it: in
    # uninterruptible sleep in the driver, keeping the GPU's memory. Not NVML's: the agent's.
    unkillable: bool = False


class XidReport(msgspec.Struct, frozen=True, omit_defaults=True):
    """An XID error NVML reported; ``gpu_instance``/``compute_instance`` name a MIG instance
    (-1: the whole GPU, or NVML could not attribute it). ``gpu`` -1: the agent could not say which
    GPU (NVML named none it knows, or its GPUs cannot be watched at all). ``uuid``: the GPU's, when
    known: the monitor finds the GPU by it, so a report that crosses a registration renumbering
    the node's GPUs marks the GPU it is about."""

    gpu: Int
    xid: Int
    gpu_instance: Int = -1
    compute_instance: Int = -1
    uuid: str = ""


class Heartbeat(msgspec.Struct, frozen=True, omit_defaults=True):
    """What an agent publishes on ``corral.hb.<node>`` every interval.

    ``seq`` grows with every heartbeat (a repeated one is ignored; one that goes back is the
    agent's next run, its clock stepped back); ``xids`` are those
    seen since the previous heartbeat (``NvmlGpus.wait_xid``); ``ok`` is false when the agent
    cannot do its work (NVML broken, runtime failing, its work directory out of space), and
    ``why`` then says what is wrong: the monitor takes the node out of placement (suspect) until
    its agent is well again.
    """

    node: str
    seq: Int
    gpus: tuple[GpuHealthSample, ...] = ()
    xids: tuple[XidReport, ...] = ()
    ok: bool = True
    why: str = ""
