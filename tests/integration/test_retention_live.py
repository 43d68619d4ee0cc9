"""A job the fold let go is still told of, from the read service's SQLite view: a corral with
logins on a real nats-server, a retention of 0 set by the admin through the intake.

- a cancelled job leaves the state at the next record; ``jobs`` no longer lists it, ``jobs
  --all`` and ``explain`` still do, to its owner only;
- its id is free again: a new job of that id is what ``explain`` shows, and ``jobs --all``
  lists both;
- the CLI, as the tenant, gets the same through the read service.

Waits are on the log (``Watcher.until``) or on the read service's answer after a log position,
with a timeout; never sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.events import codec, subjects
from corral.events.jobs import CancelJob, JobSpec, Resources, SubmitJob
from corral.events.queues import ApplyQueue, ApplyRetention, QueueSpec, Quota, RetentionSpec
from corral.services.cli.up import Settings, cluster, connect
from corral.services.cli.watch import Watcher
from corral.services.query.client import Session
from corral.services.runtime import identities
from tests.builders import TRAIN

WAIT = 30.0
LOGINS = Settings(tick=0.1, agents=False, auth=True, tenants=("a", "b"))
SMALL = JobSpec(queue="qa", resources=Resources(gpus=1), command=TRAIN)


class Corral:
    def __init__(self, url: str, passwords: dict[str, str], watch: Watcher) -> None:
        self.url, self.passwords, self.watch = url, passwords, watch

    async def send(self, user: str, verb: str, body: object, msg_id: str) -> int:
        s = await Session.open(self.url, user, self.passwords[user])
        try:
            return await s.send(subjects.request(user, verb), codec.encode(body), msg_id)
        finally:
            await s.close()

    async def ask(self, user: str, question: str, **ask: object) -> dict[str, object]:
        s = await Session.open(self.url, user, self.passwords[user])
        try:
            return await s.ask(user, question, **ask)  # type: ignore[arg-type]
        finally:
            await s.close()


@pytest.fixture
async def corral(tmp_path: Path) -> AsyncIterator[Corral]:
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=LOGINS) as running:
        assert running.credentials is not None
        passwords = identities.load(running.credentials)
        log = await connect(running.url, **identities.login(passwords, identities.SERVICES))
        try:
            async with Watcher(log) as watch:
                c = Corral(running.url, passwords, watch)
                queue = ApplyQueue(queue=QueueSpec("qa", quotas={"*": Quota(16)}, tenants=("a",)))
                await c.send(identities.ADMIN, "queue", queue, "queue:qa")
                keep = ApplyRetention(retention=RetentionSpec(finished_s=0.0))
                seq = await c.send(identities.ADMIN, "retention", keep, "retention:0")
                await watch.until(lambda st: st.seq >= seq and st.retention.finished_s == 0.0, WAIT)
                yield c
        finally:
            await log.close()


async def test_a_job_let_go_is_still_listed_and_explained(corral: Corral, tmp_path: Path) -> None:
    await corral.send("a", "submit", SubmitJob(request_id="ja", job=SMALL), "submit:ja:1")
    # No agents here: placed, it never starts, and its cancel gives its GPU back at once.
    await corral.watch.until(lambda st: "ja" in st.jobs and st.jobs["ja"].phase == "placed", WAIT)
    await corral.send("a", "cancel", CancelJob(job_id="ja", reason="wrong data"), "cancel:ja:1")
    await corral.watch.until(lambda st: "ja" in st.jobs and st.jobs["ja"].phase == "cancelled", WAIT)
    # The next record lets it go: a job of another tenant's.
    seq = await corral.send("b", "submit", SubmitJob(request_id="jb", job=SMALL), "submit:jb:1")
    state = await corral.watch.until(lambda st: st.seq >= seq, WAIT)
    assert "ja" not in state.jobs and state.let_go == 1

    held = await corral.ask("a", "jobs", after=seq)
    assert [j["id"] for j in held["jobs"]] == []  # type: ignore[index, union-attr]
    everything = await corral.ask("a", "jobs", after=seq, everything=True)
    assert [(j["id"], j["phase"]) for j in everything["jobs"]] == [("ja", "cancelled")]  # type: ignore[index, union-attr]
    told = await corral.ask("a", "explain", job="ja", after=seq)
    assert told["job"]["phase"] == "cancelled"  # type: ignore[index]
    text = str(told["text"])
    assert "cancel requested: wrong data" in text and "let go from the cluster's state" in text
    # To another tenant it is no job, in the list and explained.
    assert (await corral.ask("b", "explain", job="ja", after=seq))["error"] == "no job ja"
    assert "ja" not in {j["id"] for j in (await corral.ask("b", "jobs", after=seq, everything=True))["jobs"]}  # type: ignore[union-attr, index]

    # Its id is free: a new job of it is the one explained; both are listed.
    seq = await corral.send("a", "submit", SubmitJob(request_id="ja", job=SMALL), "submit:ja:2")
    await corral.watch.until(lambda st: "ja" in st.jobs and st.jobs["ja"].submitted_seq == seq, WAIT)
    told = await corral.ask("a", "explain", job="ja", after=seq)
    assert told["job"]["phase"] != "cancelled" and "let go" not in str(told["text"])  # type: ignore[index]
    everything = await corral.ask("a", "jobs", after=seq, everything=True)
    assert [j["id"] for j in everything["jobs"]] == ["ja", "ja"]  # type: ignore[index, union-attr]

    # The CLI, as tenant a, through the read service.
    own = tmp_path / "a.json"
    own.write_text(json.dumps({"a": corral.passwords["a"]}))
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    env.pop("CORRAL_USER", None)
    env.pop("CORRAL_PASSWORD", None)
    args = ("--server", corral.url, "--credentials", str(own), "-o", "json")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral", "jobs", "--all", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    assert sorted(j["phase"] for j in json.loads(out))[0] == "cancelled"
