"""Every job verb answers with its verdict, end to end against `corral up`: the CLI's exit status
and one-line message for each way a submit, cancel or resize succeeds or is refused, and the
Python client running the README's own sweep."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from corral.client import AsyncClient, Invalid, NoSuchJob, Rejected
from tests.e2e.test_cli import QUEUES, cluster, corral, env  # noqa: F401 - fixtures used by name

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stderr.startswith("corral: "), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


def test_each_verb_says_what_became_of_it(cluster: str, env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    corral("queue", "apply", str(queues), "--server", cluster, env=env)
    as_a = ("--server", cluster, "--tenant", "team-a")
    as_b = ("--server", cluster, "--tenant", "team-b")

    long = ("--id", "ok-1", "--queue", "team-a", "--gpus", "1", *as_a, "--command", "sleep", "600")
    ok = corral("submit", *long, env=env)
    assert ok.stdout.strip() == "ok-1"
    again = corral("submit", *long, env=env)
    assert again.stdout.strip() == "ok-1"  # the same id twice is one job
    taken = corral("submit", "--id", "ok-1", "--queue", "team-b", *as_b, "--", "true", env=env, check=False)
    assert taken.returncode == 1 and "job id ok-1 is taken" in one_line(taken)

    refusals = {
        "negative GPUs": (("--queue", "team-a", "--gpus", "-1"), "gpus per worker"),
        "unknown queue": (("--queue", "nosuch"), "queue nosuch does not exist"),
        "more than quota can ever give": (
            ("--queue", "team-a", "--gpus", "8", "--replicas", "10"),
            "80 GPUs",
        ),
    }
    for name, (flags, why) in refusals.items():
        done = corral("submit", *flags, *as_a, "--", "sleep", "600", env=env, check=False)
        assert (done.returncode, done.stdout) == (1, ""), name
        line = one_line(done)
        assert "rejected" in line and why in line, (name, line)
    # Neither a command nor an image: nothing a node could start. Said before anything is sent
    # (admission's own rejection, for a request sent otherwise, is in the sweep's test below).
    idle = corral("submit", "--queue", "team-a", "--gpus", "1", *as_a, env=env, check=False)
    assert (idle.returncode, idle.stdout) == (2, "")
    assert one_line(idle).startswith("corral: nothing to run: give the command after --")

    nosuch = corral("cancel", "nosuchjob", *as_a, env=env, check=False)
    assert (nosuch.returncode, one_line(nosuch)) == (1, "corral: no such job nosuchjob")
    others = corral("cancel", "ok-1", *as_b, env=env, check=False)
    assert (others.returncode, one_line(others)) == (1, "corral: no such job ok-1")
    not_elastic = corral("resize", "ok-1", "2", *as_a, env=env, check=False)
    assert not_elastic.returncode == 1 and "not elastic" in one_line(not_elastic)

    elastic = tmp_path / "elastic.yaml"
    elastic.write_text(
        "id: el-2\nqueue: team-a\nreplicas: 4\nmin_replicas: 2\nresources: {gpus: 1}\n"
        "command: [sleep, '600']\n"
    )
    corral("submit", str(elastic), *as_a, env=env)
    assert corral("resize", "el-2", "6", *as_a, env=env).stdout.strip() == "el-2 resized to at most 6 workers"

    assert corral("cancel", "ok-1", *as_a, env=env).stdout.strip() == "cancelled ok-1"
    twice = corral("cancel", "ok-1", *as_a, env=env, check=False)
    assert twice.returncode == 1 and "already cancelled" in one_line(twice)

    fire = corral("submit", "--no-wait", "--queue", "nosuch", *as_a, "--", "sleep", "600", env=env)
    assert re.fullmatch(r"j-[0-9a-f]+", fire.stdout.strip())  # fire-and-forget: stored, not judged
    explained = corral("explain", "ok-1", *as_b, env=env, check=False)
    assert (explained.returncode, one_line(explained)) == (1, "corral: no such job ok-1")


def readme_python() -> str:
    """The README's Python sweep, as written there."""
    section = README.read_text().split("### From Python", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


async def test_the_readme_sweep_runs_and_the_client_says_no_as_the_cli(
    cluster: str,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    corral("queue", "apply", str(queues), "--server", cluster, env=env)
    script = tmp_path / "sweep.py"
    script.write_text(readme_python())
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**env, "CORRAL_SERVER": cluster},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["1e-3 succeeded", "3e-4 succeeded", "1e-4 succeeded"], done.stdout
    assert lines[3].startswith("rejected: ") and "800 GPUs" in lines[3]
    assert lines[4:] == ["training with lr=1e-3"]  # its worker's output, read back through the client

    async with AsyncClient(cluster, tenant="team-b") as client:
        assert await client.jobs() == []  # team-a's sweep is not team-b's to see
        with pytest.raises(NoSuchJob):
            await client.cancel("sweep-lr-1e-3")
        with pytest.raises(Rejected, match="does not exist"):
            await client.submit({"queue": "team-a", "command": ["sleep", "600"]})
        with pytest.raises(Invalid, match="nothing to run"):  # before anything is sent
            await client.submit({"queue": "team-b", "resources": {"gpus": 1}})
        spec = {"queue": "team-b", "resources": {"gpus": 1}, "command": ["sleep", "600"]}
        submitted = await client.submit(spec, id="b-1")
        assert submitted.phase and submitted.seq > 0
        running = await client.wait("b-1", "running", timeout=60)
        assert running.phase == "running"
        told = await client.explain("b-1")
        assert told.job.tenant == "team-b" and "b-1" in told.text

        # Any other client sends such a job as it is: stored, and admission rejects it, saying why.
        nc = await nats.connect(cluster, inbox_prefix="_INBOX.corral.team-b")
        try:
            body = {"request_id": "b-idle", "job": {"queue": "team-b", "resources": {"gpus": 1}}}
            stored = await nc.request("corral.req.team-b.submit", json.dumps(body).encode(), timeout=10)
            ask = {"job": "b-idle", "after": json.loads(stored.data)["seq"], "verb": "submit", "wait": 30}
            verdict = await nc.request("corral.read.team-b.verdict", json.dumps(ask).encode(), timeout=40)
        finally:
            await nc.close()
        said = json.loads(verdict.data)
        nothing = "nothing to run: give a command, or an image whose entrypoint runs"
        assert (said["verdict"], said["code"], said["reason"]) == ("rejected", "invalid", nothing), said
        idle = await client.explain("b-idle")
        assert idle.job.phase == "rejected" and nothing in idle.text
