"""The README's Node.js client, as written there, against `corral up`: a submit through the
intake, its verdict and a follow until it runs, from another language with only the wire contract.

It needs node and the `nats` package from npm, installed here into a cache folder of its own
(kept between runs); without node, or without a registry to install from, it is skipped and
says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_cli import QUEUES, cluster, corral, env  # noqa: F401 - fixtures used by name

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
NATS_JS = "nats@2"  # the nats.js client line the README's code is written against


def readme_javascript() -> str:
    section = README.read_text().split("### From any language", 1)[1]
    return section.split("```javascript\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def node_folder() -> Path:
    """A folder with the `nats` package installed, where a script placed in it can import it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed (Debian: apt-get install nodejs npm)")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "corral-tests" / "node"
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "node_modules" / "nats" / "package.json").exists():
        try:
            done = subprocess.run(
                [npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund", NATS_JS],
                capture_output=True,
                text=True,
                timeout=180,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm install {NATS_JS} took over 180 s: no registry within reach?")
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"npm could not install {NATS_JS} (no registry within reach?): {last}")
    return cache


def test_the_readme_node_client_submits_and_follows(
    node_folder: Path,
    cluster: str,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    corral("queue", "apply", str(queues), "--server", cluster, env=env)
    script = node_folder / "submit.mjs"  # beside node_modules, where `import "nats"` resolves
    script.write_text(readme_javascript())
    done = subprocess.run(
        ["node", str(script)],
        env={**env, "CORRAL_SERVER": cluster},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["verdict: accepted ", "phase: running"], done.stdout
    listed = corral("jobs", "-o", "json", "--server", cluster, "--tenant", "team-a", env=env)
    assert '"node-1"' in listed.stdout
