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
    m = re.search(r"nats-servers? (?:\(R3\) )?at (nats://\S+)", out)
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
    # The idle window begins once the mix's jobs have ended: what remains is the backlog's turnover.
    assert re.search(rf"the mix's 50 jobs ended {NUMBER} s later", out), out
    assert re.search(rf"log records meanwhile: {NUMBER}", out), out
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
def test_tiny_run_on_a_cluster_of_three_places_every_job() -> None:
    """``--cluster 3``: three servers, everything R3, every part given all three URLs; the
    client paced (``--rate``)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    tiny = ["--cluster", "3", "--nodes", "4", "--jobs", "20", "--queued", "0", "--anchor", "500"]
    tiny += ["--runtime-min", "1", "--runtime-max", "2", "--duration", "120", "--rate", "20"]
    done = subprocess.run([*BENCH, *tiny], env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # Paced: the 20th submission goes 19/20 s after the first.
    assert "free capacity: 20 jobs of the mix, submitted at 20/s" in out, out
    took = re.search(rf"submitted     20 through the intake in ({NUMBER}) s", out)
    assert took and float(took.group(1)) >= 0.95, out
    assert re.search(r"3 nats-servers \(R3\) at nats://[\d.:]+,nats://[\d.:]+,nats://[\d.:]+$", out, re.M), (
        out
    )
    assert "placed        20 of 20; rejected 0" in out, out
    for i in (1, 2, 3):
        assert re.search(rf"^  nats-server-{i} +{NUMBER} +\d+% +\d+ +\d+$", out, re.MULTILINE), (i, out)
    for role in ("admission", "placer", "preemptor", "health", "assignments"):
        row = rf"^  {role} +leads +seq +{NUMBER} +cycles +{NUMBER} +failures 0$"
        assert re.search(row, out, re.MULTILINE), (role, out)
    assert survivors(url_of(out)) == []


@pytest.mark.timeout(300)
def test_tiny_soak_prints_each_step_and_the_table() -> None:
    """Until 40 jobs have finished, figures every 20: each leased service's cycles and CPU per
    cycle and per finished job, every process's RSS; then the steps side by side."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    argv = [*BENCH, "--soak", "--soak-jobs", "40", "--soak-every", "20", "--nodes", "8", "--anchor", "500"]
    argv += ["--runtime-min", "0.5", "--runtime-max", "1", "--duration", "240", "--retention", "5"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "until 40 jobs have finished (retention 5 s of log time)" in out, out
    for role in ("admission", "placer", "preemptor", "health", "assignments"):
        step = rf"^ +{role} +[\d,]+ cycles +(?:{NUMBER}|nan) ms/cycle +{NUMBER} ms/job"
        assert len(re.findall(step, out, re.MULTILINE)) == 2, (role, out)
    table = out.split("soak table:")[1]
    rows = re.findall(rf"^ +[\d,]+ +{NUMBER} (?:.*\d)$", table, re.MULTILINE)
    assert len(rows) == 2 and all(int(r.split()[0].replace(",", "")) >= 20 for r in rows), table
    assert survivors(url_of(out)) == []


@pytest.mark.parametrize(
    "bad",
    [["--soak-every", "-1"], ["--retention", "-5"], ["--rate", "-1"], ["--rate", "nan"]],
    ids=["every", "retention", "negative-rate", "nan-rate"],
)
def test_options_that_are_no_count_are_refused(bad: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([*BENCH, "--soak", *bad], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and bad[0] in done.stderr.splitlines()[-1], done.stderr


def test_compare_r1_is_refused_with_soak_or_cluster() -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for extra in (["--soak"], ["--cluster", "3"]):
        done = subprocess.run([*BENCH, "--compare-r1", *extra], env=env, capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert "--compare-r1" in done.stderr.splitlines()[-1], done.stderr


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
