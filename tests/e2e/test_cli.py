"""The corral CLI end to end: `corral up` in a subprocess, submits from the CLI and from a raw NATS
client, then the exported log replays to exactly the state the server's log folds to."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

pytestmark = pytest.mark.e2e

CORRAL = [sys.executable, "-m", "corral"]
QUEUES = """
[fair_share]
half_life_s = 43200
short_job_gpu_s = "2h"

[[priority_classes]]
name = "normal"
value = 0

[[cohorts]]
name = "research"

[[queues]]
name = "team-a"
cohort = "research"
tenants = ["team-a"]
quotas = { "*" = { nominal = 8 } }

[[queues]]
name = "team-b"
cohort = "research"
tenants = ["team-b"]
quotas = { "*" = { nominal = 8 } }
"""


def corral(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*CORRAL, *args], env=env, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"corral {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}


@pytest.fixture
def cluster(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """`corral up` in the background; yields its NATS URL once it says it is up."""
    proc = subprocess.Popen(
        [*CORRAL, "up", "--nodes", "5", "--data", str(tmp_path / "data")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    url = None
    seen = []
    try:
        while url is None:
            line = lines.get(timeout=60)
            seen.append(line)
            if line.startswith("corral is up at "):
                url = line.split()[-1]
        yield url
    except queue.Empty:
        raise AssertionError("corral up did not come up:\n" + "".join(seen)) from None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, "".join(seen)


async def test_submit_export_and_replay(cluster: str, env: dict[str, str], tmp_path: Path) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    out = corral("queue", "apply", str(queues), "--server", cluster, env=env)
    assert "fair share" in out.stdout

    job_file = tmp_path / "train.yaml"
    job_file.write_text(
        "id: train-1\nqueue: team-a\nreplicas: 2\nresources: {gpus: 4}\ncommand: [sleep, '600']\n"
    )
    out = corral("submit", str(job_file), "--server", cluster, "--tenant", "team-a", env=env)
    assert out.stdout.strip() == "train-1"
    flags = ("--queue", "team-a", "--gpus", "1", "--server", cluster, "--tenant", "team-a")
    out = corral("submit", *flags, "--", "sleep", "600", env=env)
    flag_job = out.stdout.strip()

    # Any NATS client in any language: plain JSON to the intake, request-reply, answered from
    # the tenant's own inbox with where the log stored it.
    nc = await nats.connect(cluster, inbox_prefix="_INBOX.corral.team-b")
    try:
        body = {
            "request_id": "raw-1",
            "job": {"queue": "team-b", "resources": {"gpus": 2}, "command": ["sleep", "600"]},
        }
        answer = await nc.request("corral.req.team-b.submit", json.dumps(body).encode(), timeout=10)
        assert json.loads(answer.data)["seq"] > 0
    finally:
        await nc.close()

    jobs = json.loads(corral("jobs", "-o", "json", "--server", cluster, env=env).stdout)
    by_id = {j["id"]: j for j in jobs}
    assert {"train-1", flag_job, "raw-1"} <= set(by_id)
    assert by_id["raw-1"]["tenant"] == "team-b"
    assert by_id["train-1"]["workers"] == 2
    # The admin naming itself as the tenant (as in a shell set up for `queue apply`) sees the same.
    as_admin = corral("jobs", "-o", "json", "--tenant", "admin", "--server", cluster, env=env).stdout
    assert {j["id"] for j in json.loads(as_admin)} == set(by_id)

    nodes = json.loads(corral("nodes", "-o", "json", "--server", cluster, env=env).stdout)
    assert len(nodes) == 5

    elastic = tmp_path / "elastic.yaml"
    elastic.write_text(
        "id: el-1\nqueue: team-a\nreplicas: 4\nmin_replicas: 2\nresources: {gpus: 1}\n"
        "command: [sleep, '600']\n"
    )
    corral("submit", str(elastic), "--server", cluster, "--tenant", "team-a", env=env)
    out = corral("resize", "el-1", "6", "--server", cluster, "--tenant", "team-a", env=env)
    assert "el-1" in out.stdout

    exported = tmp_path / "log.jsonl"
    corral("log", "export", str(exported), "--server", cluster, env=env)
    last = max(json.loads(line)["seq"] for line in exported.read_text().splitlines())
    from_file = json.loads(corral("replay", str(exported), "-o", "json", env=env).stdout)
    live = json.loads(
        corral("replay", "--server", cluster, "--until", str(last), "-o", "json", env=env).stdout
    )
    assert from_file == live
    assert from_file["faults"] == 0
    assert {"train-1", "raw-1"} <= set(from_file["jobs"])
    assert from_file["jobs"]["el-1"]["spec"]["replicas"] == 6
    # --tenant narrows the jobs a replay lists, as every list.
    theirs = json.loads(corral("replay", str(exported), "-o", "json", "--tenant", "team-b", env=env).stdout)
    assert set(theirs["jobs"]) == {"raw-1"} and theirs["seq"] == from_file["seq"]
    shown = corral("replay", str(exported), "--tenant", "team-b", env=env).stdout
    assert f"jobs of tenant team-b: 1 of {len(from_file['jobs'])}" in shown
    assert "raw-1" in shown and "train-1" not in shown
    assert from_file["fair_share"]["half_life_s"] == 43200.0
    assert from_file["fair_share"]["short_job_gpu_s"] == 7200.0

    # What if: asked of the forecast role on the live state, written nowhere.
    requests = [
        r for r in map(json.loads, exported.read_text().splitlines()) if r["subject"].startswith("corral.in.")
    ]
    asker = ("--server", cluster, "--tenant", "team-a")
    out = corral("whatif", "--queue", "team-a", "--gpus", "2", *asker, "--", "sleep", "600", env=env)
    assert out.stdout.startswith("accepted"), out.stdout
    out = corral("whatif", "--queue", "nowhere", *asker, "--", "sleep", "600", env=env)
    assert out.stdout.startswith("not accepted"), out.stdout
    corral("log", "export", str(exported), "--server", cluster, env=env)
    after = [
        r for r in map(json.loads, exported.read_text().splitlines()) if r["subject"].startswith("corral.in.")
    ]
    assert after == requests

    out = corral(
        "queue", "fair-share", "--half-life-s", "7200", "--short-jobs", "1h", "--server", cluster, env=env
    )
    assert "jobs of at most 3600 GPU-seconds go first" in out.stdout
    corral("log", "export", str(exported), "--server", cluster, env=env)
    replayed = json.loads(corral("replay", str(exported), "-o", "json", env=env).stdout)
    assert replayed["fair_share"]["half_life_s"] == 7200.0
    assert replayed["fair_share"]["short_job_gpu_s"] == 3600.0
    assert not [r for r in replayed["rejections"] if r["subject"].endswith(".fair-share")]


def test_errors_are_one_line_with_status_2(env: dict[str, str], tmp_path: Path) -> None:
    wrong_flag = corral("jobs", "--no-such-flag", env=env, check=False)
    unreachable = corral("jobs", "--server", "nats://127.0.0.1:1", env=env, check=False)
    bad = tmp_path / "bad.toml"
    bad.write_text("queue = [unclosed\n")
    bad_file = corral("submit", str(bad), "--server", "nats://127.0.0.1:1", env=env, check=False)
    wrong_type = tmp_path / "wrong.json"
    wrong_type.write_text('{"queue": "a", "replicas": "many"}')
    bad_field = corral("submit", str(wrong_type), "--server", "nats://127.0.0.1:1", env=env, check=False)
    for done in (wrong_flag, unreachable, bad_file, bad_field):
        assert done.returncode == 2
        assert done.stderr.startswith("corral: ")
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert "cannot reach" in unreachable.stderr
    assert "bad.toml" in bad_file.stderr
    assert "replicas" in bad_field.stderr


def test_a_script_named_relative_to_the_submit_directory_runs(
    cluster: str, env: dict[str, str], tmp_path: Path
) -> None:
    """``corral submit … -- python train.py`` from the directory that holds train.py: the worker,
    in a directory of its own, runs that file (taken from where the submit ran)."""
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    corral("queue", "apply", str(queues), "--server", cluster, env=env)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('trained in', os.getcwd())\n")
    done = subprocess.run(
        [*CORRAL, "submit", "--id", "rel-1", "--queue", "team-a", "--gpus", "1", "--tenant", "team-a"]
        + ["--server", cluster, "--", sys.executable, "train.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "rel-1\n"), done.stderr
    assert done.stderr == f"corral: command: train.py is {project / 'train.py'}\n"

    from corral.client import Client

    with Client(cluster, tenant="team-a") as client:
        assert client.wait("rel-1", "succeeded", timeout=120).phase == "succeeded"
    logs = corral("logs", "rel-1", env=env).stdout
    assert "trained in " in logs and f"trained in {project}" not in logs  # its own directory


def test_queue_apply_says_which_changes_the_cluster_refused(
    cluster: str, env: dict[str, str], tmp_path: Path
) -> None:
    # It printed "applied" for every change it sent; the fold had refused three of four.
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[[cohorts]]\nname = 'x'\nparent = 'y'\n\n[[cohorts]]\nname = 'y'\nparent = 'x'\n\n"
        "[[queues]]\nname = 'good'\nquotas = { '*' = { nominal = 4 } }\n\n"
        "[[queues]]\nname = 'heavy'\nweight = 0.0\nquotas = { '*' = { nominal = 4 } }\n"
    )
    out = corral("queue", "apply", str(bad), "--server", cluster, env=env, check=False)
    assert out.returncode == 2, out  # a bad file: checked by the fold's own rules, nothing sent
    assert "2 of 4 changes not valid, none sent" in out.stderr and "parent chain loops" in out.stderr
    assert "queue heavy: " in out.stderr and "weight must be a number of at least" in out.stderr
    listed = corral("queues", "--server", cluster, "-o", "json", env=env).stdout
    assert '"good"' not in listed and '"heavy"' not in listed  # sent one by one, good was applied
    # What only the cluster's state rules out is sent, and refused by the fold: exit 1, each once.
    first, then = tmp_path / "p.toml", tmp_path / "q.toml"
    first.write_text("[[cohorts]]\nname = 'p'\nparent = 'q'\n")
    then.write_text("[[cohorts]]\nname = 'q'\nparent = 'p'\n\n[[queues]]\nname = 'fine'\n")
    corral("queue", "apply", str(first), "--server", cluster, env=env)
    out = corral("queue", "apply", str(then), "--server", cluster, env=env, check=False)
    assert out.returncode == 1, out
    assert "1 of 2 changes refused" in out.stderr and out.stderr.count("cohort q:") == 1, out.stderr
