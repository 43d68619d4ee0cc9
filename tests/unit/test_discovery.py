"""NVML discovery against a fake NVML: the same function names and error classes as pynvml, over
GPUs described in a few lines. Every capability a GPU lacks answers ``NotSupported`` as the real
library does, and discovery must treat that as a missing value, never an error.

The machines follow the simulated profiles of ``services.agent.inventory``, so the test can say "NVML
discovery of this machine equals its simulated profile" (UUIDs and host CPU/memory aside).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgspec
import pynvml
import pytest

from corral.events.nodes import GpuInfo, NodeInventory
from corral.services.agent.discovery import (
    MIB,
    GpuHealthSample,
    MigDevice,
    NvmlGpus,
    NvmlUnavailable,
    XidReport,
    discover,
    model_name,
)
from corral.services.agent.inventory import a100_8x_nvlink, h100_8x_nvswitch, t4_2x

NODE = "gpu-07"
HOST = (96_000, 512 * 1024)
SWITCH = "switch"

# -- the fake ---------------------------------------------------------------------------------------


@dataclass
class Link:
    remote: int | str  # a GPU index of this node, or SWITCH
    active: bool = True


@dataclass
class Mig:
    uuid: str
    gi: int
    ci: int
    profile_id: int
    start: int
    memory_mib: int


@dataclass
class Gpu:
    name: str
    memory_mib: int
    pci_device_id: int
    bus: int
    mig_mode: tuple[int, int] | None = None  # None: NotSupported (no MIG on this GPU)
    links: list[Link] = field(default_factory=list)  # none: NVLink NotSupported
    ecc_uncorrected: int | None = 0
    remap: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    migs: list[Mig] = field(default_factory=list)
    lost: bool = False
    index: int = 0


def not_supported() -> Exception:
    error: Exception = pynvml.NVMLError_NotSupported()
    return error


class FakeNvml:
    """pynvml's functions over a list of ``Gpu``; its error classes are pynvml's own."""

    def __init__(self, gpus: list[Gpu], init_error: type[Exception] | None = None, remote_type: bool = True):
        for name in dir(pynvml):
            if name.startswith("NVMLError"):
                setattr(self, name, getattr(pynvml, name))
        for i, g in enumerate(gpus):
            g.index = i
        self.gpus = gpus
        self.init_error = init_error
        self.remote_type = remote_type  # older drivers lack nvmlDeviceGetNvLinkRemoteDeviceType
        self.initialised = False
        self.shutdowns = 0

    def _gpu(self, h: Any) -> Gpu:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        if isinstance(h, Gpu) and h.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return h  # type: ignore[no-any-return]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Gpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: Gpu) -> str:
        return self._gpu(h).name

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if isinstance(h, Mig):
            return h.uuid
        return f"GPU-fake-{self._gpu(h).index:04d}"

    def nvmlDeviceGetPciInfo(self, h: Gpu) -> SimpleNamespace:
        g = self._gpu(h)
        return _pci(g.bus, g.pci_device_id)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> SimpleNamespace:
        mib = h.memory_mib if isinstance(h, Mig) else self._gpu(h).memory_mib
        return SimpleNamespace(total=mib * MIB, used=512 * MIB, free=(mib - 512) * MIB)

    def nvmlDeviceGetMigMode(self, h: Gpu) -> list[int]:
        g = self._gpu(h)
        if g.mig_mode is None:
            raise not_supported()
        return list(g.mig_mode)

    def _link(self, h: Gpu, link: int) -> Link:
        g = self._gpu(h)
        if not g.links:
            raise not_supported()
        if link >= len(g.links):
            raise pynvml.NVMLError_InvalidArgument()
        return g.links[link]

    def nvmlDeviceGetNvLinkState(self, h: Gpu, link: int) -> int:
        return 1 if self._link(h, link).active else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Gpu, link: int) -> int:
        if not self.remote_type:
            raise pynvml.NVMLError_FunctionNotFound()
        return 2 if self._link(h, link).remote == SWITCH else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Gpu, link: int) -> SimpleNamespace:
        remote = self._link(h, link).remote
        if remote == SWITCH:
            return _pci(0xC0 + link % 4, 0x22A310DE)  # an NVSwitch's own PCI address
        return _pci(self.gpus[int(remote)].bus, self.gpus[int(remote)].pci_device_id)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Gpu) -> int:
        g = self._gpu(h)
        return 7 if g.mig_mode and g.mig_mode[0] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Gpu, i: int) -> Mig:
        g = self._gpu(h)
        if i >= len(g.migs):
            raise pynvml.NVMLError_NotFound()
        return g.migs[i]

    def nvmlDeviceGetGpuInstanceId(self, m: Mig) -> int:
        return m.gi

    def nvmlDeviceGetComputeInstanceId(self, m: Mig) -> int:
        return m.ci

    def nvmlDeviceGetGpuInstanceById(self, h: Gpu, gi: int) -> Mig:
        return next(m for m in self._gpu(h).migs if m.gi == gi)

    def nvmlGpuInstanceGetInfo(self, m: Mig) -> SimpleNamespace:
        return SimpleNamespace(
            id=m.gi, profileId=m.profile_id, placement=SimpleNamespace(start=m.start, size=4)
        )

    def nvmlDeviceGetTotalEccErrors(self, h: Gpu, error_type: int, counter: int) -> int:
        g = self._gpu(h)
        if g.ecc_uncorrected is None:
            raise not_supported()
        return g.ecc_uncorrected if error_type == 1 else 5

    def nvmlDeviceGetRemappedRows(self, h: Gpu) -> tuple[int, int, int, int]:
        g = self._gpu(h)
        if g.remap is None or (g.mig_mode and g.mig_mode[0]):
            raise not_supported()  # NVML: not supported while MIG is enabled
        return g.remap

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Gpu) -> int:
        self._gpu(h)
        raise not_supported()  # row remapping replaced page retirement on these GPUs

    def nvmlDeviceGetUtilizationRates(self, h: Gpu) -> SimpleNamespace:
        g = self._gpu(h)
        if g.mig_mode and g.mig_mode[0]:
            raise not_supported()
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperatureV(self, h: Gpu, sensor: int) -> int:
        self._gpu(h)
        return 64

    def nvmlDeviceGetPowerUsage(self, h: Gpu) -> int:
        self._gpu(h)
        return 612_500

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Gpu) -> int:
        self._gpu(h)
        return 0x1

    # XID events: ``xids`` holds (GPU index, XID, GPU instance, compute instance), or an error.

    xids: list[tuple[int, int, int, int] | Exception]
    registered: list[int]
    freed = False

    def nvmlEventSetCreate(self) -> str:
        self.xids, self.registered = [], []
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: Gpu) -> int:
        return 0x8 | 0x2 if self._gpu(h).ecc_uncorrected is not None else 0x2  # no XIDs without ECC here

    def nvmlDeviceRegisterEvents(self, h: Gpu, mask: int, events: str) -> None:
        assert mask == 0x8 and events == "event-set"
        self.registered.append(self._gpu(h).index)

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> SimpleNamespace:
        if not self.xids:
            raise pynvml.NVMLError_Timeout()
        head = self.xids.pop(0)
        if isinstance(head, Exception):
            raise head
        gpu, xid, gi, ci = head
        return SimpleNamespace(
            device=self.gpus[gpu], eventType=0x8, eventData=xid, gpuInstanceId=gi, computeInstanceId=ci
        )

    def nvmlEventSetFree(self, events: str) -> None:
        self.freed = True


def _pci(bus: int, device_id: int) -> SimpleNamespace:
    return SimpleNamespace(
        domain=0, bus=bus, device=0, pciDeviceId=device_id, busId=f"00000000:{bus:02X}:00.0".encode()
    )


# -- machines ---------------------------------------------------------------------------------------


def hgx_h100(**kw: Any) -> list[Gpu]:
    """HGX H100 8-GPU: 18 NVLink4 links per GPU, every one to an NVSwitch."""
    return [
        Gpu("NVIDIA H100 80GB HBM3", 81_559, 0x233010DE, 0x18 + i, links=[Link(SWITCH)] * 18, **kw)
        for i in range(8)
    ]


def a100_pcie_pairs() -> list[Gpu]:
    """Eight A100 80GB PCIe cards joined in pairs by NVLink bridges (12 links each)."""
    return [
        Gpu("NVIDIA A100 80GB PCIe", 81_920, 0x20B510DE, 0x30 + i, links=[Link(i ^ 1)] * 12) for i in range(8)
    ]


def t4_box() -> list[Gpu]:
    return [Gpu("Tesla T4", 15_360, 0x1EB810DE, 0x40 + i, remap=None) for i in range(2)]


def nvml_discover(gpus: list[Gpu], **kw: Any) -> tuple[Any, FakeNvml]:
    fake = FakeNvml(gpus, **kw)
    return discover(NODE, nvml=fake, host=HOST, labels={"rack": "r1"}), fake


def shape(gpus: tuple[GpuInfo, ...]) -> list[GpuInfo]:
    """GPUs without their UUIDs, which only real hardware names."""
    return [msgspec.structs.replace(g, uuid="") for g in gpus]


# -- inventories ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "profile"),
    [
        pytest.param(hgx_h100, h100_8x_nvswitch, id="8xH100-nvswitch"),
        pytest.param(a100_pcie_pairs, a100_8x_nvlink, id="8xA100-nvlink-pairs"),
        pytest.param(t4_box, t4_2x, id="2xT4-pcie"),
    ],
)
def test_nvml_discovery_equals_the_simulated_profile(
    machine: Callable[[], list[Gpu]], profile: Callable[[str], NodeInventory]
) -> None:
    d, fake = nvml_discover(machine())
    assert (d.source, d.driver, d.note) == ("nvml", "550.90.07", "")
    assert shape(d.inventory.gpus) == shape(profile(NODE).gpus)
    assert (d.inventory.cpu_milli, d.inventory.memory_mib, d.inventory.labels) == (*HOST, {"rack": "r1"})
    assert [g.uuid for g in d.inventory.gpus] == [f"GPU-fake-{i:04d}" for i in range(len(machine()))]
    assert fake.shutdowns == 1 and not fake.initialised


def test_older_drivers_without_remote_device_type_still_find_switches_and_peers() -> None:
    for machine, profile in ((hgx_h100, h100_8x_nvswitch), (a100_pcie_pairs, a100_8x_nvlink)):
        d, _ = nvml_discover(machine(), remote_type=False)
        assert shape(d.inventory.gpus) == shape(profile(NODE).gpus)


def test_a_4_gpu_board_with_direct_nvlinks_is_one_island() -> None:
    def nv6(i: int) -> list[Link]:
        return [Link(peer) for peer in range(4) if peer != i for _ in range(6)]  # NV6 to each of 3 peers

    gpus = [Gpu("NVIDIA H100 80GB HBM3", 81_559, 0x233010DE, 0x18 + i, links=nv6(i)) for i in range(4)]
    d, _ = nvml_discover(gpus)
    assert [(g.island, g.nvlinks) for g in d.inventory.gpus] == [(0, 18)] * 4


def test_switch_attached_and_pcie_only_gpus_on_one_node() -> None:
    gpus = hgx_h100()[:4] + [Gpu("NVIDIA H100 PCIe", 81_559, 0x233110DE, 0x60 + i) for i in range(2)]
    d, _ = nvml_discover(gpus)
    assert [(g.island, g.nvlinks) for g in d.inventory.gpus] == [(0, 18)] * 4 + [(-1, 0)] * 2


def test_two_bridged_pairs_are_two_islands_numbered_by_lowest_gpu() -> None:
    gpus = [Gpu("NVIDIA A100 80GB PCIe", 81_920, 0x20B510DE, 0x30 + i) for i in range(4)]
    gpus[1].links = [Link(3)] * 4
    gpus[3].links = [Link(1)] * 4
    gpus[0].links = [Link(2)] * 4
    gpus[2].links = [Link(0)] * 4
    d, _ = nvml_discover(gpus)
    assert [g.island for g in d.inventory.gpus] == [0, 1, 0, 1]


def test_a_link_that_is_down_is_not_counted() -> None:
    gpus = hgx_h100()
    gpus[2].links = [Link(SWITCH)] * 17 + [Link(SWITCH, active=False)]
    d, _ = nvml_discover(gpus)
    assert d.inventory.gpus[2].nvlinks == 17
    assert (d.health[2].nvlinks_active, d.health[2].nvlinks_down) == (17, 1)


def test_a_mig_enabled_gpu_and_its_instances() -> None:
    gpus = hgx_h100()
    gpus[0].mig_mode = (1, 1)
    gpus[0].migs = [
        Mig("MIG-aaaa", gi=1, ci=0, profile_id=9, start=4, memory_mib=40_192),
        Mig("MIG-bbbb", gi=2, ci=0, profile_id=19, start=0, memory_mib=9_856),
    ]
    gpus[1].mig_mode = (0, 1)  # enabled at the next reset: not MIG now
    d, _ = nvml_discover(gpus)
    assert [g.mig for g in d.inventory.gpus[:3]] == [True, False, False]
    assert d.mig_devices == (
        MigDevice(0, "GPU-fake-0000", "MIG-aaaa", 1, 0, 40_192, start=4, profile="3g.40gb"),
        MigDevice(0, "GPU-fake-0000", "MIG-bbbb", 2, 0, 9_856, start=0, profile="1g.10gb"),
    )
    # No row-remap counters or utilisation while MIG is on: missing values, not errors.
    assert (d.health[0].remap_pending, d.health[0].utilisation_pct) == (False, None)
    assert d.health[1].utilisation_pct == 87


# -- health ----------------------------------------------------------------------------------------


def test_health_counters_are_sampled_and_not_supported_is_none() -> None:
    gpus = hgx_h100()
    gpus[3].ecc_uncorrected = 2
    gpus[4].remap = (10, 1, 1, 0)
    d, _ = nvml_discover(gpus + t4_box())
    h = d.health
    assert h[0] == GpuHealthSample(
        index=0, uuid="GPU-fake-0000", ecc_uncorrected=0, ecc_corrected=5, nvlinks_active=18,
        utilisation_pct=87, memory_used_mib=512, temperature_c=64, power_w=612.5, clock_event_reasons=1,
    )  # fmt: skip
    assert h[3].ecc_uncorrected == 2 and h[4].remap_pending and not h[4].remap_failed
    assert (h[8].nvlinks_active, h[8].remap_pending, h[8].retired_pages_pending) == (0, False, False)


def test_a_gpu_lost_during_discovery_is_reported_not_fatal() -> None:
    gpus = hgx_h100()
    gpus[5].lost = True
    d, _ = nvml_discover(gpus)
    assert len(d.inventory.gpus) == 8 and d.health[5].lost
    assert d.inventory.gpus[5].memory_mib == 0 and d.inventory.gpus[4].island == 0


def test_a_fake_without_newer_functions_still_samples() -> None:
    fake = FakeNvml(hgx_h100())
    fake.nvmlDeviceGetTemperatureV = None  # type: ignore[assignment,method-assign]
    fake.nvmlDeviceGetTemperature = lambda h, s: 50  # type: ignore[attr-defined]
    d = discover(NODE, nvml=fake, host=HOST)
    assert d.health[0].temperature_c == 50


def test_a_pynvml_without_a_function_is_a_missing_capability() -> None:
    fake = FakeNvml(hgx_h100())
    fake.nvmlDeviceGetNvLinkRemoteDeviceType = None  # type: ignore[assignment,method-assign]
    fake.nvmlDeviceGetRemappedRows = None  # type: ignore[assignment,method-assign]
    d = discover(NODE, nvml=fake, host=HOST)
    assert shape(d.inventory.gpus) == shape(h100_8x_nvswitch(NODE).gpus)
    assert not d.health[0].remap_pending


def test_a_mig_gpu_that_hides_its_memory_gets_its_models_size() -> None:
    fake = FakeNvml(hgx_h100())
    fake.gpus[0].mig_mode = (1, 1)
    real = fake.nvmlDeviceGetMemoryInfo

    def memory(h: Any) -> SimpleNamespace:
        if h is fake.gpus[0]:
            raise pynvml.NVMLError_NoPermission()  # the parent of MIG instances, unprivileged
        return real(h)

    fake.nvmlDeviceGetMemoryInfo = memory  # type: ignore[method-assign]
    d = discover(NODE, nvml=fake, host=HOST)
    assert (d.inventory.gpus[0].model, d.inventory.gpus[0].memory_mib) == ("H100-80GB", 81_559)


def test_xid_events_are_read_per_gpu_and_mig_instance() -> None:
    gpus = hgx_h100() + t4_box()
    gpus[9].ecc_uncorrected = None  # this one offers no XID events: skipped, the rest still watched
    fake = FakeNvml(gpus)
    nvml = NvmlGpus(fake)
    assert nvml.watch_xids() and fake.registered == list(range(9))
    none = 0xFFFFFFFF
    fake.xids += [(3, 79, none, none), (0, 48, 1, 0), pynvml.NVMLError_Unknown()]
    uuids = [fake.nvmlDeviceGetUUID(h) for h in nvml.handles]
    assert nvml.wait_xid(100) == XidReport(gpu=3, xid=79, uuid=uuids[3])
    assert nvml.wait_xid(100) == XidReport(gpu=0, xid=48, gpu_instance=1, compute_instance=0, uuid=uuids[0])
    assert nvml.wait_xid(100) == XidReport(gpu=-1, xid=999)  # cannot watch: no GPU named
    assert nvml.wait_xid(100) is None  # a timeout: nothing happened
    nvml.close()
    assert fake.freed and fake.shutdowns == 1


# -- no NVML ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_NoPermission],
)
def test_without_nvml_the_simulated_profile_stands_in(error: type[Exception]) -> None:
    d, _ = nvml_discover(hgx_h100(), init_error=error)
    assert d.source == "simulated" and d.note.startswith("NVML: ")
    assert d.inventory.gpus == h100_8x_nvswitch(NODE).gpus
    assert d.inventory.labels == {"profile": "h100-8x", "rack": "r1"}
    assert all(s.nvlinks_active == 18 and not s.lost for s in d.health)


def test_a_gpu_node_can_refuse_to_pretend() -> None:
    fake = FakeNvml(hgx_h100(), init_error=pynvml.NVMLError_DriverNotLoaded)
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        discover(NODE, nvml=fake, fallback=None)


def test_no_gpus_falls_back_to_the_simulated_profile() -> None:
    d, fake = nvml_discover([])
    assert (d.source, d.note, fake.shutdowns) == ("simulated", "NVML found no GPUs", 1)


def test_a_simulated_profile_can_be_forced() -> None:
    d = discover(NODE, nvml=FakeNvml(hgx_h100()), simulate="t4-2x")
    assert d.source == "simulated" and d.inventory.gpus == t4_2x(NODE).gpus and d.note == ""


def test_the_real_pynvml_on_this_machine_never_crashes_discovery() -> None:
    d = discover(NODE)
    assert d.source in ("nvml", "simulated") and d.inventory.gpus


# -- model names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory_mib", "pci", "model"),
    [
        ("NVIDIA H100 80GB HBM3", 81_559, None, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81_559, None, "H100-80GB"),
        ("NVIDIA H100 NVL", 95_830, None, "H100-NVL"),
        ("NVIDIA H200", 143_771, None, "H200-141GB"),
        ("NVIDIA H200", 143_771, 0x233510DE, "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", 40_960, None, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81_920, None, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81_920, None, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40_536, 0x20F110DE, "A100-40GB"),
        ("Tesla T4", 15_360, None, "T4"),
        ("NVIDIA L40S", 46_068, None, "L40S"),
        ("NVIDIA GH200 480GB", 97_871, None, "GH200-96GB"),
        ("Tesla V100-SXM2-32GB", 32_768, None, "V100-32GB"),
        ("NVIDIA Graphics Device", 8_192, None, "Graphics-Device"),
    ],
)
def test_model_names(name: str, memory_mib: int, pci: int | None, model: str) -> None:
    assert model_name(name, memory_mib, pci) == model
