"""Recordings of NVML: what a machine's NVML answered replays to the same discovery, health and
XIDs, over the fake machines of ``test_discovery`` and over recordings of real GPU nodes kept in
``tests/golden/nvml/`` (each made there with ``python -m corral.services.agent.nvml_record``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pynvml
import pytest

from corral.events.heartbeats import GpuHealthSample
from corral.services.agent import nvml_record
from corral.services.agent.discovery import NvmlGpus, discover, nominal_memory_mib
from corral.services.agent.nvml_record import Recording, Replay
from corral.services.health.decide import sample_signals
from tests.unit.test_discovery import (
    HOST,
    NODE,
    FakeNvml,
    Gpu,
    Mig,
    a100_pcie_pairs,
    hgx_h100,
    t4_box,
)

RECORDINGS = sorted((Path(__file__).parent.parent / "golden" / "nvml").glob("*.json"))


def mig_a100() -> list[Gpu]:
    migs = [Mig("MIG-a", 1, 0, 9, 0, 19_968), Mig("MIG-b", 2, 0, 19, 4, 4_864)]
    return [Gpu("NVIDIA A100-SXM4-40GB", 0, 0x20B010DE, 0x10, mig_mode=(1, 1), migs=migs)]


@pytest.mark.parametrize("machine", [hgx_h100, a100_pcie_pairs, t4_box, mig_a100])
def test_a_recorded_machine_replays_to_the_same_discovery_health_and_xids(
    machine: Callable[[], list[Gpu]],
) -> None:
    fake = FakeNvml(machine())
    recording = Recording(fake)
    found = discover(NODE, nvml=recording, host=HOST)
    gpus = NvmlGpus(recording)
    watching = gpus.watch_xids()
    fake.xids.extend([(0, 79, 0xFFFFFFFF, 0xFFFFFFFF), pynvml.NVMLError_Unknown()])
    xids = [gpus.wait_xid(10) for _ in range(3)]
    gpus.close()

    # Through JSON, as a recording travels.
    calls = json.loads(json.dumps(recording.calls))
    replay = Replay(calls)
    assert discover(NODE, nvml=replay, host=HOST) == found
    again = NvmlGpus(replay)
    assert again.watch_xids() == watching
    assert [again.wait_xid(10) for _ in range(3)] == xids
    again.close()


def test_what_a_machine_was_never_asked_is_not_made_up() -> None:
    recording = Recording(FakeNvml(t4_box()))
    discover(NODE, nvml=recording, host=HOST)
    replay = Replay(recording.calls)
    with pytest.raises(LookupError, match="nvmlDeviceGetHandleByIndex"):
        replay.nvmlDeviceGetHandleByIndex(7)


def test_a_function_the_recorded_pynvml_lacked_is_missing_in_the_replay() -> None:
    class Older(FakeNvml):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlDeviceGetTemperatureV":
                raise AttributeError(name)
            return super().__getattribute__(name)

    recording = Recording(Older(t4_box()))
    found = discover(NODE, nvml=recording, host=HOST)
    replay = Replay(recording.calls)
    assert not hasattr(replay, "nvmlDeviceGetTemperatureV")
    assert discover(NODE, nvml=replay, host=HOST) == found


def as_json(value: Any) -> Any:
    return json.loads(msgspec.json.encode(value))


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_a_real_nodes_recording_replays_to_what_it_discovered(path: Path) -> None:
    recorded = json.loads(path.read_text())
    replay = Replay(recorded["calls"])
    found = discover(recorded["node"], nvml=replay, fallback=None, host=tuple(recorded["host"]))
    assert as_json(found) == recorded["discovery"]
    gpus = NvmlGpus(replay)
    health = gpus.health()
    assert as_json(health) == recorded["health"]
    assert gpus.watch_xids() == recorded["watching_xids"]
    assert as_json(gpus.wait_xid(recorded["xid_wait_ms"])) == recorded["xid"]
    gpus.close()
    # A node in service: every GPU a model corral knows, at its size, and nothing to drain for.
    for g, s in zip(found.inventory.gpus, health, strict=True):
        nominal = nominal_memory_mib(g.model)
        assert not nominal or 0.9 * nominal <= g.memory_mib <= 1.1 * nominal, g
        assert isinstance(s, GpuHealthSample) and sample_signals(s, g.nvlinks) == [], s


def test_there_is_a_recording_of_a_real_gpu_node() -> None:
    assert RECORDINGS, "tests/golden/nvml/ holds no recording"


def test_a_machine_whose_nvml_cannot_be_read_records_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError_DriverNotLoaded()

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    out = tmp_path / "node.json"
    assert nvml_record.main(["nvml_record", str(out), "gpu-1"]) == 1
    assert not out.exists()
    assert "nothing recorded: NVML: Driver Not Loaded" in capsys.readouterr().err
