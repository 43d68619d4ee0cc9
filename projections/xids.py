"""What an XID error says about the GPU it happened on, per NVIDIA's XID catalogue and the k8s
device plugin (``../shared/reference/GPU-FACTS.md``, section 3): the health monitor's policy for
the XIDs in heartbeats (``services/health/decide.py``), and the fold's for an XID a node's agent
saw on a worker's GPUs as the worker failed (``fold_nodes``: the job is interrupted, not charged a
restart, and the GPU is failed at once).

- ``ignore``: application errors (XID 13, 31, 43, 45, 68). The job fails; the GPU is fine.
- ``record``: worth knowing, no action now (XID 63, a row remap that succeeded).
- ``alert``: tell a person, change nothing (XID 92, a high single-bit ECC rate).
- ``gpu``: the GPU is unhealthy: it leaves the capacity the placer sees and the fold interrupts
  the jobs on it (XID 48, 62, 64, 74, 94, 95, 109, 119, 120, 140; any XID not in the table,
  61 included).
- ``node``: the GPU is unhealthy and the whole node is cordoned and drained (XID 79, fallen off
  the bus, needs a reboot).
"""

from __future__ import annotations

from typing import Literal

Action = Literal["ignore", "record", "alert", "gpu", "node"]

XID_ACTIONS: dict[int, Action] = {
    # Application errors: the job's fault, the GPU stays healthy (the device plugin's list).
    13: "ignore",  # graphics engine exception
    31: "ignore",  # GPU memory page fault
    43: "ignore",  # GPU stopped processing; "GPU remains in a healthy state"
    45: "ignore",  # preemptive cleanup after earlier errors; the accompanying XID decides
    68: "ignore",  # NVDEC0 exception
    # The GPU needs a reset: drain it.
    48: "gpu",  # double-bit ECC
    62: "gpu",  # internal micro-controller halt
    64: "gpu",  # row-remap failure
    74: "gpu",  # NVLink error
    94: "gpu",  # contained ECC error: reset when convenient, keep work off it until then
    95: "gpu",  # uncontained ECC error
    109: "gpu",  # context-switch timeout: the catalogue says reset (the device plugin ignores it)
    119: "gpu",  # GSP RPC timeout
    120: "gpu",  # GSP error
    140: "gpu",  # ECC unrecovered error escape
    # The node needs a reboot: drain all of it.
    79: "node",  # fallen off the bus
    # Worth knowing only.
    63: "record",  # row remap / page retirement event
    92: "alert",  # high single-bit ECC error rate
}
UNKNOWN_XID: Action = "gpu"  # 61 (unused on A100/H100: contact support), 999 (NVML: unknown), new ones


def xid_action(xid: int) -> Action:
    return XID_ACTIONS.get(xid, UNKNOWN_XID)


def hardware(xid: int) -> bool:
    """Whether the XID says the GPU itself is at fault (it must be reset, or its node rebooted)."""
    return xid_action(xid) in ("gpu", "node")
