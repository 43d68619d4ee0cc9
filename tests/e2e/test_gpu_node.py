"""A real GPU node: NVML discovery of this machine's GPUs, its health as the agent samples it, a
recording of its NVML that replays to the same discovery, and a job placed on one of its GPUs
that sees that GPU, and only it, through CUDA.

Skipped where NVML finds no GPU (CI has none); run on a GPU node with
``pytest tests/e2e/test_gpu_node.py``. The services run as an operator runs them: ``corral up``
with one simulated node beside, and this machine's agent as ``corral serve agent --gpus nvml``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from corral.events import codec, subjects
from corral.events.heartbeats import GpuHealthSample
from corral.events.nodes import NodeRegistered
from corral.services.agent import discovery
from corral.services.agent.nvml_record import Replay, record
from corral.services.health.decide import sample_signals
from tests.e2e.test_cli import corral

CORRAL = [sys.executable, "-m", "corral"]
NODE = "gpu-node"


def _found() -> discovery.Discovery | None:
    try:
        return discovery.discover(NODE, fallback=None)
    except discovery.NvmlUnavailable:
        return None


FOUND = _found()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(FOUND is None, reason="NVML finds no GPU on this machine"),
]

# What each worker runs: CUDA's own view of the GPUs it was given (the driver API, so no
# framework is needed), as UUIDs in NVML's spelling.
SEE_GPUS = r"""
import ctypes, os
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
count = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
seen = []
for i in range(count.value):
    dev, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
    assert cuda.cuDeviceGet(ctypes.byref(dev), i) == 0
    assert cuda.cuDeviceGetUuid(raw, dev) == 0
    h = bytes(raw).hex()
    seen.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
print("SEES", ",".join(seen), "VISIBLE", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""

QUEUES = """
[[cohorts]]
name = "all"

[[queues]]
name = "gpu"
cohort = "all"
tenants = ["team-a"]
quotas = { "*" = { nominal = 64 } }
"""


def found() -> discovery.Discovery:
    assert FOUND is not None
    return FOUND


def test_every_gpu_is_a_model_corral_knows_with_its_memory() -> None:
    d = found()
    assert d.source == "nvml" and d.driver
    for g in d.inventory.gpus:
        nominal = discovery.nominal_memory_mib(g.model)
        assert g.uuid.startswith(("GPU-", "MIG-")), g
        assert g.model and g.model != "unknown", g
        if nominal:  # NVML's total is the usable memory: a few percent under the name's size
            assert 0.9 * nominal <= g.memory_mib <= 1.1 * nominal, g
        assert g.island == -1 or g.nvlinks > 0, g


def test_the_agents_health_sample_of_every_gpu_is_sound() -> None:
    d = found()
    assert len(d.health) == len(d.inventory.gpus)
    for gpu, s in zip(d.inventory.gpus, d.health, strict=True):
        assert (s.index, s.uuid, s.lost) == (gpu.index, gpu.uuid, False)
        assert s.memory_used_mib is not None and s.temperature_c is not None
        # A GPU in service here has no uncorrected errors or failed remaps: nothing to drain for.
        assert [sig for sig in sample_signals(s, expected_nvlinks=gpu.nvlinks)] == [], s


def test_a_recording_of_this_machines_nvml_replays_to_the_same_discovery() -> None:
    recorded = record(NODE, xid_wait_ms=200)
    replayed = discovery.discover(
        NODE, nvml=Replay(recorded["calls"]), fallback=None, host=tuple(recorded["host"])
    )
    assert replayed == msgspec.convert(recorded["discovery"], discovery.Discovery)
    assert replayed.mig_devices == found().mig_devices
    # The recorded health sample decodes as the agent's own.
    samples = msgspec.convert(recorded["health"], tuple[GpuHealthSample, ...])
    assert [s.uuid for s in samples] == [g.uuid for g in found().inventory.gpus]


def background(args: list[str], env: dict[str, str], ready: str) -> tuple[subprocess.Popen[str], list[str]]:
    """A corral process in the background, once it prints a line starting with ``ready``."""
    proc = subprocess.Popen(
        [*CORRAL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    while not any(line.startswith(ready) for line in seen):
        try:
            seen.append(lines.get(timeout=60))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"corral {args[0]} did not start:\n" + "".join(seen)) from None
    return proc, seen


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": path}


@pytest.fixture
def gpu_node(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """``corral up`` with one simulated T4 node, and this machine's agent beside it."""
    up, seen = background(
        ["up", "--nodes", "1", "--profile", "t4-2x", "--data", str(tmp_path / "data")], env, "corral is up at"
    )
    url = next(line for line in seen if line.startswith("corral is up at")).split()[-1]
    agent = subprocess.Popen(
        [*CORRAL, "serve", "agent", "--node", NODE, "--gpus", "nvml", "--sandbox", "none"]
        + ["--work-dir", str(tmp_path / "work"), "--server", url],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield url
    finally:
        stop(agent)
        stop(up)


async def registered(url: str, node: str) -> NodeRegistered:
    """The node's registration, read from the log (every record about the node, from the first)."""
    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().subscribe(subjects.node(node), ordered_consumer=True)
        while True:
            msg = await sub.next_msg(timeout=60)
            body, _, _ = codec.decode_body(msg.subject, msg.data, msg.headers)
            if isinstance(body, NodeRegistered):
                return body
    finally:
        await nc.close()


async def test_a_job_placed_on_a_gpu_of_this_node_sees_that_gpu_through_cuda(
    gpu_node: str, env: dict[str, str], tmp_path: Path
) -> None:
    d = found()
    model = d.inventory.gpus[0].model
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    corral("queue", "apply", str(queues), "--server", gpu_node, env=env)

    await registered(gpu_node, NODE)

    job = ["submit", "--queue", "gpu", "--tenant", "team-a", "--gpu-model", model, "--server", gpu_node]
    job_id = corral(*job, "--gpus", "1", "--command", sys.executable, "-c", SEE_GPUS, env=env).stdout.strip()
    out = corral("logs", job_id, "-f", "--server", gpu_node, env=env).stdout
    line = next((x for x in out.splitlines() if "SEES" in x), "")
    seen = line.split("SEES", 1)[1].split()[0].split(",") if line else []
    assert len(seen) == 1 and seen[0] in {g.uuid for g in d.inventory.gpus}, out

    # The node as the scheduler holds it, after the agent's heartbeats of NVML's health samples.
    nodes = json.loads(corral("nodes", "-o", "json", "--server", gpu_node, env=env).stdout)
    row = next(n for n in nodes if n["name"] == NODE)
    assert (row["condition"], row["unhealthy"]) == ("ready", []), row
    assert (row["gpus"], row["model"]) == (len(d.inventory.gpus), model), row

    # More GPUs per worker than any node with this model has: refused at submission, with why.
    too_big = corral(*job, "--gpus", str(len(d.inventory.gpus) + 1), env=env, check=False)
    assert too_big.returncode != 0 and too_big.stderr.strip(), too_big
