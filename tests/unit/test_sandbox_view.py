"""What a narrow sandbox shows of the host besides its system directories: the interpreter's
environment and the command's own files, found where they are when a link leads to them."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.services.agent import sandbox


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside /tmp (whose parts the sandbox binds otherwise) and the system's."""
    path = Path(tempfile.mkdtemp(prefix="corral-view-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_virtualenv_reached_through_a_link_is_shown_where_it_is(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # proj/.venv a link to a shared virtualenv: the sandbox showed proj (in /tmp) and in it the
    # link, whose target it did not show, and a job's "proj/.venv/bin/python" exited 127 with
    # "No such file or directory".
    shared = outside / "venvs" / "py311"
    (shared / "bin").mkdir(parents=True)
    (shared / "pyvenv.cfg").write_text("home = /usr/bin\n")
    link = tmp_path / "proj" / ".venv"
    link.parent.mkdir()
    link.symlink_to(shared)
    monkeypatch.setattr(sys, "prefix", str(link))
    shown = sandbox.runs_from([str(link / "bin" / "python"), "-c", "pass"])
    assert str(shared) in shown, shown
    assert f"/tmp/{tmp_path.parts[2]}" in sandbox.needed_under_tmp([])


def test_a_program_named_through_a_linked_directory_is_shown_along_the_way(
    tmp_path: Path, outside: Path
) -> None:
    # The kernel follows a program's path as named, link by link: tools/run is a link to a
    # program elsewhere, and tools itself a link; the program's own directory is not enough.
    program = outside / "opt-tools" / "run-1.2"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    real_tools = outside / "tools"
    real_tools.mkdir()
    (real_tools / "run").symlink_to(program)
    tools = tmp_path / "tools"
    tools.symlink_to(real_tools)
    shown = sandbox.runs_from([str(tools / "run")])
    assert str(program.parent) in shown and str(real_tools) in shown, shown


def test_the_directories_leading_to_what_it_runs_from_may_be_entered_by_its_user(outside: Path) -> None:
    # bwrap makes the directories a bind needs with its own user's mode alone: with logins, a
    # worker running as nobody read "can't open file '/var/…/hello.py': Permission denied".
    script = outside / "proj" / "hello.py"
    script.parent.mkdir()
    script.write_text("print('hello')\n")
    built = sandbox.args(
        "/tmp/w", "/tmp/c", ["/usr/bin/python3", str(script)], (), 4, narrow=True, as_user=True
    )
    bind = built.index(str(script.parent))
    made = {built[i + 1] for i in range(2, bind) if built[i - 2 : i + 1] == ["--perms", "0755", "--dir"]}
    assert {str(p) for p in script.parent.parents if str(p) != "/"} <= made, built
    assert built[bind - 1] == "--ro-bind"


def test_where_the_agent_was_started_is_not_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # corral up started in /tmp/x: every tenant's job saw /tmp/x, with the job files, queue
    # files and log exports an operator leaves there.
    here = tmp_path / "operator"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert sandbox.needed_under_tmp(["/usr/bin/python3", "-c", "pass"]) == []
    script = here / "train.py"
    script.write_text("pass\n")
    assert sandbox.needed_under_tmp(["/usr/bin/python3", str(script)]) == [f"/tmp/{tmp_path.parts[2]}"]
