"""The README runs as written: every shell block and Python snippet in it, in the order it shows
them, with its files, against a `corral up` started as the README starts it.

How the README is read:

- Every fenced block names its language. ``sh`` blocks are commands; ``text`` blocks are not.
- A block whose first line is a comment naming a file (``# job.yaml``, ``// submit.mjs``) is that
  file: all of them are written into the working directory before anything runs, as a reader
  who saved them would have them.
- ``sh`` blocks run in order with bash (``-e``: a command that fails fails the test), in one
  temporary directory where ``corral`` and ``python`` are this checkout's; a block that is one
  ``corral up`` runs in the background, as a reader leaves it running in a terminal, and must
  exit 0 on Ctrl-C at the end. ``python`` blocks run as scripts, in order with the rest.
- ``<!-- not run: why -->`` on the line before a block skips it; such marks stay few, each says
  why, and what runs the block instead where something does.

Nothing else in the environment leaks in: no ``CORRAL_*`` variable, the directory's own
``.corral`` (its own data directory, a free port): the README's commands find that cluster as a
reader's would, from the directory they run in.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.+?)\s*-->\s*$")
FILE_NAME = re.compile(r"^(?:#|//)\s*(?P<name>[\w.-]+\.(?:ya?ml|toml|json|py|mjs|js))\s*$")
RUNS = {"sh", "python"}
LANGUAGES = RUNS | {"text", "yaml", "toml", "json", "javascript"}
MAX_NOT_RUN = 5  # marks stay few: a block that cannot run is the exception
BLOCK_TIMEOUT = 150  # seconds for one block; the whole test is bounded by pytest's timeout


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    not_run: str  # why not, or ""

    @property
    def file(self) -> str | None:
        first = self.body.split("\n", 1)[0]
        m = FILE_NAME.match(first)
        return m.group("name") if m else None

    @property
    def starts_corral(self) -> bool:
        commands = [c for c in (ln.split("#", 1)[0].strip() for ln in self.body.splitlines()) if c]
        return self.lang == "sh" and len(commands) == 1 and commands[0].startswith("corral up")


def blocks(text: str) -> list[Block]:
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = NOT_RUN.search(before)
        line = text.count("\n", 0, m.start()) + 1
        out.append(Block(line, m.group("lang").strip(), m.group("body"), mark.group("why") if mark else ""))
    return out


def test_every_block_says_what_it_is_and_marks_stay_few() -> None:
    found = blocks(README.read_text())
    assert found, "no blocks found in the README"
    unnamed = [b.line for b in found if b.lang not in LANGUAGES]
    assert not unnamed, f"README blocks at lines {unnamed}: name the language (sh, python, text, yaml, ...)"
    skipped = [b for b in found if b.not_run]
    assert len(skipped) <= MAX_NOT_RUN, [b.line for b in skipped]
    assert sum(b.starts_corral for b in found if not b.not_run) == 1


def shims(folder: Path) -> Path:
    """``corral`` and ``python`` as this checkout's, first on the PATH."""
    folder.mkdir()
    for name, argv in (("corral", f'"{sys.executable}" -m corral'), ("python", f'"{sys.executable}"')):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        shim.chmod(0o755)
    return folder


@pytest.mark.timeout(240)  # the README's whole session; it takes about a minute on a quiet machine
def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    found = blocks(README.read_text())
    work = tmp_path / "work"
    work.mkdir()
    for b in found:
        if b.file is not None:
            (work / b.file).write_text(b.body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PATH"] = f"{shims(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    up: subprocess.Popen[str] | None = None
    said: list[str] = []
    try:
        for b in found:
            if b.not_run or b.lang not in RUNS:
                continue
            where = f"README line {b.line}"
            if b.starts_corral:
                assert up is None, f"{where}: a second corral up"
                up = start(b.body, work, env, said, where)
                continue
            argv = ["bash", "-e", "-c", b.body] if b.lang == "sh" else [sys.executable, "-c", b.body]
            done = subprocess.run(
                argv, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
            )
            assert done.returncode == 0, (
                f"{where} ({b.lang}) exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n"
                f"{done.stderr}\n--- corral up\n{''.join(said[-20:])}"
            )
    finally:
        if up is not None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                raise
    assert up is not None and up.returncode == 0, "".join(said[-20:])


def start(
    command: str, work: Path, env: dict[str, str], said: list[str], where: str
) -> subprocess.Popen[str]:
    """``corral up`` as the README writes it, left running; returns once it says it is up."""
    proc = subprocess.Popen(
        # exec: the shell becomes corral, so Ctrl-C (SIGINT) at the end reaches it.
        ["bash", "-c", f"exec {command.split('#', 1)[0].strip()}"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=60)
            said.append(line)
            if line.startswith("corral is up at "):
                break
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"{where}: corral up did not come up:\n{''.join(said)}") from None
    threading.Thread(target=lambda: [said.append(lines.get()) for _ in iter(int, 1)], daemon=True).start()
    return proc
