"""The wheel as a user installs it: one top-level name, ``corral``, beside the public ``events``.

The source tree keeps ``events/``, ``projections/`` and ``services/`` at its top; installed, they
must exist only as ``corral.events``, ``corral.projections`` and ``corral.services``. ``events``
is one of the most downloaded packages on the package index: a wheel that installed a bare
``events`` would overwrite it (or be overwritten), and a module loaded under two names gives two
``Event`` classes that silently break msgspec's tagged unions. So the wheel is built, installed
into a fresh virtual environment together with the public ``events`` package (from the package
index), and both are used there, from a directory outside the source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

# Runs inside the fresh environment. The public ``events`` package keeps working (its own
# ``Events`` class, its own attribute protocol), corral's fold runs in process, and the event
# types corral decodes are the ones it exports.
PROBE = """
import sys
import events
from events import Events

fired = []
bus = Events()
bus.on_change += fired.append
bus.on_change(42)
assert fired == [42], fired
assert "site-packages" in events.__file__, events.__file__

import corral
from corral import JobSpec, Record, Resources, State, SubmitJob, encode, fold
from corral.events import subjects
from corral.events.jobs import SubmitJob as Same

assert Same is SubmitJob
assert "site-packages" in corral.__file__, corral.__file__
submit = SubmitJob(request_id="probe-1", job=JobSpec(queue="team-a", resources=Resources(gpus=1)))
state = fold([Record(1, subjects.request("team-a", "submit"), encode(submit), None, 1000.0)])
assert isinstance(state, State)
assert state.seq == 1, state.seq
assert "probe-1" in state.jobs, sorted(state.jobs)
assert not [m for m in sys.modules if m.split(".")[0] in ("projections", "services")]
import os
from corral.services.cli import demo
assert os.path.isfile(demo.TRAIN), demo.TRAIN  # the demo's job is where the demo looks for it
print("probe ok", corral.__version__)
"""


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy, links kept as links: an in-tree build would leave build/ in the checkout.
    source = tmp_path_factory.mktemp("source") / "corral"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache")
    shutil.copytree(ROOT, source, symlinks=True, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)], out)
    (built,) = out.glob("corral-*.whl")
    return built


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"corral"}
    for package in ("events", "projections", "services"):
        assert f"corral/{package}/__init__.py" in names
    assert "corral/py.typed" in names
    assert "corral/services/dashboard/static/index.html" in names  # the dashboard's page, package data
    assert "corral/projections/placement/plugins/fit.py" in names  # nested packages are carried too
    assert "corral/examples/train.py" in names  # the example job `corral demo` runs, package data


@pytest.mark.timeout(300)  # installs the public ``events`` from the package index into a new venv
def test_corral_and_the_public_events_package_work_side_by_side(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py = venv / "bin" / "python"
    # corral's dependencies are those this suite runs with, seen after the new environment's own
    # packages (a path in a .pth file: the editable corral installed there is not, as its own
    # .pth files are not read); installing them again from the index would test pip, not corral.
    (site,) = venv.glob("lib/python*/site-packages")
    outer = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "outer.pth").write_text("".join(f"{p}\n" for p in outer))
    # The public ``events`` second, so that if corral's wheel carried a bare ``events`` it would
    # be overwritten here and the probe would find the other one.
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], tmp_path, timeout=600)
    _run([str(py), "-m", "pip", "install", "--quiet", "events"], tmp_path, timeout=300)

    assert "probe ok" in _run([str(py), "-c", PROBE], tmp_path)
    help_text = _run([str(venv / "bin" / "corral"), "--help"], tmp_path)
    assert "usage: corral" in help_text
    version = _run([str(venv / "bin" / "corral"), "--version"], tmp_path)
    assert version.startswith("corral ")
    # Uninstalling the public package leaves corral whole: it never shared a file with it.
    _run([str(py), "-m", "pip", "uninstall", "--quiet", "--yes", "events"], tmp_path)
    assert "probe" not in _run([str(py), "-c", "import corral.events.codec; print('fine')"], tmp_path)
