"""``python -m bench.eta`` on a tiny hand-made trace in Philly's format: it runs, forecasts jobs
that wait, and prints every figure the issue asks for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from bench import eta


def trace(tmp_path: Path, jobs: Iterable[tuple[str, int, int, int]]) -> Path:
    """A trace in Philly's format, one row per job: (time of day submitted, seconds, GPUs, team)."""
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rows += [f"2017-10-23 {at},{s},{gpus},{gpus * s},team{team}" for at, s, gpus, team in jobs]
    csv = tmp_path / "philly.csv"
    csv.write_text("\n".join(rows) + "\n")
    return csv


def test_bench_eta_on_a_tiny_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 40 jobs over 20 minutes on one 8-GPU node: most of them wait
    jobs = (
        (f"00:{i // 2:02d}:{(i % 2) * 30:02d}", 600 + 300 * (i % 5), (1, 2, 4, 8)[i % 4], i % 3)
        for i in range(40)
    )
    csv = trace(tmp_path, jobs)
    eta.main(["--trace", str(csv), "--jobs", "40", "--nodes", "1"])
    out = capsys.readouterr().out
    all_row = re.search(r"^all\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$", out, re.M)
    assert all_row is not None, out
    assert int(all_row[1]) == 40 and int(all_row[5]) > 0  # every job forecast, some again while waiting
    assert "runtime estimate at submission" in out and "elapsed" in out
    assert re.search(r"goal: >= 80 % within the band at submission: [\d.]+ %", out)


def test_the_figures_do_not_depend_on_how_many_processes_forecast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forecasts run beside the replay in other processes print the very figures of forecasts
    run in it, one after the other."""
    csv = trace(
        tmp_path, ((f"00:{i:02d}:00", 500 + 700 * (i % 3), (1, 2, 4, 8)[i % 4], i % 2) for i in range(30))
    )
    printed = []
    for workers in ("1", "2"):
        eta.main(["--trace", str(csv), "--jobs", "30", "--nodes", "1", "--workers", workers, "--band"])
        out = capsys.readouterr().out
        # the figures, without the lines that say how long it took or how loaded the machine was
        printed.append([ln for ln in out.splitlines() if not re.search(r"elapsed|took|load average", ln)])
    assert printed[0] == printed[1]
    assert any(ln.startswith("all ") for ln in printed[0])


def test_a_sample_forecasts_some_submissions_as_the_whole_run_does(tmp_path: Path) -> None:
    """``--sample 3`` forecasts the jobs of every third submission time only, and each of them
    as the whole run does: the replay and the calibration do not change."""
    csv = trace(
        tmp_path, ((f"00:{i:02d}:00", 400 + 500 * (i % 4), (1, 2, 4, 8)[i % 4], i % 3) for i in range(60))
    )
    dumps = {}
    for sample in ("1", "3"):
        dump = tmp_path / f"{sample}.jsonl"
        eta.main(
            [
                "--trace",
                str(csv),
                "--jobs",
                "60",
                "--nodes",
                "1",
                "--again",
                "0",
                "--sample",
                sample,
                "--dump",
                str(dump),
            ]
        )
        dumps[sample] = {r["id"]: r for r in map(json.loads, dump.read_text().splitlines())}
    whole, some = dumps["1"], dumps["3"]
    assert len(whole) == 60 and 10 <= len(some) <= 30
    assert all(whole[i] == row for i, row in some.items())


@pytest.mark.parametrize(
    "argv", [("--resolution", "-0.1"), ("--resolution", "nan"), ("--workers", "0"), ("--sample", "0")]
)
def test_a_mistaken_flag_is_one_line_and_no_run(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        eta.main(list(argv))
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"{argv[0]} must be" in err and "Traceback" not in err


def test_the_figures_do_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    """Which finished jobs calibrate the forecasts (the latest ``CALIBRATE_FROM``) is decided in
    the order they finished, not in a set's order, which changes with Python's hash seed: the
    same replay forecasts the same starts under any seed. Calibrated from the latest 4, where
    16 jobs finish between two forecasts, any other order would drop other jobs' errors."""
    # six hourly bursts of 16 1-GPU jobs on 8 GPUs: each burst ends within the hour, all at once
    # for the forecasts of the next
    csv = trace(tmp_path, ((f"0{i // 16}:00:00", 100 + 83 * (i * 7 % 16), 1, i % 2) for i in range(96)))
    run = (
        "import sys; from corral.services.sim import eta; eta.CALIBRATE_FROM = 4; eta.MIN_CALIBRATION = 2; "
        "from bench import eta as bench; bench.main(sys.argv[1:])"
    )
    argv = ["--trace", str(csv), "--jobs", "96", "--nodes", "1", "--again", "0"]
    dumps = []
    for seed in ("1", "2", "3"):
        dump = tmp_path / f"{seed}.jsonl"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        cmd = [sys.executable, "-c", run, *argv, "--dump", str(dump)]
        subprocess.run(cmd, env=env, cwd=Path(__file__).parents[2], check=True, capture_output=True)
        dumps.append(dump.read_text())
    assert dumps[0] == dumps[1] == dumps[2] and dumps[0].count("\n") == 96
