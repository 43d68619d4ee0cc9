"""Tenant isolation enforced by NATS itself: a corral with logins (``Settings.auth``), a real
nats-server, every service and the read service.

- a tenant submits into its own queue and reads why its job waits, through the read service;
- the server refuses, with a permissions violation, every publish, request and subscription a
  tenant may not make: other tenants' and the admin's requests, the stream (``corral.ev``,
  ``$JS.API``), other tenants' questions and inboxes; nothing of it reaches the log;
- another tenant's job reads exactly as a job that does not exist, and payload tricks (a tenant
  field, ids with wildcards or dots, a reply subject into the log) change nothing;
- the CLI, given a tenant's credentials, sends and asks as that tenant.

Waits are on the log (``Watcher.until``) or on the server's answer, with a timeout; never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from corral.events import codec, subjects
from corral.events.jetstream import JetStreamLog
from corral.events.jobs import CancelJob, JobSpec, Resources, SubmitJob
from corral.events.log import Record
from corral.events.queues import ApplyQueue, ApplyRetention, QueueSpec, Quota, RetentionSpec
from corral.events.server import EmbeddedServer
from corral.projections.state import State
from corral.services.cli.up import Settings, cluster, connect
from corral.services.cli.watch import Watcher
from corral.services.client import AsyncClient, Busy
from corral.services.intake.rate import Rate
from corral.services.query.client import Refused, Session
from corral.services.runtime import identities
from tests.builders import TRAIN

WAIT = 30.0
LOGINS = Settings(tick=0.1, agents=False, auth=True, tenants=("a", "b"))
QUEUES = (
    QueueSpec("qa", quotas={"*": Quota(16)}, tenants=("a",)),
    QueueSpec("qb", quotas={"*": Quota(16)}, tenants=("b",)),
)
# One node of 8 GPUs: a gang of two 8-GPU workers fits its queue's quota but never the cluster,
# so admission rejects it with the reason.
TOO_BIG = JobSpec(queue="qa", replicas=2, resources=Resources(gpus=8), command=TRAIN)


@dataclass
class Secured:
    url: str
    passwords: dict[str, str]
    log: JetStreamLog  # the services identity's
    watch: Watcher

    async def session(self, user: str) -> Session:
        return await Session.open(self.url, user, self.passwords[user])

    async def submit(self, tenant: str, job_id: str, spec: JobSpec) -> int:
        s = await self.session(tenant)
        try:
            body = codec.encode(SubmitJob(request_id=job_id, job=spec))
            return await s.send(subjects.request(tenant, "submit"), body, f"submit:{job_id}")
        finally:
            await s.close()

    async def until(self, seq: int) -> State:
        return await self.watch.until(lambda st: st.seq >= seq, WAIT)


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Secured]:
    """A corral with logins for tenants ``a`` and ``b``, their queues applied by the admin."""
    async with securing(tmp_path, LOGINS) as secured:
        yield secured


@contextlib.asynccontextmanager
async def securing(tmp_path: Path, settings: Settings) -> AsyncIterator[Secured]:
    async with cluster(None, 1, "h100-8x", tmp_path / "data", settings=settings) as running:
        assert running.credentials is not None
        passwords = identities.load(running.credentials)
        log = await connect(running.url, **identities.login(passwords, identities.SERVICES))
        try:
            async with Watcher(log) as watch:
                secured = Secured(running.url, passwords, log, watch)
                admin = await secured.session(identities.ADMIN)
                try:
                    for q in QUEUES:
                        body = codec.encode(ApplyQueue(queue=q))
                        last = await admin.send(subjects.admin("queue"), body, f"queue:{q.name}")
                finally:
                    await admin.close()
                await secured.watch.until(lambda st: st.seq >= last and len(st.queues) == 2, WAIT)
                yield secured
        finally:
            await log.close()


async def records_since(log: JetStreamLog, after: int) -> list[Record]:
    return [r async for batch in log.read(after + 1) for r in batch]


async def test_tenant_submits_and_reads_why_its_job_waits(secured: Secured) -> None:
    seq = await secured.submit("a", "ja", TOO_BIG)
    await secured.submit("b", "jb", msgspec.structs.replace(TOO_BIG, queue="qb"))
    state = await secured.watch.until(lambda st: bool(st.jobs.get("ja") and st.jobs["ja"].reasons), WAIT)
    assert state.jobs["ja"].tenant == "a" and seq > 0
    seen = state.seq  # the watcher's state goes on folding: ask after what it had seen here

    a = await secured.session("a")
    admin = await secured.session(identities.ADMIN)
    try:
        jobs = await a.ask("a", "jobs", after=seen)
        assert jobs["seq"] >= seen
        assert [j["id"] for j in jobs["jobs"]] == ["ja"]
        assert jobs["jobs"][0]["reason"]  # why it waits, in the list

        told = await a.ask("a", "explain", job="ja", after=seen)
        assert told["job"]["id"] == "ja"
        assert told["reasons"] and all(r["code"] and r["message"] for r in told["reasons"])
        assert "why: [" in told["text"]

        queues = await a.ask("a", "queues")
        assert {q["queue"] for q in queues["queues"]} == {"qa"}

        everything = await admin.ask(identities.ADMIN, "jobs", after=state.seq)
        assert {j["id"] for j in everything["jobs"]} == {"ja", "jb"}
    finally:
        await a.close()
        await admin.close()


async def test_server_refuses_what_a_tenant_may_not_do(secured: Secured) -> None:
    before = await secured.log.last_seq()
    stolen = codec.encode(SubmitJob(request_id="stolen", job=JobSpec(queue="qb", command=TRAIN)))
    a = await secured.session("a")
    try:
        for subject in ("corral.in.b.submit", "corral.in.admin.queue", "corral.ev.job.stolen"):
            with pytest.raises(Refused, match="permissions violation"):
                await a.send(subject, stolen, f"try:{subject}")
        for subject in (
            "corral.read.b.jobs",
            "corral.read.admin.jobs",
            f"$JS.API.STREAM.INFO.{subjects.STREAM}",
            f"$JS.API.CONSUMER.CREATE.{subjects.STREAM}",
            f"$JS.API.STREAM.MSG.GET.{subjects.STREAM}",
            f"$JS.API.DIRECT.GET.{subjects.STREAM}",
        ):
            with pytest.raises(Refused, match="permissions violation"):
                await a.request(subject, b"{}")
        # What a may do still works on the same connection, and is the only thing that got in.
        barrier = await a.send("corral.in.a.cancel", codec.encode(CancelJob(job_id="nothing")), "c:1")
    finally:
        await a.close()
    got = await records_since(secured.log, before)
    assert [r.subject for r in got if r.seq <= barrier and r.subject.startswith("corral.in.")] == [
        "corral.in.a.cancel"
    ]
    assert "stolen" not in (await secured.until(barrier)).jobs


async def test_a_tenant_cannot_listen_to_the_stream_or_others_replies(secured: Secured) -> None:
    violations: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(e: Exception) -> None:
        await violations.put(str(e))

    nc = await nats.connect(
        secured.url,
        user="a",
        password=secured.passwords["a"],
        inbox_prefix=identities.inbox_prefix("a"),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        for subject in ("corral.ev.>", "corral.>", ">", "_INBOX.>", "_INBOX.corral.b.>", "$JS.API.>"):
            await nc.subscribe(subject)
            said = await asyncio.wait_for(violations.get(), WAIT)
            assert "permissions violation for subscription" in said and subject.lower() in said.lower()
        # A JetStream consumer is the API, refused the same way; a's connection lives on.
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error)):
            await nc.jetstream(timeout=1.0).stream_info(subjects.STREAM)
        assert "permissions violation for publish" in await asyncio.wait_for(violations.get(), WAIT)
        assert nc.is_connected
    finally:
        await nc.close()


async def test_read_service_identity_cannot_write_the_log(secured: Secured) -> None:
    """Whatever reply subject a question names, the read service's own login may publish only
    into inboxes: enforced by the server, whatever the service's code did."""
    before = await secured.log.last_seq()
    query = await Session.open(secured.url, identities.QUERY, secured.passwords[identities.QUERY])
    try:
        for subject in ("corral.in.b.submit", "corral.in.admin.queue", "corral.ev.job.x"):
            with pytest.raises(Refused, match="permissions violation"):
                await query.send(subject, b"{}", "x")
    finally:
        await query.close()
    assert await secured.log.last_seq() == before


async def test_another_tenants_job_reads_as_one_that_does_not_exist(secured: Secured) -> None:
    await secured.submit("b", "jb", msgspec.structs.replace(TOO_BIG, queue="qb"))
    a = await secured.session("a")
    try:
        cancel = codec.encode(CancelJob(job_id="jb"))
        seq = await a.send("corral.in.a.cancel", cancel, "cancel:jb")
        other = await a.ask("a", "explain", job="jb", after=seq)
        missing = await a.ask("a", "explain", job="zz", after=seq)
        # The same answer but for the id (and the log position, which may move in between).
        assert set(other) == set(missing) == {"seq", "error"}
        assert (other["error"], missing["error"]) == ("no job jb", "no job zz")
        # a may read why its own request was refused, and it says no more than that.
        refused = await a.ask("a", "rejections", after=seq)
        assert [(r["seq"], r["message"]) for r in refused["rejections"]] == [(seq, "no job jb")]
        assert (await a.ask("a", "jobs", after=seq))["jobs"] == []
    finally:
        await a.close()
    state = await secured.until(seq)
    assert state.jobs["jb"].phase != "cancelled"


async def test_payload_tricks_change_nothing(secured: Secured) -> None:
    await secured.submit("b", "jb", msgspec.structs.replace(TOO_BIG, queue="qb"))
    a = await secured.session("a")
    try:
        # A tenant field in the body: the intake refuses it (the tenant is the subject's), and
        # nothing is appended.
        body = {"request_id": "ja", "tenant": "b", "job": {"queue": "qa", "resources": {"gpus": 1}}}
        with pytest.raises(Refused, match="unknown field `tenant`"):
            await a.send("corral.in.a.submit", json.dumps(body).encode(), "submit:ja")
        del body["tenant"]
        seq = await a.send("corral.in.a.submit", json.dumps(body).encode(), "submit:ja")
        # An id with a dot never becomes a job: the intake says why, and nothing is appended.
        dotted = codec.encode(SubmitJob(request_id="jb.x", job=JobSpec(queue="qa", command=TRAIN)))
        with pytest.raises(Refused, match="job id 'jb.x' is not a name"):
            await a.send("corral.in.a.submit", dotted, "submit:jb.x")
        assert (await a.ask("a", "rejections", after=seq))["rejections"] == []
        state = await secured.until(seq)
        assert state.jobs["ja"].tenant == "a" and "jb.x" not in state.jobs

        jobs = await a.request("corral.read.a.jobs", json.dumps({"tenant": "b", "after": seq}).encode())
        assert [j["id"] for j in json.loads(jobs.data)["jobs"]] == ["ja"]
        for job_id in ("*", ">", "jb.x", "corral.>", "jb ", " jb", "JB"):
            told = await a.ask("a", "explain", job=job_id)
            assert told["error"] == f"no job {job_id}", job_id

        # A question whose answer would go into the log, or into b's inbox, is not answered.
        assert a.nc is not None
        before = await secured.log.last_seq()
        await a.nc.publish("corral.read.a.jobs", b"", reply="corral.in.b.submit")
        await a.nc.publish("corral.read.a.jobs", b"", reply="_INBOX.corral.b.stolen")
        barrier = await a.send("corral.in.a.cancel", codec.encode(CancelJob(job_id="none")), "c:2")
    finally:
        await a.close()
    got = await records_since(secured.log, before)
    assert [r.subject for r in got if r.seq <= barrier and r.subject.startswith("corral.in.")] == [
        "corral.in.a.cancel"
    ]


async def test_cli_acts_as_the_tenant_it_is_given(secured: Secured, tmp_path: Path) -> None:
    own = tmp_path / "a.json"  # what the operator hands tenant a: its own login only
    own.write_text(json.dumps({"a": secured.passwords["a"]}))
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "PYTHONPATH": os.getcwd()}
    env.pop("CORRAL_USER", None)
    env.pop("CORRAL_PASSWORD", None)

    async def corral(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "corral", *args, "--server", secured.url, "--credentials", str(own),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    await secured.submit("b", "jb", msgspec.structs.replace(TOO_BIG, queue="qb"))
    # b takes the message id a predictable client would use for a's submit: the stream would
    # then drop a's submit as its repeat. The CLI's ids are unguessable, so a's job still comes.
    b = await secured.session("b")
    try:
        decoy = codec.encode(SubmitJob(request_id="decoy", job=JobSpec(queue="qb", command=TRAIN)))
        await b.send("corral.in.b.submit", decoy, "submit:a:cli-1")
    finally:
        await b.close()
    job = tmp_path / "cli-1.yaml"
    job.write_text("id: cli-1\nqueue: qa\nreplicas: 2\nresources: {gpus: 8}\ncommand: [sleep, '600']\n")
    code, out, err = await corral("submit", str(job))
    # It came (the decoy took no id of a's), and the one node can never hold it: the verdict says so.
    assert (code, out) == (1, "") and err.startswith("corral: cli-1 rejected: "), err
    await secured.watch.until(lambda st: bool(st.jobs.get("cli-1") and st.jobs["cli-1"].reasons), WAIT)

    code, out, err = await corral("jobs", "-o", "json")
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)] == ["cli-1"]
    code, out, err = await corral("explain", "cli-1")
    assert code == 0 and "why: [" in out, err
    code, out, err = await corral("explain", "jb")
    assert (code, err.strip()) == (1, "corral: no such job jb")

    # As a, speaking for b: the CLI says so before sending (the server would refuse it: above).
    job.write_text("queue: qb\ncommand: [sleep, '600']\n")
    code, out, err = await corral("submit", str(job), "--user", "a", "--tenant", "b")
    assert code == 2 and "--tenant b and the login a disagree" in err, err
    code, out, err = await corral("log", "export", str(tmp_path / "log.jsonl"))
    assert code == 2 and "services login" in err, err
    code, out, err = await corral("status")
    assert code == 2 and "status reads every service's status board: it takes the services login" in err, err


async def test_server_without_users_stays_open(tmp_path: Path) -> None:
    """No users, no authorization in its config: anyone may connect, as before logins existed."""
    async with EmbeddedServer(tmp_path / "nats") as server:
        assert "authorization" not in server.config_path.read_text()
        nc = await nats.connect(server.url)
        await nc.close()


async def test_no_reply_subject_a_tenant_chooses_makes_anyone_write_for_it(secured: Secured) -> None:
    """JetStream acknowledges a publish on the reply subject the publisher names, by the server
    itself and past the publisher's permissions. So a tenant may not publish into the stream at
    all, and the intake, which appends for it, answers only into the tenant's own inbox: no reply
    subject lands a record in the log, in another tenant's inbox, or in the leaders' leases."""
    targets = (
        "corral.ev.job.forged",
        "corral.in.b.submit",
        "corral.in.admin.queue",
        "$KV.corral_leases.placer",
        "_INBOX.corral.b.stolen",
    )
    kv = await secured.log.nc.jetstream().key_value("corral_leases")
    lease_before = await kv.get("placer")
    spy = await nats.connect(secured.url, **identities.login(secured.passwords, identities.SERVICES))
    heard: list[str] = []

    async def hear(msg: Msg) -> None:
        heard.append(msg.subject)

    await spy.subscribe("_INBOX.corral.b.>", cb=hear)
    before = await secured.log.last_seq()
    a = await secured.session("a")
    try:
        assert a.nc is not None
        body = codec.encode(SubmitJob(request_id="via-reply", job=JobSpec(queue="qa", command=TRAIN)))
        for target in targets:
            # Straight into the stream, on a's own request subject: the server refuses it.
            with pytest.raises(Refused, match="permissions violation"):
                await a.request("corral.in.a.submit", body, {"Nats-Msg-Id": f"direct:{target}"})
            # Through the intake, answered elsewhere: dropped, nothing appended.
            await a.nc.publish(subjects.intake("a", "submit"), body, reply=target)
        # Headers a client must not set do not reach the log: a conditional append would let a
        # tenant fence services out of their own subjects.
        forged = {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Rollup": "all"}
        honest = codec.encode(SubmitJob(request_id="honest", job=JobSpec(queue="qa", command=TRAIN)))
        seq = await a.send("corral.in.a.submit", honest, "honest", headers=forged)
        await a.nc.flush()
    finally:
        await a.close()
    got = await records_since(secured.log, before)
    assert [(r.seq, r.subject) for r in got if r.seq <= seq] == [(seq, "corral.in.a.submit")]
    assert not (got[0].headers or {}).keys() & {"Nats-Expected-Last-Subject-Sequence", "Nats-Rollup"}
    await spy.flush()
    assert heard == []
    lease_after = await kv.get("placer")
    assert lease_after.value == lease_before.value  # renewed by its holder, never written by a
    await spy.close()


async def test_a_tenant_cannot_take_another_tenants_message_id(secured: Secured) -> None:
    """The stream drops a message id it has seen, on any subject. The intake files each id under
    its tenant, so b sending a's next id first (even a predictable one) costs a nothing."""
    b = await secured.session("b")
    a = await secured.session("a")
    try:
        decoy = codec.encode(SubmitJob(request_id="decoy", job=JobSpec(queue="qb", command=TRAIN)))
        await b.send("corral.in.b.submit", decoy, "submit:mine")
        real = codec.encode(SubmitJob(request_id="mine", job=JobSpec(queue="qa", command=TRAIN)))
        seq = await a.send("corral.in.a.submit", real, "submit:mine")
        again = await a.send("corral.in.a.submit", real, "submit:mine")  # a's own retry: one record
    finally:
        await a.close()
        await b.close()
    assert again == seq
    state = await secured.until(seq)
    assert state.jobs["mine"].tenant == "a"


async def test_a_message_id_in_a_lower_case_header_deduplicates_as_any(secured: Secured) -> None:
    # A client in another language sending ``nats-msg-id`` had its id dropped by the intake: its
    # retry was stored again, while it believed the stream would take it once.
    a = await secured.session("a")
    try:
        body = codec.encode(SubmitJob(request_id="lower", job=JobSpec(queue="qa")))
        acks = []
        for _ in range(2):
            msg = await a.request(subjects.intake("a", "submit"), body, {"nats-msg-id": "submit:lower"})
            acks.append(json.loads(msg.data))
    finally:
        await a.close()
    assert acks[1] == {**acks[0], "duplicate": True}, acks
    state = await secured.until(acks[0]["seq"])
    assert state.jobs["lower"].tenant == "a" and state.rejected_total == 0, state.rejections


async def test_the_intake_refuses_what_is_not_a_request(secured: Secured) -> None:
    a = await secured.session("a")
    try:
        before = await secured.log.last_seq()
        for verb, body, why in (
            ("submit", b"[" * 5000 + b"]" * 5000, "not a submit request"),
            ("submit", b'{"request_id":"x","job":{"queue":"qa","replicas":' + b"9" * 40 + b"}}", "<="),
            ("queue", b'{"queue":{"name":"mine"}}', "may not 'queue'"),
            ("purge", b"{}", "may not 'purge'"),
        ):
            with pytest.raises(Refused, match=why):
                await a.send(f"corral.in.a.{verb}", body, f"bad:{verb}")
        assert await secured.log.last_seq() == before
    finally:
        await a.close()


async def test_only_the_administrator_configures_the_log_and_nobody_removes_it(secured: Secured) -> None:
    """The services append and hold leases; they may not change, purge or delete the log or the
    leases' bucket. The administrator configures them; nobody may purge or delete records."""
    services = await nats.connect(secured.url, **identities.login(secured.passwords, identities.SERVICES))
    admin = await nats.connect(
        secured.url,
        inbox_prefix=identities.inbox_prefix(identities.ADMIN),
        **identities.login(secured.passwords, identities.ADMIN),
    )
    try:
        js = services.jetstream(timeout=1.0)  # a refused request is never answered
        for attempt in (
            js.purge_stream("CORRAL"),
            js.delete_stream("CORRAL"),
            js.delete_msg("CORRAL", 1),
            js.delete_stream("KV_corral_leases"),
            js.update_stream(nats.js.api.StreamConfig(name="CORRAL", subjects=["corral.>"])),
        ):
            with pytest.raises((nats.errors.Error, nats.js.errors.Error)):
                await attempt
        info = await admin.jetstream().stream_info("CORRAL")
        assert info.config.deny_purge and info.config.deny_delete
        with pytest.raises((nats.errors.Error, nats.js.errors.Error)):
            await admin.jetstream(timeout=1.0).purge_stream("CORRAL")  # no login may purge it
        assert (await admin.jetstream().stream_info("CORRAL")).state.messages == info.state.messages
    finally:
        await services.close()
        await admin.close()


async def test_a_tenant_past_its_jobs_in_the_state_hears_why_and_another_is_not_held_back(
    secured: Secured,
) -> None:
    # The admin lets a tenant have 3 jobs in the state. Tenant a floods: its first 3 jobs are
    # taken (admission rejects them, too big for the node, and they stay for the retention
    # period), the rest refused by the fold with the reason, which the read service tells a;
    # b's job is taken as ever.
    admin = await secured.session(identities.ADMIN)
    try:
        body = codec.encode(ApplyRetention(retention=RetentionSpec(finished_s=3600.0, jobs_per_tenant=3)))
        set_at = await admin.send(subjects.admin("retention"), body, "retention:limit")
    finally:
        await admin.close()
    await secured.until(set_at)
    stored = [await secured.submit("a", f"flood-{i}", TOO_BIG) for i in range(6)]
    b_at = await secured.submit("b", "jb", msgspec.structs.replace(TOO_BIG, queue="qb"))
    state = await secured.watch.until(lambda st: st.seq >= b_at and "jb" in st.jobs, WAIT)
    assert sorted(j for j in state.jobs if j.startswith("flood-")) == ["flood-0", "flood-1", "flood-2"]
    assert {t: len(ids) for t, ids in state.jobs_by_tenant.items()} == {"a": 3, "b": 1}
    a = await secured.session("a")
    try:
        for i, seq in enumerate(stored):
            told = await a.ask("a", "verdict", job=f"flood-{i}", after=seq, verb="submit", wait=WAIT)
            if i < 3:
                assert told["verdict"] == "rejected", told  # admission's: it could never fit
            else:
                assert (told["verdict"], told["code"]) == ("refused", "limit"), told
                assert "the most one tenant may have (3)" in told["reason"]
    finally:
        await a.close()


async def test_a_tenant_past_its_rate_is_told_when_to_retry_and_nothing_of_it_is_appended(
    tmp_path: Path,
) -> None:
    # The intake takes each tenant's requests at its rate: a burst of 3, then one every 100 s.
    # Tenant a's fourth submit in a row is answered at once, busy with when to send again, and
    # the log does not have it; b's is taken as ever.
    slow = dataclasses.replace(LOGINS, tenant_rate=Rate(per_s=0.01, burst=3))
    async with securing(tmp_path, slow) as secured:
        before = await secured.log.last_seq()
        login = {"user": "a", "password": secured.passwords["a"]}
        async with AsyncClient(secured.url, tenant="a", **login) as a:
            taken = [
                await a.submit(JobSpec(queue="qa", command=TRAIN), f"burst-{i}", wait=False) for i in range(3)
            ]
            with pytest.raises(Busy, match=r"more than 0.01 requests a second of yours \(burst 3\)") as told:
                await a.submit(JobSpec(queue="qa", command=TRAIN), "burst-3", wait=False)
            assert 90 < told.value.retry_s <= 100
        b_at = await secured.submit("b", "jb", JobSpec(queue="qb", command=TRAIN))
        state = await secured.watch.until(lambda st: st.seq >= b_at and "jb" in st.jobs, WAIT)
        assert sorted(j for j in state.jobs if j.startswith("burst-")) == ["burst-0", "burst-1", "burst-2"]
        appended = await records_since(secured.log, before)
        assert not [r for r in appended if b"burst-3" in r.data]
        assert [t.seq for t in taken] == sorted(t.seq for t in taken)
