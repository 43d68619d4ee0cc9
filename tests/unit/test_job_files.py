"""What ``corral submit`` and ``corral queue apply`` say about a file that is wrong: where (the
line and column of a syntax error, the path of a field) and what (the closest known field, the
type expected), and what a job's relative command paths become."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.events.jobs import JobSpec
from corral.services.cli.jobfile import MAX_DOCUMENT, BadInput, command_here, convert, load_document
from corral.services.cli.queues import QueueFile

JOB, QUEUES = JobSpec, QueueFile

# (case id, file name, text, what it is read as, the whole message after "<file>")
REFUSED = [
    (
        "issue example: replica and resources.gpu",
        "job.yaml",
        "queue: team-a\nreplica: 2\nresources: {gpu: 1}\n",
        JOB,
        ": unknown fields replica (did you mean replicas?), resources.gpu (did you mean resources.gpus?)",
    ),
    (
        "issue example: quota in a queue",
        "queues.toml",
        '[[queues]]\nname = "team-a"\nquota = 3\n',
        QUEUES,
        ": unknown field queues[0].quota (did you mean queues[0].quotas?)",
    ),
    (
        "quota at the top of a queue file",
        "queues.toml",
        "quota = 3\n",
        QUEUES,
        ": unknown field quota",
    ),
    (
        "deep in a quota table",
        "queues.toml",
        '[[queues]]\nname = "a"\nquotas = { "*" = { nominal = 8, borowing_limit = 2 } }\n',
        QUEUES,
        ": unknown field queues[0].quotas.*.borowing_limit "
        "(did you mean queues[0].quotas.*.borrowing_limit?)",
    ),
    (
        "in a list of mounts",
        "job.json",
        '{"queue": "a", "mounts": [{"source": "/data", "targt": "/data"}]}',
        JOB,
        ": unknown field mounts[0].targt (did you mean mounts[0].target?)",
    ),
    (
        "nothing close",
        "job.yaml",
        "queue: a\nflavour: large\n",
        JOB,
        ": unknown field flavour",
    ),
    (
        "an integer given as words",
        "job.yaml",
        "queue: a\nreplicas: many\n",
        JOB,
        ": replicas: expected an integer, got a string",
    ),
    (
        "a fraction of a GPU as gpus",
        "job.yaml",
        "queue: a\nresources: {gpus: 0.5}\n",
        JOB,
        ": resources.gpus: expected an integer, got a number",
    ),
    (
        "a command as one string",
        "job.toml",
        'queue = "a"\ncommand = "python train.py"\n',
        JOB,
        ": command: expected a list, got a string",
    ),
    (
        # YAML's .inf became null on the wire: a job without an estimate, accepted as such.
        "an infinite runtime estimate",
        "job.yaml",
        "queue: a\nruntime_estimate_s: .inf\n",
        JOB,
        ": runtime_estimate_s: expected a finite number, got inf",
    ),
    (
        # ... and a NaN grace a request the intake could not read, after the file was passed.
        "a grace that is not a number",
        "job.toml",
        'queue = "a"\ngrace_seconds = nan\n',
        JOB,
        ": grace_seconds: expected a finite number, got nan",
    ),
    (
        "an infinite estimate in JSON, as Python writes it",
        "job.json",
        '{"queue": "a", "mounts": [{"source": "/d", "target": "/d"}], "runtime_estimate_s": -Infinity}',
        JOB,
        ": runtime_estimate_s: expected a finite number, got -inf",
    ),
    (
        "resources as a list",
        "job.yaml",
        "queue: a\nresources: [1]\n",
        JOB,
        ": resources: expected a table of fields, got a list",
    ),
    (
        "an env value that is no string",
        "job.yaml",
        "queue: a\nenv: {STEPS: 100}\n",
        JOB,
        ": env: each value: expected a string, got an integer",
    ),
    (
        "a pack corral does not know",
        "job.yaml",
        "queue: a\ntopology: {pack: tight}\n",
        JOB,
        ": topology.pack: 'tight' is not one of block, node, none, nvlink, rack, spread",
    ),
    ("no queue", "job.yaml", "replicas: 2\n", JOB, ": missing field queue"),
    (
        "a queue without a name",
        "queues.toml",
        "[[queues]]\nweight = 2.0\n",
        QUEUES,
        ": queues[0]: missing field name",
    ),
    (
        "YAML: a key indented under a value",
        "job.yaml",
        "queue: a\nresources:\n  gpus: 1\n   mig: x\n",
        JOB,
        ":4:7: not valid YAML: mapping values are not allowed here",
    ),
    (
        "YAML: a key given twice",
        "job.yaml",
        "queue: a\nresources: {gpus: 1}\nresources: {gpus: 2}\n",
        JOB,
        ":3:1: not valid YAML: 'resources' given twice",
    ),
    (
        "YAML: a list as a key",  # a traceback (unhashable list) before
        "job.yaml",
        "queue: a\n? [a, b]\n: 1\n",
        JOB,
        ":2:3: not valid YAML: a key must be a name, not list",
    ),
    (
        "JSON: nested a hundred thousand deep",  # a RecursionError before
        "job.json",
        "[" * 100_000,
        JOB,
        ": not valid JSON: nested deeper than any job or queue is",
    ),
    (
        "TOML: a key without =",
        "queues.toml",
        '[[queues]]\nname = "a"\nquotas = { "*" = { nominal 8 } }\n',
        QUEUES,
        ":3:28: not valid TOML: Expected '=' after a key in a key/value pair",
    ),
    (
        "JSON: a value missing",
        "job.json",
        '{"queue": "a",\n "replicas": }',
        JOB,
        ":2:14: not valid JSON: Expecting value",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "kind", "says"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_wrong_file_is_refused_saying_where_and_what(
    tmp_path: Path, name: str, text: str, kind: type, says: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(BadInput) as refused:
        convert(load_document(path), kind, str(path), also=("id",))
    assert str(refused.value) == f"{path}{says}"


def test_a_job_file_id_is_known_and_a_near_miss_of_it_is_suggested(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("ids: train-1\nqueue: a\n")
    with pytest.raises(BadInput, match=r"unknown field ids \(did you mean id\?\)"):
        convert(load_document(path), JobSpec, str(path), also=("id",))


def _link_to_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # no writer: an open or a read that blocks holds the command for good


def _huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(MAX_DOCUMENT + 1)


NOT_READ = [
    ("a link to /dev/zero", _link_to_zero, ": not a regular file"),
    ("a FIFO", _fifo, ": not a regular file"),
    ("a directory", Path.mkdir, ": not a regular file"),
    (
        "larger than any document",
        _huge,
        f": larger than any job or queue file is ({MAX_DOCUMENT} bytes at most)",
    ),
    ("not UTF-8", lambda p: p.write_bytes(b'{"queue": "\xff"}'), ": not UTF-8 text (byte 11 is 0xff)"),
]


@pytest.mark.parametrize(("make", "says"), [c[1:] for c in NOT_READ], ids=[c[0] for c in NOT_READ])
def test_a_file_that_is_no_document_is_refused_without_reading_it_all(
    tmp_path: Path, make: Callable[[Path], object], says: str
) -> None:
    path = tmp_path / "job.json"
    make(path)
    with pytest.raises(BadInput) as refused:
        load_document(path)
    assert str(refused.value) == f"{path}{says}"


@pytest.mark.parametrize("name", ["job.json", "job.toml", "job.yaml"])
def test_a_byte_order_mark_some_editors_write_is_skipped(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(
        b"\xef\xbb\xbf"
        + (
            b'{"queue": "a"}'
            if name.endswith(".json")
            else b'queue = "a"\n'
            if name.endswith(".toml")
            else b"queue: a\n"
        )
    )
    assert load_document(path) == {"queue": "a"}


def test_a_right_file_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("queue: a\nreplicas: 2\nresources: {gpus: 1}\nenv: {LR: '1e-3'}\n")
    spec = convert(load_document(path), JobSpec, str(path))
    assert (spec.replicas, spec.resources.gpus, spec.env) == (2, 1, {"LR": "1e-3"})


# -- a command's relative paths --------------------------------------------------------------


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('training')\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train.py").write_text("")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "model").mkdir()  # a package: ``python -m model`` names it, not a path
    return tmp_path


TAKEN_FROM_HERE = [
    (
        "a script beside the submit",
        ["python", "train.py", "--steps", "3"],
        ["python", "@/train.py", "--steps", "3"],
    ),
    ("a script in a folder", ["python", "examples/train.py"], ["python", "@/examples/train.py"]),
    ("a program by its path", ["./run.sh", "x"], ["@/run.sh", "x"]),
    ("a folder written as a path", ["ls", "examples/"], ["ls", "@/examples"]),
    ("a module, not a path", ["python", "-m", "model"], ["python", "-m", "model"]),
    ("a program on the PATH", ["sh", "-c", "echo train.py"], ["sh", "-c", "echo train.py"]),
    (
        "absolute paths and options",
        ["/bin/echo", "--out=x.py", "/tmp/y.py"],
        ["/bin/echo", "--out=x.py", "/tmp/y.py"],
    ),
    ("an output not made yet", ["python", "train.py", "runs/exp1"], ["python", "@/train.py", "runs/exp1"]),
]


@pytest.mark.parametrize(
    ("command", "becomes"), [c[1:] for c in TAKEN_FROM_HERE], ids=[c[0] for c in TAKEN_FROM_HERE]
)
def test_relative_paths_of_a_command_are_taken_from_the_submit_directory(
    here: Path, command: list[str], becomes: list[str]
) -> None:
    got, changed = command_here(command, here)
    assert list(got) == [a.replace("@", str(here)) for a in becomes]
    assert [absolute for _, absolute in changed] == [a for a in got if a not in command]


def test_an_argument_no_file_could_be_named_is_left_as_given(here: Path) -> None:
    # A long argument without a space (a script for python -c, a key=value of a config) was
    # looked up as a file: the name too long for one raised, and the CLI printed a traceback.
    long = "x=1;" * 100
    for command in (["python", "-c", long], ["python", "run.py", f"sub/{long}"]):
        (here / "run.py").touch()
        got, _ = command_here(command, here)
        assert got[-1] == command[-1]
    with pytest.raises(BadInput):
        command_here([f"./{long}.py"], here)


@pytest.mark.parametrize(
    "command",
    [["python", "trian.py"], ["python", "src/train.py"], ["./missing.sh"], ["bin/train", "--steps", "3"]],
    ids=["a misspelt script", "a script in a folder not here", "a program not here", "a program in a folder"],
)
def test_a_relative_script_or_program_that_is_not_here_is_refused(here: Path, command: list[str]) -> None:
    with pytest.raises(BadInput) as refused:
        command_here(command, here)
    said = str(refused.value)
    assert said.startswith("command: ") and f"is not in {here}" in said and "absolute path" in said
