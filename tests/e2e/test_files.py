"""The CLI's refusals of wrong files, end to end (one line on stderr, exit status 2, before any
server is asked: the one named here is not there), and the progress bars of long work: shown
when stderr is a terminal (a pseudo-terminal here), absent when it is piped."""

from __future__ import annotations

import fcntl
import os
import pty
import resource
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from corral.services.cli import logfile

pytestmark = pytest.mark.e2e

CORRAL = [sys.executable, "-m", "corral"]
NOWHERE = ["--server", "nats://127.0.0.1:1"]
GOLDEN_LOG = Path(__file__).resolve().parents[1] / "golden" / "log.jsonl"

# (case id, files to write, the command, what its one line says after "corral: ")
REFUSALS = [
    (
        "a job file with replica and resources.gpu",
        {"job.yaml": "queue: team-a\nreplica: 2\nresources: {gpu: 1}\n"},
        ["submit", "job.yaml", *NOWHERE],
        "job.yaml: unknown fields replica (did you mean replicas?), "
        "resources.gpu (did you mean resources.gpus?)",
    ),
    (
        "a queue file with quota",
        {"queues.toml": '[[queues]]\nname = "team-a"\nquota = 3\n'},
        ["queue", "apply", "queues.toml", *NOWHERE],
        "queues.toml: unknown field queues[0].quota (did you mean queues[0].quotas?)",
    ),
    (
        "a YAML error",
        {"job.yaml": "queue: a\nresources:\n  gpus: 1\n   mig: x\n"},
        ["submit", "job.yaml", *NOWHERE],
        "job.yaml:4:7: not valid YAML: mapping values are not allowed here",
    ),
    (
        "a relative script that is not here",
        {},
        ["submit", "--queue", "team-a", *NOWHERE, "--", "python", "trian.py"],
        "command: trian.py is not in {here}, where relative paths are taken from (workers run in a "
        "directory of their own): give its absolute path, or submit from the directory that holds it",
    ),
    ("a missing job file", {}, ["submit", "typo.yaml", *NOWHERE], "typo.yaml: No such file or directory"),
    (
        "a missing Philly trace",
        {},
        ["sim", "--trace", "philly", "--file", "typo.csv"],
        "typo.csv: no such file",
    ),
    (
        "a negative borrowing limit",
        {},
        ["sim", "--trace", "philly", "--borrow-limit", "-1"],
        "--borrow-limit -1.0: times the entitlement, 0 or more",
    ),
    (
        "a borrowing limit that is not a number",
        {},
        ["sim", "--trace", "philly", "--borrow-limit", "nan"],
        "--borrow-limit nan: times the entitlement, 0 or more",
    ),
    (
        "a borrowing limit for the Alibaba trace",
        {},
        ["sim", "--trace", "alibaba", "--borrow-limit", "2"],
        "--borrow-limit is for --trace philly",
    ),
    (
        "a missing Alibaba pod list",
        {},
        ["sim", "--trace", "alibaba", "--pods", "typo.csv"],
        "typo.csv: no such file",
    ),
    (
        "a spec cap smaller than one job's spec",
        {},
        ["queue", "retention", "--finished", "1h", "--spec-bytes-per-tenant", "5", *NOWHERE],
        "--spec-bytes-per-tenant: 5 is less than a job's spec holds (512)",
    ),
    ("a missing log to replay", {}, ["replay", "typo.jsonl"], "typo.jsonl: No such file or directory"),
    (
        "a log line whose data is not base64",
        {"log.jsonl": '{"seq": 1, "subject": "corral.ev.job.j", "time": 1.0, "data_b64": "QQ"}\n'},
        ["replay", "log.jsonl"],
        "log.jsonl:1: data_b64 is not base64: Incorrect padding",
    ),
    (
        "a log line of another alphabet",
        {"log.jsonl": '{"seq": 1, "subject": "corral.ev.job.j", "time": 1.0, "data_b64": "!!!!"}\n'},
        ["replay", "log.jsonl"],
        "log.jsonl:1: data_b64 is not base64: Only base64 data is allowed",
    ),
    (
        "a log that goes back",
        {
            "log.jsonl": '{"seq": 5, "subject": "corral.ev.job.j", "time": 1.0, "data": "{}"}\n'
            '{"seq": 3, "subject": "corral.ev.job.j", "time": 1.0, "data": "{}"}\n'
        },
        ["replay", "log.jsonl"],
        "log.jsonl:2: seq 3 after 5: a log goes forward",
    ),
    (
        "a missing log to import",
        {},
        ["log", "import", "typo.jsonl", *NOWHERE],
        "typo.jsonl: No such file or directory",
    ),
    (
        "an export to a missing directory",
        {},
        ["log", "export", "nope/log.jsonl", *NOWHERE],
        "nope/log.jsonl: no directory {here}/nope",
    ),
]


@pytest.mark.parametrize(("files", "argv", "says"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_a_wrong_or_missing_file_is_refused_in_one_line(
    tmp_path: Path, files: dict[str, str], argv: list[str], says: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [*CORRAL, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"corral: {says.format(here=tmp_path)}\n"


def _bounded_memory() -> None:
    # Where a command reads without bound, it fails here, not on the machine that runs the tests.
    resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))


@pytest.mark.parametrize("argv", [["log", "import", "log.jsonl", *NOWHERE], ["replay", "log.jsonl"]])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "a line too long"])
def test_a_log_file_that_is_no_regular_file_or_too_large_is_refused_in_one_line(
    tmp_path: Path, kind: str, argv: list[str]
) -> None:
    # A FIFO held ``log import`` until someone wrote to it, and a link to /dev/zero was read
    # until memory ran out: a log file is a regular file, of lines no longer than a record's.
    path = tmp_path / "log.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
        says = "log.jsonl: not a regular file"
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
        says = "log.jsonl: not a regular file"
    else:
        with path.open("wb") as f:
            f.write(b'{"seq": 1, "subject": "corral.ev.job.j", "data": "' + b"x" * logfile.MAX_LINE + b'"}\n')
        says = f"log.jsonl:1: longer than any record's line ({logfile.MAX_LINE} bytes at most)"
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [*CORRAL, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_bounded_memory,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"corral: {says}\n")


def _on_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """``argv`` with stderr a pseudo-terminal of 100 columns (stdout piped): its exit status,
    stdout and what the terminal showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every holder of the terminal's other end closed it
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    out = proc.stdout.read() if proc.stdout is not None else b""
    return proc.wait(timeout=120), out.decode(), shown.decode(errors="replace")


@pytest.mark.parametrize(
    ("argv", "bars"),
    [
        (["replay", str(GOLDEN_LOG)], ["reading", "folding"]),
        (["replay", str(GOLDEN_LOG), "--verify"], ["verifying"]),
    ],
    ids=["replay", "replay --verify"],
)
def test_progress_is_shown_on_a_terminal_and_not_when_piped(
    tmp_path: Path, argv: list[str], bars: list[str]
) -> None:
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    code, out, shown = _on_terminal([*CORRAL, *argv], env)
    piped = subprocess.run([*CORRAL, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert code == piped.returncode
    assert out == piped.stdout  # what the command answers is the same either way
    assert piped.stderr == ""
    for bar in bars:
        assert f"{bar}" in shown, shown
    # tqdm's own parts: a count out of a total, the time spent and the time left, a rate.
    assert "/s]" in shown and "<" in shown, shown
