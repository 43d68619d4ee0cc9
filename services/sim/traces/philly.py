"""Microsoft's Philly trace (Jeon et al., ATC'19): arrivals, durations, GPU counts and the
virtual cluster (a team) of 82,247 jobs, as processed for the Pollux and Sia simulators."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

DEFAULT = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "philly" / "philly.csv"


class PhillyJob(NamedTuple):
    arrival: float  # unix seconds
    duration: float  # seconds it ran
    gpus: int
    team: str  # the virtual cluster's hash


def read(path: str | Path = DEFAULT) -> Iterator[PhillyJob]:
    """Jobs in arrival order (the file is not sorted); rows without GPUs are skipped."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(float(row["num_gpus"]))
            if gpus <= 0:
                continue
            # fromisoformat reads "YYYY-MM-DD HH:MM:SS" as strptime does, at a tenth of the cost
            when = dt.datetime.fromisoformat(row["timestamp"]).replace(tzinfo=dt.UTC)
            rows.append(PhillyJob(when.timestamp(), float(row["duration"]), gpus, row["cluster"]))
    rows.sort()
    yield from rows


def find(explicit: str | None = None) -> Path:
    """The trace file: the given path, $CORRAL_TRACES/philly/philly.csv, or shared/ beside the repo."""
    import os

    if explicit:  # a path the person gave is the one they meant: never another trace instead
        if not Path(explicit).is_file():
            raise FileNotFoundError(f"{explicit}: no such file")
        return Path(explicit)
    for candidate in (
        os.environ.get("CORRAL_TRACES") and Path(os.environ["CORRAL_TRACES"]) / "philly" / "philly.csv",
        DEFAULT,
        Path.cwd().parent / "shared" / "traces" / "philly" / "philly.csv",
    ):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    raise FileNotFoundError("philly.csv not found: pass its path or set CORRAL_TRACES")
