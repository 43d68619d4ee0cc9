"""A corral with logins and real agents under a flood of hostile traffic, as an attacker sends it.

Tenant ``a`` mixes valid jobs with every trick a NATS client has: payloads no decoder can take,
reply subjects aimed at the log, the leases and another tenant's inbox, headers only corral may
set, direct publishes into the stream, a node agent's identity used beyond its node. Afterwards
every valid job has run to success, every hostile message is accounted for (refused by the
server, by the intake, or recorded as a rejection by the fold), the services still answer, and
the log replays to the live state and verifies clean.
"""

from __future__ import annotations

import asyncio
import json
import pwd
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from corral.events import codec, subjects
from corral.events.jobs import JobSpec, Resources, SubmitJob
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.projections.fold import fold
from corral.projections.state import State
from corral.services.agent import sandbox
from corral.services.cli.up import Cluster, Settings, cluster, connect, service_roles
from corral.services.cli.watch import Watcher
from corral.services.query.client import Refused, Session
from corral.services.replay.verify import verify
from corral.services.runtime import identities

pytestmark = pytest.mark.integration

WAIT = 60.0
SETTINGS = Settings(
    tick=0.1, agent_tick=0.05, heartbeat=0.2, auth=True, tenants=("a", "b"), restart_backoff=0.1
)
VALID = JobSpec(queue="qa", resources=Resources(gpus=1), command=(sys.executable, "-c", "pass"))


@pytest.fixture
async def corral(tmp_path: Path) -> AsyncIterator[tuple[Cluster, dict[str, str]]]:
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=SETTINGS) as running:
        assert running.credentials is not None
        yield running, identities.load(running.credentials)


async def _send(s: Session, verb: str, body: bytes, msg_id: str) -> int | str:
    """The sequence the request was stored at, or why it was refused."""
    try:
        return await s.send(subjects.request("a", verb), body, msg_id)
    except Refused as e:
        return str(e)


async def test_a_flood_of_hostile_traffic_loses_no_valid_job(corral: tuple[Cluster, dict[str, str]]) -> None:
    # With logins, tenants share nodes: the valid jobs' workers run in bubblewrap or not at all.
    if await sandbox.probe() is None:
        pytest.skip("bubblewrap (bwrap) is missing or cannot create namespaces here; .ci/run installs it")
    running, passwords = corral
    admin = await Session.open(running.url, identities.ADMIN, passwords[identities.ADMIN])
    try:
        queue = codec.encode(ApplyQueue(queue=QueueSpec("qa", quotas={"*": Quota(8)}, tenants=("a",))))
        await admin.send(subjects.admin("queue"), queue, "queue:qa")
    finally:
        await admin.close()

    a = await Session.open(running.url, "a", passwords["a"])

    async def ignore(e: Exception) -> None:
        return None  # the server's refusals of the raw publishes below

    # A second connection of a's for what no honest client sends: the server's refusals come to it.
    a_login = identities.login(passwords, "a")
    inbox = identities.inbox_prefix("a")
    raw = await nats.connect(running.url, inbox_prefix=inbox, error_cb=ignore, **a_login)
    hostile: list[tuple[str, bytes]] = [
        ("submit", b"[" * 5000 + b"]" * 5000),
        ("submit", b'{"request_id":"deep","job":{"queue":"qa","env":' + b"[" * 5000 + b"]" * 5000 + b"}}"),
        ("submit", json.dumps({"request_id": "big", "job": {"queue": "qa", "replicas": 10**30}}).encode()),
        ("submit", json.dumps({"request_id": "nl\n", "job": {"queue": "qa"}}).encode()),
        ("submit", json.dumps({"request_id": "x" * 100_000, "job": {"queue": "qa"}}).encode()),
        ("submit", json.dumps({"request_id": "t", "tenant": "b", "job": {"queue": "qa"}}).encode()),
        ("submit", b"x" * 300_000),
        ("cancel", json.dumps({"job_id": "valid-0" + "\x00"}).encode()),
        ("resize", json.dumps({"job_id": "valid-1", "replicas": -(2**70)}).encode()),
        ("queue", queue),
        ("submit", json.dumps({"request_id": "ctl", "job": {"queue": "qa", "name": "\x1b[2J"}}).encode()),
    ]
    outcomes: list[int | str] = []
    try:
        for i in range(5):
            body = codec.encode(SubmitJob(request_id=f"valid-{i}", job=VALID))
            assert isinstance(await _send(a, "submit", body, f"valid-{i}"), int)
            for verb, payload in hostile:
                outcomes.append(await _send(a, verb, payload, f"hostile-{i}-{len(outcomes)}"))
                # the same request answered elsewhere: into the log, the leases, b's inbox
                for reply in ("corral.ev.job.forged", "$KV.corral_leases.admission", "_INBOX.corral.b.x"):
                    await raw.publish(subjects.intake("a", verb), payload, reply=reply)
            # straight into the stream, and as a service or an agent would
            for subject in ("corral.in.a.submit", "corral.ev.job.valid-0", "corral.ev.node.node-00"):
                await raw.publish(subject, body, reply="$KV.corral_leases.placer")
        await raw.flush()
    finally:
        await a.close()
        await raw.close()

    log = await connect(running.url, **identities.login(passwords, identities.SERVICES))
    try:
        async with Watcher(log) as watch:
            valid = [f"valid-{i}" for i in range(5)]
            done = await watch.until(
                lambda s: all(j in s.jobs and s.jobs[j].phase == "succeeded" for j in valid), WAIT
            )
            # Every hostile request: refused by the intake, or stored and refused by the fold.
            refused_by_fold = {r.seq for r in done.rejections}
            for outcome in outcomes:
                assert isinstance(outcome, str) or outcome in refused_by_fold or _rejected_job(done, outcome)
            others = [j for j in done.jobs if not j.startswith("valid-")]
            assert all(done.jobs[j].phase == "rejected" for j in others), others
            records = [r async for batch in log.read() for r in batch]
            assert not [r for r in records if r.subject in ("corral.ev.job.forged", "corral.ev.job.valid-0")
                        and r.headers is None and b"stream" in r.data]  # fmt: skip
            replayed = fold(records)
            live = await watch.until(lambda s: s.seq >= records[-1].seq, WAIT)
            assert msgspec.msgpack.encode(replayed) == msgspec.msgpack.encode(live)
            assert verify(records, service_roles(), workers=1).clean
    finally:
        await log.close()

    # The services still answer: a new job runs, and the read service tells about it. Its worker
    # ran as nobody, not as the agent's user.
    a = await Session.open(running.url, "a", passwords["a"])
    try:
        uid = (sys.executable, "-c", "import os; print('uid', os.getuid())")
        who = msgspec.structs.replace(VALID, command=uid)
        after = codec.encode(SubmitJob(request_id="after", job=who))
        seq = await a.send(subjects.request("a", "submit"), after, "after")
        told = await a.ask("a", "explain", job="after", after=seq)
        assert told["job"]["id"] == "after"
    finally:
        await a.close()
    log = await connect(running.url, **identities.login(passwords, identities.SERVICES))
    try:
        async with Watcher(log) as watch:
            await watch.until(lambda s: "after" in s.jobs and s.jobs["after"].phase == "succeeded", WAIT)
    finally:
        await log.close()
    [out] = running.agents["node-00"].logs("after")
    assert f"uid {pwd.getpwnam('nobody').pw_uid}" in out.read_text()


def _rejected_job(state: State, seq: int) -> bool:
    """A request the fold took, whose job admission then rejected (a name with control
    characters, say): accounted for as well."""
    return any(j.submitted_seq == seq and j.phase == "rejected" for j in state.jobs.values())


async def test_an_agent_may_speak_only_for_its_own_node(corral: tuple[Cluster, dict[str, str]]) -> None:
    running, passwords = corral
    name = identities.agent("node-00")
    errors: list[str] = []
    heard = asyncio.Event()

    async def on_error(e: Exception) -> None:
        errors.append(str(e).lower())
        heard.set()

    nc = await nats.connect(
        running.url,
        inbox_prefix=identities.agent_inbox("node-00"),
        error_cb=on_error,
        **identities.login(passwords, name),
    )
    try:
        for subject in ("corral.ev.node.node-01", "corral.ev.job.j1", "corral.ev.decision.placer",
                        "corral.in.a.submit", "corral.hb.node-01", "$KV.corral_leases.placer"):  # fmt: skip
            errors.clear()
            heard.clear()
            await nc.publish(subject, b"{}")
            await nc.flush()
            await asyncio.wait_for(heard.wait(), 10)
            assert "permissions violation" in errors[0], subject
        errors.clear()
        await nc.publish(subjects.heartbeat("node-00"), b"{}")  # its own: allowed
        await nc.flush()
        assert errors == []
    finally:
        await nc.close()
