"""``python -m bench.e2e`` at a tiny scale: it runs every part, places every job, prints figures
that are numbers, and leaves no process behind, whether it ends by itself or by Ctrl-C."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = [sys.executable, "-m", "bench.e2e"]
TINY = ["--nodes", "8", "--jobs", "50", "--queued", "100", "--anchor", "1000", "--idle", "1"]
TINY += ["--runtime-min", "1", "--runtime-max", "2", "--duration", "240"]
NUMBER = r"[\d,]+(?:\.\d+)?"


def survivors(url: str) -> list[str]:
    """Command lines of processes that still name the run's server (every part is given it)."""
    port = url.rsplit(":", 1)[1]
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if url in cmd or (f"-p {port}" in cmd and "nats-server" in cmd):
            found.append(cmd)
    return found


def url_of(out: str) -> str:
    m = re.search(r"nats-server at (nats://\S+)", out)
    assert m, out
    return m.group(1)


@pytest.mark.timeout(600)
def test_tiny_run_places_every_job_and_prints_figures() -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([*BENCH, *TINY], env=env, capture_output=True, text=True, timeout=540)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(rf"anchor: raw pipelined JetStream publish of 1,000 submit payloads: {NUMBER} /s", out)
    assert out.count("placed        50 of 50; rejected 0") == 2, out  # free capacity, then with a backlog
    assert len(re.findall(rf"placed/s +{NUMBER} .* = {NUMBER}% of the anchor", out)) == 2, out
    latencies = rf"submit→placed p50 {NUMBER} ms +p95 {NUMBER} ms +p99 {NUMBER} ms +max {NUMBER} ms"
    assert len(re.findall(latencies, out)) == 2, out
    # Every placed job's worker started, from its node's view alone (agents read no log).
    starts = rf"placed→started p50 {NUMBER} ms +p95 {NUMBER} ms +p99 {NUMBER} ms +max {NUMBER} ms; 50 of 50"
    assert len(re.findall(starts, out)) == 2, out
    assert len(re.findall(rf"placed→in view p50 {NUMBER} ms +p95 {NUMBER} ms +p99 {NUMBER} ms", out)) == 2, (
        out
    )
    assert len(re.findall(rf"placer +decisions +\d+ +lag p50 +{NUMBER} ms", out)) == 2, out
    assert len(re.findall(rf"assignments +views +\d+ +lag p50 +{NUMBER} ms", out)) == 2, out
    assert "submitted and accepted" in out, out
    # Every process, each phase: CPU seconds, share of a core, RSS and peak RSS in MiB.
    parts = ("nats-server", "admission", "placer", "preemptor", "health", "assignments", "query", "intake")
    for name in (*parts, "agents-0"):
        rows = re.findall(rf"^  {name} +{NUMBER} +\d+% +\d+ +\d+$", out, re.MULTILINE)
        assert len(rows) == 3, (name, out)
    # Each leased role led all along, and no cycle of any failed.
    for role in ("admission", "placer", "preemptor", "health", "assignments"):
        row = rf"^  {role} +leads +seq +{NUMBER} +cycles +{NUMBER} +failures 0$"
        assert re.search(row, out, re.MULTILINE), (role, out)
    assert survivors(url_of(out)) == []


@pytest.mark.timeout(300)
def test_ctrl_c_stops_every_process_it_started() -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [*BENCH, *TINY], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    try:
        while not any(s.startswith("  up:") for s in seen):  # every part started
            seen.append(lines.get(timeout=240))
        url = url_of("".join(seen))
        assert survivors(url), "the parts should be running now"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert survivors(url) == []
