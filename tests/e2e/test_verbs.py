"""The operator's verbs end to end against `corral up`: each one's success and refusal, by exit
status and its one-line message. Node cordon, drain, uncordon and delete, queue, cohort and
priority class delete (the admin's requests, answered with their verdict), jobs filtered and
watched, a job's output tailed and followed, and submit's flags reaching the worker."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from corral.client import Client, Invalid, NoSuchJob
from tests.e2e.test_cli import CORRAL, QUEUES, cluster, corral, env  # noqa: F401 - fixtures used by name
from tests.e2e.test_verdicts import one_line

pytestmark = pytest.mark.e2e


def node_of(server: str, environ: dict[str, str], name: str) -> dict[str, object]:
    nodes = json.loads(corral("nodes", "-o", "json", "--server", server, env=environ).stdout)
    return next(n for n in nodes if n["name"] == name)


def test_nodes_are_cordoned_drained_and_uncordoned_and_queues_deleted(
    cluster: str,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    queues = tmp_path / "queues.toml"
    spare = '[[queues]]\nname = "spare"\ncohort = "spares"\nquotas = { "*" = { nominal = 1 } }\n'
    spare_class = '[[priority_classes]]\nname = "spare-class"\nvalue = 5\n'
    queues.write_text(QUEUES + '\n[[cohorts]]\nname = "spares"\n\n' + spare + "\n" + spare_class)
    server = ("--server", cluster)
    corral("queue", "apply", str(queues), *server, env=env)

    drained = corral("node", "drain", "node-01", "--reason", "new cables", *server, env=env)
    assert drained.stdout.startswith("node-01 draining")
    assert node_of(cluster, env, "node-01")["condition"] == "draining"
    uncordoned = corral("node", "uncordon", "node-01", "--repaired", *server, env=env)
    assert uncordoned.stdout.startswith("node-01 uncordoned") and "failures cleared" in uncordoned.stdout
    assert node_of(cluster, env, "node-01")["condition"] == "ready"
    assert corral("node", "cordon", "node-02", *server, env=env).stdout.startswith("node-02 cordoned")
    assert node_of(cluster, env, "node-02")["condition"] == "cordoned"

    nosuch = corral("node", "cordon", "node-99", *server, env=env, check=False)
    assert (nosuch.returncode, one_line(nosuch)) == (1, "corral: no node node-99")
    tenant = corral("node", "uncordon", "node-02", "--tenant", "team-a", *server, env=env, check=False)
    assert tenant.returncode == 1 and "team-a may not 'cordon'" in one_line(tenant)
    assert node_of(cluster, env, "node-02")["condition"] == "cordoned"  # the refusal changed nothing
    bad_name = corral("node", "drain", "node.02", *server, env=env, check=False)
    assert bad_name.returncode == 2 and "letters, digits" in one_line(bad_name)
    # A node taken out for good: forgotten by the cluster, which then knows no such node.
    assert corral("node", "delete", "node-02", *server, env=env).stdout.startswith("node-02 deleted")
    assert "node-02" not in {
        n["name"] for n in json.loads(corral("nodes", "-o", "json", *server, env=env).stdout)
    }
    again = corral("node", "delete", "node-02", *server, env=env, check=False)
    assert (again.returncode, one_line(again)) == (1, "corral: no node node-02")

    busy_job = ("--id", "busy", "--queue", "team-a", "--tenant", "team-a", *server)
    corral("submit", *busy_job, "--", "sleep", "600", env=env)
    busy = corral("queue", "delete", "team-a", *server, env=env, check=False)
    said = "corral: queue team-a still has jobs not finished: busy"
    assert (busy.returncode, one_line(busy)) == (1, said)
    in_use = corral("queue", "delete-cohort", "spares", *server, env=env, check=False)
    assert (in_use.returncode, one_line(in_use)) == (
        1,
        "corral: cohort spares still has members: queue spare; move or delete them first",
    )
    assert corral("queue", "delete", "spare", *server, env=env).stdout.strip() == "deleted queue spare"
    deleted = corral("queue", "delete-cohort", "spares", *server, env=env)
    assert deleted.stdout.strip() == "deleted cohort spares"
    gone = corral("queue", "delete", "spare", *server, env=env, check=False)
    assert (gone.returncode, one_line(gone)) == (1, "corral: no queue spare")
    named = corral("queue", "delete-priority-class", "normal", *server, env=env, check=False)
    assert (named.returncode, one_line(named)) == (
        1,
        "corral: priority class normal is named by jobs not finished: busy",
    )
    dropped = corral("queue", "delete-priority-class", "spare-class", *server, env=env)
    assert dropped.stdout.strip() == "deleted priority class spare-class"
    rows = json.loads(corral("queues", "-o", "json", *server, env=env).stdout)
    assert "spare" not in {r["queue"] for r in rows}
    assert all(isinstance(r["nominal"], int | float) for r in rows)


def test_jobs_filtered_and_watched_and_their_output_followed(
    cluster: str,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    server = ("--server", cluster)
    corral("queue", "apply", str(queues), *server, env=env)
    as_a = (*server, "--tenant", "team-a")
    watch = subprocess.Popen(
        [*CORRAL, "jobs", "--watch", "-o", "json", *as_a],
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        corral("submit", "--id", "long", "--queue", "team-a", *as_a, "--", "sleep", "600", env=env)
        flags = (
            "--min-replicas",
            "1",
            "--replicas",
            "2",
            "--env",
            "GREETING=hello",
            "--runtime-estimate",
            "5m",
        )
        script = 'echo "$GREETING from rank $RANK"; for i in 1 2 3; do echo "line $i"; done'
        corral("submit", "--id", "hi", "--queue", "team-a", *flags, *as_a, "--", "sh", "-c", script, env=env)
        followed = corral("logs", "hi", "--rank", "1", "--follow", env=env)
        assert followed.stdout.splitlines()[1:] == ["hello from rank 1", "line 1", "line 2", "line 3"]
        assert followed.stdout.splitlines()[0].endswith(": attempt-0.rank-1 <==")
        tail = corral("logs", "hi", "--tail", "1", env=env).stdout
        assert [line for line in tail.splitlines() if not line.startswith("==>")] == ["line 3", "line 3"]

        seen: list[dict[str, object]] = []
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in watch.stdout or ()], daemon=True).start()
        while not any(r["id"] == "hi" and r["phase"] == "succeeded" for r in seen):
            seen.append(json.loads(lines.get(timeout=60)))
        phases = [r["phase"] for r in seen if r["id"] == "hi"]
        assert len(phases) >= 2, phases  # each change, as it came, not one list at the end
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=30)
        except subprocess.TimeoutExpired:  # show where it hangs: faulthandler prints every thread
            watch.send_signal(signal.SIGABRT)
            watch.wait(timeout=10)
            pytest.fail(
                f"corral jobs --watch did not end on Ctrl-C:\n{watch.stderr.read() if watch.stderr else ''}"
            )
    # Ctrl-C ends the watch as an interrupted command, quietly: no traceback, no task left behind.
    assert (watch.returncode, watch.stderr.read() if watch.stderr else "") == (130, "")

    running = json.loads(corral("jobs", "--state", "running", "-o", "json", *as_a, env=env).stdout)
    assert [j["id"] for j in running] == ["long"]
    assert running[0]["running_workers"] == 1 and running[0]["gpus_per_worker"] == 1
    done = json.loads(
        corral(
            "jobs", "--state", "succeeded,failed", "--queue", "team-a", "-o", "json", *as_a, env=env
        ).stdout
    )
    assert [(j["id"], j["workers"], j["min_workers"]) for j in done] == [("hi", 2, 1)]
    assert json.loads(corral("jobs", "--queue", "team-b", "-o", "json", *as_a, env=env).stdout) == []
    bad_state = corral("jobs", "--state", "finished", *as_a, env=env, check=False)
    assert bad_state.returncode == 2 and "not a phase" in one_line(bad_state)
    nosuch = corral("logs", "nosuchjob", "--follow", *as_a, env=env, check=False)
    assert (nosuch.returncode, one_line(nosuch)) == (1, "corral: no such job nosuchjob")
    others = corral("logs", "hi", "--tenant", "team-b", env=env, check=False)  # team-a's job
    assert (others.returncode, one_line(others)) == (1, "corral: no such job hi")
    assert others.stdout == ""
    with Client(cluster, tenant="team-a") as mine, Client(cluster, tenant="team-b") as theirs:
        told = list(mine.logs("hi", rank=0))
        assert [(x.rank, x.text) for x in told] == [
            (0, "hello from rank 0"),
            (0, "line 1"),
            (0, "line 2"),
            (0, "line 3"),
        ]
        assert [x.text for x in mine.logs("hi", tail=1)] == ["line 3", "line 3"]
        with pytest.raises(NoSuchJob, match="no such job hi"):
            list(theirs.logs("hi"))
        with pytest.raises(Invalid, match="job id"):
            list(mine.logs("a.*"))
    no_rank = corral("logs", "hi", "--rank", "7", env=env, check=False)
    assert no_rank.returncode == 2 and "no output of job hi rank 7" in one_line(no_rank)
    bad_id = corral("logs", "a.>", env=env, check=False)  # never a wildcard on the output's subjects
    assert bad_id.returncode == 2 and bad_id.stdout == "" and "job id 'a.>'" in one_line(bad_id)
    bad_mount = corral("submit", "--queue", "team-a", "--mount", "/data", *as_a, env=env, check=False)
    assert bad_mount.returncode == 2 and "SOURCE:TARGET" in one_line(bad_mount)
    bad_time = corral(
        "submit", "--queue", "team-a", "--runtime-estimate", "soon", *as_a, env=env, check=False
    )
    assert bad_time.returncode == 2 and "not a duration" in one_line(bad_time)
    assert os.environ.get("CORRAL_SERVER") != cluster  # the test's own cluster, not one of the machine's
