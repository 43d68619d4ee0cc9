"""What GPUs this node has, read through NVML (pynvml), or a simulated inventory without them.

Discovery produces the same ``NodeInventory`` as the simulated profiles of ``services.agent.inventory``,
so nothing downstream can tell a real node from a simulated one:

- ``model`` is corral's name (``H100-80GB``, ``A100-40GB``, ``H200-141GB``, ``T4``, …), taken from
  the PCI device id where it names one model, else from NVML's name and the memory size;
- ``memory_mib`` is NVML's total memory; ``mig`` the *current* MIG mode (a pending mode needs a
  GPU reset and is not what the GPU does now);
- ``island`` groups GPUs joined by active NVLinks. Behind an NVSwitch every link's remote end is
  the switch, so a pairwise count finds no peers: every GPU with an active link to a switch joins
  one island (HGX/DGX boards are all-to-all). A GPU with no NVLink peer is ``-1`` (PCIe only);
- ``nvlinks`` is the GPU's count of active links, which the health policy later compares with.

Health counters (ECC, row remapping, retired pages, NVLink state, utilisation) are sampled by
``NvmlGpus.health`` for heartbeats, and XID errors read by ``NvmlGpus.wait_xid`` (a blocking NVML
event wait, for a thread of the agent's service). NVML answers ``NotSupported`` for whatever a
GPU lacks (no ECC on consumer cards, no MIG on T4, no NVLink on PCIe cards, no row remapping while
MIG is on): every such answer is a missing value, never an error. With no driver or library
(``LibraryNotFound``, ``DriverNotLoaded``, …) or no pynvml at all, discovery falls back to a
simulated profile and says why in ``Discovery.note`` (unless told not to: ``fallback=None``).

``python -m services.agent.discovery NODE`` prints what this machine's discovery sees, as JSON.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import msgspec

from corral.events.heartbeats import GpuHealthSample, XidReport
from corral.events.nodes import GpuInfo, NodeInventory
from corral.projections import mig
from corral.services.agent.inventory import PROFILES

MIB = 1024 * 1024
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS
NVLINK_TO_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
NVLINK_TO_GPU = 0  # NVML_NVLINK_DEVICE_TYPE_GPU
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
UNKNOWN_XID = 999  # what NVML itself reports for an XID it cannot name

# NVML's pciDeviceId (device << 16 | 0x10DE) for ids that name exactly one model (NVIDIA
# mig-parted's tables); any other id falls back to the marketing name.
PCI_MODELS: dict[int, str] = {
    0x20B010DE: "A100-40GB",  # A100 SXM4 40GB
    0x20F110DE: "A100-40GB",  # A100 PCIe 40GB
    0x20B210DE: "A100-80GB",  # A100 SXM4 80GB
    0x20B510DE: "A100-80GB",  # A100 PCIe 80GB
    0x233010DE: "H100-80GB",  # H100 SXM5
    0x233110DE: "H100-80GB",  # H100 PCIe
    0x232210DE: "H100-80GB",
    0x232110DE: "H100-NVL",  # H100 NVL 94GB
    0x233510DE: "H200-141GB",  # H200 SXM
    0x233B10DE: "H200-141GB",  # H200 NVL
    0x1EB810DE: "T4",
}

# Families sold with several memory sizes are named <family>-<GB>GB; the others by family alone.
_SIZES_GB: dict[str, tuple[int, ...]] = {
    "A100": (40, 80),
    "A800": (40, 80),
    "H100": (80, 94, 96),
    "H800": (80,),
    "H200": (141,),
    "GH200": (96, 144),
    "V100": (16, 32),
}
_FAMILY = re.compile(r"\b(G?[A-Z]{1,2}\d{1,3}[A-Z]?)\b")
_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)

# GPU instance profile id (``nvmlGpuInstanceGetInfo(...).profileId``) -> (memory slices, SM
# slices, media extensions), per NVIDIA's MIG profile table.
_MIG_PROFILE_IDS: dict[int, tuple[int, int, bool]] = {
    19: (1, 1, False),
    20: (1, 1, True),
    15: (2, 1, False),
    14: (2, 2, False),
    9: (4, 3, False),
    5: (4, 4, False),
    0: (8, 7, False),
}


class MigDevice(msgspec.Struct, frozen=True, omit_defaults=True):
    """A MIG instance that exists on a GPU: ``start`` is its first memory slice (-1 if NVML did
    not say), ``profile`` its name on that GPU model (e.g. ``3g.40gb``)."""

    gpu: int
    parent_uuid: str
    uuid: str
    gpu_instance: int
    compute_instance: int
    memory_mib: int
    start: int = -1
    profile: str = ""


class Discovery(msgspec.Struct, frozen=True, omit_defaults=True):
    source: Literal["nvml", "simulated"]
    inventory: NodeInventory
    health: tuple[GpuHealthSample, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    driver: str = ""
    note: str = ""  # why the inventory is simulated


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine (no library, no driver, no permission)."""


# -- model names -----------------------------------------------------------------------------------


def model_name(nvml_name: str, memory_mib: int, pci_device_id: int | None = None) -> str:
    """corral's name for a GPU: ``H100-80GB``, ``A100-40GB``, ``H200-141GB``, ``T4``, …"""
    if pci_device_id is not None and pci_device_id in PCI_MODELS:
        return PCI_MODELS[pci_device_id]
    name = nvml_name.replace("NVIDIA", " ").replace("Tesla", " ").replace("GeForce", " ").strip()
    found = _FAMILY.search(name.upper())
    if found is None:
        return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "unknown"
    family = found.group(1)
    if family == "H100" and "NVL" in name.upper():
        return "H100-NVL"
    sizes = _SIZES_GB.get(family)
    if sizes is None:
        return family
    named = _GB.search(name)
    if named and int(named.group(1)) in sizes:
        return f"{family}-{named.group(1)}GB"
    # No size in the name, or another one (GH200's names count the CPU's memory): measure it.
    gb = memory_mib / 1024
    return f"{family}-{min(sizes, key=lambda s: abs(s - gb))}GB"


def nominal_memory_mib(model: str) -> int:
    """What NVML reports as total memory for ``model`` (0 if unknown): for a GPU whose own answer
    is missing."""
    known = {g.model: g.memory_mib for make in PROFILES.values() for g in make("n").gpus}
    if model in known:
        return known[model]
    size = re.search(r"-(\d+)GB$", model)
    return int(size.group(1)) * 1024 if size else 0


# -- NVML ------------------------------------------------------------------------------------------


def load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    module: ModuleType = pynvml
    return module


class NvmlGpus:
    """An initialised NVML: inventory and health samples. ``close`` shuts NVML down.

    ``nvml`` is the pynvml module or anything with the same functions and error classes.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._events: Any = None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML: {e}") from None
        try:
            self.count: int = nvml.nvmlDeviceGetCount()
            self.handles: list[Any] = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        except nvml.NVMLError as e:
            self.close()
            raise NvmlUnavailable(f"NVML: {e}") from None
        self._uuids = [
            str(self._try("nvmlDeviceGetUUID", h, default=f"GPU-unknown-{i}"))
            for i, h in enumerate(self.handles)
        ]

    def uuid_of(self, gpu: int) -> str:
        """The UUID of GPU ``gpu`` as discovered ("" for no such GPU)."""
        return self._uuids[gpu] if 0 <= gpu < len(self._uuids) else ""

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    def _try(self, name: str, *args: Any, default: Any) -> Any:
        """NVML function ``name`` on ``args``, or ``default`` when the GPU does not support it (or
        NVML refuses otherwise, or this pynvml lacks the function): a missing capability is never
        an error."""
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            return default
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return default

    def driver(self) -> str:
        return str(self._try("nvmlSystemGetDriverVersion", default=""))

    # inventory

    def gpus(self) -> tuple[GpuInfo, ...]:
        pci = [self._try("nvmlDeviceGetPciInfo", h, default=None) for h in self.handles]
        by_bus = {_bus(p): i for i, p in enumerate(pci) if p is not None}
        links = [self._links(h, by_bus) for h in self.handles]
        islands = _islands(links)
        out = []
        for i, h in enumerate(self.handles):
            memory = self._try("nvmlDeviceGetMemoryInfo", h, default=None)
            memory_mib = int(memory.total) // MIB if memory is not None else 0
            name = str(self._try("nvmlDeviceGetName", h, default=""))
            device_id = int(pci[i].pciDeviceId) if pci[i] is not None else None
            model = model_name(name, memory_mib, device_id)
            if not memory_mib:  # a MIG-mode GPU tells its memory to privileged callers only
                memory_mib = nominal_memory_mib(model)
            mode = self._try("nvmlDeviceGetMigMode", h, default=None)
            active, _down, _peers, _switch = links[i]
            out.append(
                GpuInfo(
                    index=i,
                    uuid=self._uuids[i],
                    model=model,
                    memory_mib=memory_mib,
                    island=islands[i],
                    mig=bool(mode is not None and mode[0] == 1),  # [current, pending]
                    nvlinks=active if islands[i] >= 0 else 0,
                )
            )
        return tuple(out)

    def _links(self, handle: Any, by_bus: dict[tuple[int, int, int], int], strict: bool = False) -> _Links:
        """(active links, links down, peer GPU -> link count, attached to a switch). ``strict``
        lets ``GpuIsLost`` through, for health samples to report the GPU lost."""
        nv = self.nvml
        active = down = 0
        peers: dict[int, int] = {}
        switch = False
        for link in range(MAX_LINKS):
            try:
                state = nv.nvmlDeviceGetNvLinkState(handle, link)
            except nv.NVMLError as e:
                if strict and isinstance(e, nv.NVMLError_GpuIsLost):
                    raise
                continue  # no such link on this GPU (NotSupported, InvalidArgument)
            if state != 1:
                down += 1
                continue
            active += 1
            kind = self._try("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, default=None)
            remote = self._try("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, default=None)
            peer = by_bus.get(_bus(remote)) if remote is not None else None
            if kind == NVLINK_TO_SWITCH or (kind != NVLINK_TO_GPU and peer is None):
                # An NVSwitch, or a remote end that is no GPU of this node: the fabric.
                switch = True
            elif peer is not None:
                peers[peer] = peers.get(peer, 0) + 1
        return active, down, peers, switch

    def mig_devices(self, gpus: tuple[GpuInfo, ...]) -> tuple[MigDevice, ...]:
        out: list[MigDevice] = []
        for g in gpus:
            if not g.mig:
                continue
            h = self.handles[g.index]
            for i in range(self._try("nvmlDeviceGetMaxMigDeviceCount", h, default=0)):
                m = self._try("nvmlDeviceGetMigDeviceHandleByIndex", h, i, default=None)
                if m is None:
                    continue  # an empty index answers NotFound
                gi = self._try("nvmlDeviceGetGpuInstanceId", m, default=-1)
                memory = self._try("nvmlDeviceGetMemoryInfo", m, default=None)
                start, profile = self._mig_placement(h, gi, g.model)
                out.append(
                    MigDevice(
                        gpu=g.index,
                        parent_uuid=g.uuid,
                        uuid=str(self._try("nvmlDeviceGetUUID", m, default="")),
                        gpu_instance=gi,
                        compute_instance=self._try("nvmlDeviceGetComputeInstanceId", m, default=-1),
                        memory_mib=int(memory.total) // MIB if memory is not None else 0,
                        start=start,
                        profile=profile,
                    )
                )
        return tuple(out)

    def _mig_placement(self, handle: Any, gi_id: int, model: str) -> tuple[int, str]:
        if gi_id < 0:
            return -1, ""
        gi = self._try("nvmlDeviceGetGpuInstanceById", handle, gi_id, default=None)
        info = self._try("nvmlGpuInstanceGetInfo", gi, default=None) if gi is not None else None
        if info is None:
            return -1, ""
        return int(info.placement.start), mig_profile_name(model, int(info.profileId))

    # XID errors

    def watch_xids(self) -> bool:
        """Register for XID events on every GPU that supports them; False if none does. A GPU
        that refuses (NotSupported) is skipped: the event set stays usable for the others."""
        nv = self.nvml
        self._events = self._try("nvmlEventSetCreate", default=None)
        if self._events is None:
            return False
        watched = 0
        for h in self.handles:
            supported = self._try("nvmlDeviceGetSupportedEventTypes", h, default=0)
            mask = XID_EVENT & int(supported)
            if mask:
                try:
                    nv.nvmlDeviceRegisterEvents(h, mask, self._events)
                    watched += 1
                except nv.NVMLError:
                    continue
        return watched > 0

    def wait_xid(self, timeout_ms: int) -> XidReport | None:
        """The next XID, or None after ``timeout_ms``. Blocks: a service calls it in a thread."""
        nv = self.nvml
        if self._events is None:
            return None
        try:
            data = nv.nvmlEventSetWait(self._events, timeout_ms)
        except nv.NVMLError_Timeout:
            return None
        except nv.NVMLError:
            # The device plugin's rule: a wait that fails otherwise means the GPUs cannot be
            # watched; say so as an unknown XID on every GPU.
            return XidReport(gpu=-1, xid=UNKNOWN_XID)
        uuid = self._try("nvmlDeviceGetUUID", data.device, default="")
        gpu = self._uuids.index(uuid) if uuid in self._uuids else -1
        return XidReport(
            gpu=gpu,
            uuid=uuid if gpu >= 0 else "",
            xid=int(data.eventData),
            gpu_instance=_instance_id(data.gpuInstanceId),
            compute_instance=_instance_id(data.computeInstanceId),
        )

    # health

    def health(self) -> tuple[GpuHealthSample, ...]:
        return tuple(self._sample(i, h) for i, h in enumerate(self.handles))

    def _sample(self, index: int, h: Any) -> GpuHealthSample:
        nv = self.nvml
        uuid = self._uuids[index]
        try:
            nv.nvmlDeviceGetUUID(h)  # a GPU that fell off the bus answers GpuIsLost here first
            active, down, _peers, _switch = self._links(h, {}, strict=True)
        except nv.NVMLError_GpuIsLost:
            return GpuHealthSample(index=index, uuid=uuid, lost=True)
        except nv.NVMLError:
            active = down = 0
        ecc_u = self._try("nvmlDeviceGetTotalEccErrors", h, 1, 0, default=None)  # uncorrected, volatile
        ecc_c = self._try("nvmlDeviceGetTotalEccErrors", h, 0, 0, default=None)  # corrected, volatile
        rows = self._try("nvmlDeviceGetRemappedRows", h, default=None)  # (corr, unc, pending, failed)
        util = self._try("nvmlDeviceGetUtilizationRates", h, default=None)
        memory = self._try("nvmlDeviceGetMemoryInfo", h, default=None)
        temp = self._try("nvmlDeviceGetTemperatureV", h, 0, default=None)  # NVML_TEMPERATURE_GPU
        if temp is None:
            temp = self._try("nvmlDeviceGetTemperature", h, 0, default=None)  # before NVML 13
        power = self._try("nvmlDeviceGetPowerUsage", h, default=None)  # milliwatts
        reasons = self._try("nvmlDeviceGetCurrentClocksEventReasons", h, default=None)
        if reasons is None:
            reasons = self._try("nvmlDeviceGetCurrentClocksThrottleReasons", h, default=0)
        return GpuHealthSample(
            index=index,
            uuid=uuid,
            ecc_uncorrected=None if ecc_u is None else int(ecc_u),
            ecc_corrected=None if ecc_c is None else int(ecc_c),
            remap_pending=bool(rows is not None and rows[2]),
            remap_failed=bool(rows is not None and rows[3]),
            retired_pages_pending=bool(self._try("nvmlDeviceGetRetiredPagesPendingStatus", h, default=0)),
            nvlinks_active=active,
            nvlinks_down=down,
            utilisation_pct=None if util is None else int(util.gpu),
            memory_used_mib=None if memory is None else int(memory.used) // MIB,
            temperature_c=None if temp is None else int(temp),
            power_w=None if power is None else power / 1000.0,
            clock_event_reasons=int(reasons),
        )


_Links = tuple[int, int, dict[int, int], bool]
_NO_INSTANCE = 0xFFFFFFFF


def _instance_id(value: int) -> int:
    return -1 if int(value) == _NO_INSTANCE else int(value)


def _bus(pci: Any) -> tuple[int, int, int]:
    return int(pci.domain), int(pci.bus), int(pci.device)


def _islands(links: list[_Links]) -> list[int]:
    """Island per GPU: connected components over NVLink peers, every switch-attached GPU in one
    fabric; components of one GPU are ``-1``. Islands are numbered by their lowest GPU index."""
    parent = list(range(len(links)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    fabric = [i for i, (_a, _d, _p, switch) in enumerate(links) if switch]
    for i in fabric[1:]:
        join(fabric[0], i)
    for i, (_a, _d, peers, _s) in enumerate(links):
        for peer in peers:
            join(i, peer)
    sizes: dict[int, int] = {}
    for i in range(len(links)):
        sizes[root(i)] = sizes.get(root(i), 0) + 1
    numbers: dict[int, int] = {}
    out = []
    for i in range(len(links)):
        r = root(i)
        if sizes[r] < 2:
            out.append(-1)
        else:
            out.append(numbers.setdefault(r, len(numbers)))
    return out


def mig_profile_name(model: str, profile_id: int) -> str:
    """The name of GPU instance profile ``profile_id`` on ``model`` (``""`` if unknown)."""
    shape = _MIG_PROFILE_IDS.get(profile_id)
    if shape is None:
        return ""
    size, compute, me = shape
    for name, p in mig.profiles(model).items():
        if p.size == size and p.compute == compute and name.endswith("+me") == me:
            return name
    return ""


# -- the node --------------------------------------------------------------------------------------


def host_resources() -> tuple[int, int]:
    """This machine's (milli-CPU, memory MiB)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
    return cpus * 1000, int(memory)


def simulated(node: str, profile: str, labels: dict[str, str] | None = None, note: str = "") -> Discovery:
    """A simulated profile's inventory, with the health of GPUs that are all well."""
    if profile not in PROFILES:
        raise ValueError(f"unknown node profile {profile!r}; known: {', '.join(PROFILES)}")
    inv = PROFILES[profile](node)
    inv = NodeInventory(inv.cpu_milli, inv.memory_mib, inv.gpus, {"profile": profile, **(labels or {})})
    health = tuple(GpuHealthSample(index=g.index, uuid=g.uuid, nvlinks_active=g.nvlinks) for g in inv.gpus)
    return Discovery(source="simulated", inventory=inv, health=health, note=note)


def discover(
    node: str,
    *,
    nvml: Any | None = None,
    simulate: str | None = None,
    fallback: str | None = "h100-8x",
    labels: dict[str, str] | None = None,
    host: tuple[int, int] | None = None,
) -> Discovery:
    """The node's inventory: from NVML when it answers, else the simulated ``fallback`` profile.

    ``simulate`` forces a simulated profile (several simulated nodes on one machine); ``nvml``
    replaces pynvml (tests pass a fake); ``host`` replaces this machine's (milli-CPU, MiB). A
    production GPU node passes ``fallback=None``: a broken driver must then stop the agent with
    ``NvmlUnavailable`` rather than offer simulated GPUs to the placer.
    """
    if simulate is not None:
        return simulated(node, simulate, labels)

    def instead(why: str) -> Discovery:
        if fallback is None:
            raise NvmlUnavailable(why)
        return simulated(node, fallback, labels, note=why)

    module = nvml if nvml is not None else load_nvml()
    if module is None:
        return instead("pynvml is not installed")
    try:
        gpus_api = NvmlGpus(module)
    except NvmlUnavailable as e:
        return instead(str(e))
    try:
        if gpus_api.count == 0:
            return instead("NVML found no GPUs")
        gpus = gpus_api.gpus()
        cpu, memory = host if host is not None else host_resources()
        return Discovery(
            source="nvml",
            inventory=NodeInventory(cpu, memory, gpus, dict(labels or {})),
            health=gpus_api.health(),
            mig_devices=gpus_api.mig_devices(gpus),
            driver=gpus_api.driver(),
        )
    finally:
        gpus_api.close()


def main(argv: list[str]) -> int:
    node = argv[1] if len(argv) > 1 else os.uname().nodename
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(discover(node)).decode()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
