"""The forecast role's pure parts and what the read service makes of its forecasts, on small
hand-made states: when a forecast is made again, what each tenant's key holds, how a waiting
job's row and explanation carry their start, what a what-if tells one tenant of another's jobs,
and the MIG slice it suggests."""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec
import pytest

from corral.events.jobs import JobSpec, Resources
from corral.events.queues import ApplyQueue, QueueSpec, Quota
from corral.projections.state import State
from corral.services.agent import inventory
from corral.services.forecast import decide, whatif
from corral.services.forecast.decide import EVERY_S, REFRESH_S
from corral.services.intake.decide import Refuse, Sender, judge
from corral.services.query.decide import Ask, answer, tenants_to_read
from corral.services.query.present import eta_text
from corral.services.runtime import forecasts
from corral.services.sim import eta
from corral.services.sim.driver import SimJob, Simulation
from tests.builders import TRAIN


@pytest.mark.parametrize(
    ("last_seq", "last_at", "seq", "now", "expected"),
    [
        pytest.param(-1, None, 0, 0.0, True, id="never-forecast"),
        pytest.param(5, 100.0, 5, 100.0 + EVERY_S, False, id="nothing-moved"),
        pytest.param(5, 100.0, 6, 100.0 + EVERY_S / 2, False, id="moved-but-too-soon"),
        pytest.param(5, 100.0, 6, 100.0 + EVERY_S, True, id="moved"),
        pytest.param(5, 100.0, 5, 100.0 + REFRESH_S, True, id="quiet-but-time-passed"),
    ],
)
def test_when_to_forecast_again(
    last_seq: int, last_at: float | None, seq: int, now: float, expected: bool
) -> None:
    assert decide.due(last_seq, last_at, seq, now) == expected


def test_forecasts_keep_at_most_their_share_of_a_core_busy() -> None:
    # A forecast that simulated 80 s, ended at 1000: at half a core, none before 1080, however
    # much the log moved or whether one was ever written (a lease just taken).
    rest = decide.rest_after(1000.0, 80.0, share=0.5)
    assert rest == 1080.0
    assert not decide.due(5, 900.0, 6, 1079.0, rest)
    assert not decide.due(5, None, 6, 1079.0, rest)
    assert decide.due(5, 900.0, 6, 1080.0, rest)
    assert decide.rest_after(1000.0, 80.0, share=0.25) == 1240.0


async def test_the_role_rests_after_a_forecast_for_as_long_as_its_share_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from corral.events.log import InMemoryLog
    from corral.services.forecast import service

    def costly(*_: object, **__: object) -> dict[str, tuple[float, float, float]]:
        began = time.thread_time()
        while time.thread_time() - began < 0.2:  # a deep backlog's simulation, in little
            pass
        return {}

    monkeypatch.setattr(service.eta, "band", costly)

    rested: list[float] = []
    monkeypatch.setattr(service, "rest_after", lambda ended, used: rested.append(used) or ended + 3600.0)
    svc = service.ForecastService(InMemoryLog(), store=forecasts.MemoryForecasts())
    await svc.cycle()
    assert svc._running is not None
    await svc._running
    assert len(rested) == 1 and 0.2 <= rested[0] < 5.0  # its own CPU, what it rests by
    svc.last_at = None  # due at once, but for the rest
    await svc.cycle()
    assert svc._running.done() and svc.forecasts == 1


def spec(gpus: int = 8, queue: str = "q", estimate: float | None = 1000.0, mig: str | None = None) -> JobSpec:
    return JobSpec(
        queue=queue,
        resources=Resources(gpus=gpus, cpu_milli=1000, memory_mib=1024, mig=mig),
        runtime_estimate_s=estimate,
        preemptible=False,
        command=TRAIN,
    )


def busy(*waiting: tuple[str, str], profile: str = "h100-8x", nodes: int = 1) -> Simulation:
    """``nodes`` nodes; tenant ``u``'s job holds the first node's 8 GPUs until 1000; each of
    ``waiting`` (id, tenant) asks for a whole node and waits."""
    setup = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=64)}))]
    jobs = [SimJob("u-secret", "u", spec(), 0.0, 1000.0)]
    jobs += [SimJob(job_id, tenant, spec(), 1.0, 500.0) for job_id, tenant in waiting]
    cluster = inventory.cluster(1, "h100-8x") + inventory.cluster(nodes - 1, profile, prefix="mig")
    return Simulation(cluster, setup, jobs).run(until=1.0)


def test_each_tenant_key_holds_its_own_jobs_and_a_tenant_with_none_left_is_emptied() -> None:
    state = busy(("t1", "t"), ("u1", "u")).state
    bands = eta.band(state, 1.0)
    assert set(bands) == {"t1", "u1"}
    got = decide.values(state, bands, 1.0, before=["gone"])
    assert set(got) == {"t", "u", "gone"}
    assert set(got["t"].jobs) == {"t1"} and set(got["u"].jobs) == {"u1"}
    assert got["gone"].jobs == {}
    e = got["t"].jobs["t1"]
    assert e.early is not None and e.start is not None and e.late is not None
    assert e.early <= e.start <= e.late and got["t"].seq == state.seq
    raw = forecasts.encode(got["t"])
    assert forecasts.decode(raw) == got["t"]  # what the read service reads back


def test_a_tenants_value_fits_a_message_whatever_its_ids() -> None:
    # 10,000 jobs of 64-character ids made a value of 1.25 MB: the server refused it, and the
    # tenant's forecasts were never written. The soonest are kept, as many as fit.
    from corral.projections.state import JobState, State

    state = State()
    bands = {}
    for i in range(forecasts.MOST):
        job_id = f"{i:05d}-" + "x" * 58
        state.jobs[job_id] = JobState(
            id=job_id, tenant="t", spec=JobSpec(queue="q", command=TRAIN), submitted_seq=i, submitted_at=0
        )
        start = 1.7e9 + i * 1.234567
        bands[job_id] = (start - 100.5, start, start + 200.25)
    (value,) = decide.values(state, bands, 1.0).values()
    raw = forecasts.encode(value)
    assert len(raw) <= forecasts.MOST_BYTES + 1024 and 0 < len(value.jobs) < forecasts.MOST
    assert sorted(value.jobs) == sorted(bands)[: len(value.jobs)]  # the soonest to start


def test_a_start_beyond_the_horizon_is_none() -> None:
    assert forecasts.eta(1.0, math.inf, math.inf) == forecasts.Eta(None, 1.0, None)


def test_the_read_service_adds_a_waiting_jobs_start_for_its_own_tenant_only() -> None:
    state = busy(("t1", "t"), ("u1", "u")).state
    told = decide.values(state, eta.band(state, 1.0), 1.0)
    assert tenants_to_read(state, "t", "jobs", Ask()) == ["t"]
    assert tenants_to_read(state, "admin", "jobs", Ask()) == ["t", "u"]
    assert tenants_to_read(state, "t", "queues", Ask()) == []
    rows = answer(state, {}, "t", "jobs", Ask(), forecasts={"t": told["t"]})["jobs"]
    assert [(r["id"], r["eta"]["start"]) for r in rows] == [("t1", told["t"].jobs["t1"].start)]
    rows = answer(state, {}, "u", "jobs", Ask(), forecasts={"t": told["t"], "u": told["u"]})["jobs"]
    assert {r["id"]: r["eta"] is not None for r in rows} == {"u-secret": False, "u1": True}  # running: none
    explained = answer(state, {}, "t", "explain", Ask(job="t1"), forecasts={"t": told["t"]})
    assert explained["job"]["eta"]["start"] == told["t"].jobs["t1"].start
    assert "estimated start: 1970-01-01 00:16:" in explained["text"]


def test_eta_text() -> None:
    e = {"start": 700.0, "early": 400.0, "late": 1900.0, "forecast_at": 100.0, "horizon_s": 7200.0}
    assert eta_text({**e, "assumption": "x"}, now=100.0) == "in 10 min (between 5 min and 30 min)"
    # A start and band all within the minute read "in < 1 min (between < 1 min and < 1 min)".
    soon = {**e, "start": 130.0, "early": 110.0, "late": 150.0}
    assert eta_text(soon, now=100.0) == "in < 1 min"
    assert eta_text({**soon, "start": 90.0, "early": 80.0}, now=100.0) == "now"
    # Explain's form, by the clock: a start its band cannot move (a placement back-off's end).
    band = "(between 1970-01-01 00:06:40 UTC and 1970-01-01 00:31:40 UTC)"
    assert eta_text(e) == f"1970-01-01 00:11:40 UTC {band}"
    fixed = {**e, "early": 700.0, "late": 700.0}
    assert eta_text(fixed) == "1970-01-01 00:11:40 UTC"
    beyond = {**e, "start": None, "early": None, "late": None, "assumption": "x"}
    assert eta_text(beyond).startswith("not within 2 h of the forecast at 1970-01-01 00:01:40")


def test_a_whatif_tells_nothing_of_another_tenants_job() -> None:
    state = busy().state
    data = msgspec.json.encode({"job": spec(), "id": "mine"})
    told = decide.whatif_answer(state, "t", data, 1.0)
    assert told["accepted"] and not told["starts_now"] and told["start"] == 1000.0
    assert "u-secret" not in msgspec.json.encode(told).decode()
    assert "error" in decide.whatif_answer(state, "t", b'{"job": {"queue": 1}}', 1.0)
    assert msgspec.msgpack.encode(state) == msgspec.msgpack.encode(busy().state)  # nothing written


def test_a_whatif_naming_a_field_twice_is_refused_as_the_intake_refuses_its_submit() -> None:
    data = b'{"job": {"queue": "nowhere", "queue": "q"}}'
    told = decide.whatif_answer(busy().state, "t", data, 1.0)
    assert told["error"] == "unreadable what-if: 'queue' given twice"
    intake = judge(
        Sender("t", "submit"), None, b'{"request_id": "x", "job": {"queue": "nowhere", "queue": "q"}}'
    )
    assert isinstance(intake, Refuse) and "'queue' given twice" in intake.description


def test_a_whole_gpu_job_is_offered_a_mig_slice_where_a_node_has_one() -> None:
    state = busy(profile="h100-8x-mig", nodes=2).state
    # The MIG node's GPUs take MIG slices only: one whole GPU waits for the first node.
    o = whatif.whatif(state, "t", "new", spec(1), 1.0)
    assert o.accepted and not o.starts_now
    assert whatif.mig_slices(state) == [("H100-80GB", "7g.80gb"), ("H100-80GB", "4g.40gb")]
    found = dict(whatif.suggestions(state, "t", "new", spec(1), 1.0))
    assert "--mig 7g.80gb (a MIG slice of a H100-80GB)" in found
    assert whatif.mig_slices(busy().state) == []  # no node in MIG mode: none offered


def test_what_calibrates_the_forecasts_is_each_finished_job_its_estimate_and_run() -> None:
    sim = busy(("w1", "t"))
    sim.run()
    expected = [("u-secret", 1000.0, 1000.0, "u"), ("w1", 1000.0, 500.0, "t")]
    assert sorted(eta.finished(sim.state, set())) == expected
    assert eta.finished(sim.state, {"u-secret", "w1"}) == []


def test_forecasts_are_calibrated_by_how_far_finished_jobs_estimates_were_off() -> None:
    c = eta.Calibration()
    for _ in range(eta.MIN_CALIBRATION - 1):
        c.saw(1000.0, 500.0)
    assert (c.errors(), c.spread(), c.total()) == (None, (eta.EARLY, eta.LATE), 1.0)  # too few yet
    c.saw(1000.0, 500.0)
    # Every job ran half its estimate.
    errors = c.errors()
    assert errors is not None and errors.ratios == (0.5,) * eta.MIN_CALIBRATION
    # The job holding the node is expected to end at 1000; estimates ran half as long: 500.
    state = busy(("t1", "t")).state
    assert eta.band(state, 1.0, calibration=c)["t1"][1] == pytest.approx(500.0, abs=1.0)
    assert eta.band(state, 1.0)["t1"][1] == 1000.0
    # What-if runs jobs as forecasts do: a job asked about waits for the node as t1 does.
    alone = busy().state
    assert whatif.whatif(alone, "t", "new", spec(), 1.0, errors=errors).start == pytest.approx(500.0, abs=1.0)
    assert whatif.whatif(alone, "t", "new", spec(), 1.0).start == 1000.0


def test_a_whatif_from_a_log_is_run_by_the_errors_of_the_jobs_that_succeeded_in_it() -> None:
    """Twenty jobs estimated at 100 s ran 50 s each, then one holds the node from 2,000 for its
    estimate of 1,000 s: by their errors it ends at 2,500, when the what-if job starts."""
    setup = [ApplyQueue(queue=QueueSpec("q", quotas={"*": Quota(nominal=64)}))]
    jobs = [SimJob(f"done{i}", "u", spec(estimate=100.0), 60.0 * i, 50.0) for i in range(eta.MIN_CALIBRATION)]
    jobs.append(SimJob("holder", "u", spec(), 2000.0, 1000.0))
    state = Simulation(inventory.cluster(1, "h100-8x"), setup, jobs).run(until=2000.0).state
    assert len(eta.finished(state, set())) == eta.MIN_CALIBRATION
    told = whatif.answer(state, "t", "new", spec(), 2000.0, eta.Calibration.of(state).errors())
    assert told["start"] == pytest.approx(2500.0, abs=1.0)
    assert whatif.report(state, "t", "new", spec(), 2000.0) == whatif.text(told)


def test_a_forecast_gives_up_when_told() -> None:
    """The forecast role's thread is told to stop when the role stops: it does not simulate on."""
    with pytest.raises(eta.Cancelled):
        eta.band(busy(("t1", "t")).state, 1.0, cancelled=lambda: True)


def test_recent_submissions_can_be_assumed_to_come_again() -> None:
    state = busy(("t1", "t")).state  # u-secret at 0.0, t1 at 1.0
    again = eta.recent(state, 1.5, window_s=1.0)
    assert [(j.id, j.tenant, j.arrival, j.work_s) for j in again] == [("again-0", "t", 2.0, 1000.0)]
    before = msgspec.msgpack.encode(state)
    got = eta.forecast(state, 1.5, arrivals=again)
    assert set(got.starts) == {"t1"} and msgspec.msgpack.encode(state) == before


class _Asked:
    """A forecast role whose answers are kept, not published: ``sent`` holds (reply, answer)."""

    def __init__(self, store: object = None) -> None:
        import json
        from types import SimpleNamespace

        from corral.events.log import InMemoryLog
        from corral.services.forecast import service

        self.sent: list[tuple[str, dict[str, object]]] = []

        async def publish(subject: str, body: bytes) -> None:
            self.sent.append((subject, json.loads(body)))

        log = InMemoryLog()
        log.nc = SimpleNamespace(publish=publish, max_payload=1 << 20)  # type: ignore[attr-defined]
        self.svc = service.ForecastService(log, store=store)  # type: ignore[arg-type]

    async def ask(self, who: str, n: int = 1, data: bytes = b"{}") -> None:
        from types import SimpleNamespace

        from corral.services.runtime import identities

        reply = f"{identities.inbox_prefix(who)}.{n}"
        await self.svc._on_whatif(
            SimpleNamespace(subject=identities.read_subject(who, "whatif"), reply=reply, data=data)
        )

    def told(self, who: str, n: int = 1) -> dict[str, object]:
        from corral.services.runtime import identities

        return dict(self.sent)[f"{identities.inbox_prefix(who)}.{n}"]


async def test_what_if_questions_beyond_the_caps_are_answered_busy_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each question copies the state and simulates in a thread beside the services: a tenant
    # asking in a loop gets "busy" at once past its share, and the role answers others still.
    import asyncio
    import threading

    from corral.services.forecast import service
    from corral.services.runtime import identities

    release = threading.Event()

    def slow(*_: object) -> dict[str, object]:
        release.wait(10)
        return {"seq": 0, "answered": True}

    monkeypatch.setattr(service, "whatif_answer", slow)
    role = _Asked()
    svc, sent = role.svc, role.sent
    for n in range(3):
        await role.ask("a", n)
    for who in ("b", "c", "d"):
        await role.ask(who, 0)
    busy = {subject for subject, body in sent if body.get("busy")}
    assert busy == {
        f"{identities.inbox_prefix('a')}.2",  # a's third, past its two
        f"{identities.inbox_prefix('d')}.0",  # the fifth in all, past four
    }
    release.set()
    await asyncio.gather(*svc._answering)
    answered = {subject for subject, body in sent if body.get("answered")}
    assert len(answered) == service.MAX_WHATIFS and svc._asking == {}
    await role.ask("d", 1)  # room again once they were answered
    await asyncio.gather(*svc._answering)
    assert sent[-1] == (f"{identities.inbox_prefix('d')}.1", {"seq": 0, "answered": True})


async def test_what_ifs_at_one_log_position_share_one_encoding_and_decode_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A copy was made whole on the loop for each question: the loop encodes once per log
    # position, and each question decodes its copy in its thread.
    import asyncio
    import threading

    from corral.services.forecast import service

    decoded: list[tuple[threading.Thread, int]] = []
    real_thaw = service._thaw

    def thaw(data: bytes) -> object:
        decoded.append((threading.current_thread(), id(data)))
        return real_thaw(data)

    monkeypatch.setattr(service, "_thaw", thaw)
    role = _Asked()
    svc = role.svc
    job = b'{"job": {"queue": "default", "command": ["true"], "resources": {"gpus": 1}}}'
    for n, who in enumerate(("a", "a", "b")):
        await role.ask(who, n, job)
    await asyncio.gather(*svc._answering)
    sent = [told for _, told in role.sent]
    assert len(sent) == 3 and all("error" not in told for told in sent), sent
    assert len(decoded) == 3 and threading.main_thread() not in {on for on, _ in decoded}
    assert len({data for _, data in decoded}) == 1  # one log position: one encoding for the three
    assert svc._frozen.data == b""  # not held once nothing decodes from it
    frozen, state = service._Frozen(), svc.state
    first = frozen.at(state)
    assert frozen.at(state) is first  # the log has not moved
    state.seq += 1
    assert frozen.at(state) is not first


async def test_the_encoding_is_let_go_once_a_forecast_writing_the_bucket_and_a_what_if_are_done() -> None:
    # The forecast let go of the encoding before it wrote the bucket, a what-if answered while it
    # wrote made it anew and, the forecast not done, did not let it go: held till the next one.
    import asyncio

    class SlowBucket(forecasts.MemoryForecasts):
        def __init__(self) -> None:
            super().__init__()
            self.writing, self.written = asyncio.Event(), asyncio.Event()

        async def put(self, tenant: str, value: bytes) -> None:
            self.writing.set()
            await self.written.wait()

    bucket = SlowBucket()
    role = _Asked(store=bucket)
    svc = role.svc
    svc.state = busy(("t1", "t")).state  # a waiting job: the forecast writes its tenant's key
    await svc.cycle()
    await asyncio.wait_for(bucket.writing.wait(), 30)
    await role.ask("t", 1, b'{"job": {"queue": "q", "command": ["true"], "resources": {"gpus": 1}}}')
    await asyncio.gather(*svc._answering)
    assert len(role.sent) == 1 and "error" not in role.told("t"), role.sent
    bucket.written.set()
    assert svc._running is not None
    await svc._running
    await asyncio.sleep(0)  # its done callbacks
    assert svc._frozen.data == b""


async def _forecast(svc: Any, state: State) -> None:
    """One forecast of ``state`` by ``svc``, whenever it last forecast, written when it returns."""
    svc.state, svc.last_at, svc.rest_until = state, None, -math.inf
    await svc.cycle()
    assert svc._running is not None
    await svc._running


async def test_a_tenant_with_no_job_waiting_has_no_key_whoever_wrote_it() -> None:
    # A tenant's key stayed once its jobs had all started (a value of no jobs, for good), and
    # a key written before the role restarted stayed with its stale forecasts: tenants come and
    # go over months, and each kept one.
    store = forecasts.MemoryForecasts()
    stale = forecasts.TenantForecast(1, 0.0, 3600.0, "", {"old": forecasts.Eta(5.0, 4.0, 6.0)})
    await store.put("gone", forecasts.encode(stale))  # by the role before it restarted
    svc = _Asked(store=store).svc

    await _forecast(svc, busy(("t1", "t")).state)
    assert set(store.values) == {"t"}
    told = await store.get("t")
    assert told is not None and set(told.jobs) == {"t1"}
    await _forecast(svc, busy().state)  # t1 is no longer waiting
    assert store.values == {}


def test_what_ifs_are_taken_while_their_asker_and_everyone_owe_less_than_their_most() -> None:
    spent = decide.Spent(share=0.1, most_s=60.0, share_all=0.5, most_all_s=120.0)
    assert spent.wait_s("a", 0.0) == 0.0
    spent.charge("a", 20.0, 0.0)
    spent.charge("a", 20.0, 0.0)
    assert spent.wait_s("a", 0.0) == 0.0  # 40 s owed: under its most, asked at once
    spent.charge("a", 30.0, 0.0)  # a question ran long: what it used is known once answered
    assert spent.wait_s("a", 0.0) == pytest.approx(100.0)  # 70 owed, 60 the most, paid 0.1 a second
    assert spent.wait_s("a", 100.0) == 0.0
    assert spent.wait_s("b", 0.0) == 0.0  # another asker still asks
    for who in "bcd":
        spent.charge(who, 30.0, 0.0)
    # Everyone owes 160 s, past the 120 all may: the askers who used half their own most wait
    # until it is paid back; one who asked little (or nothing) lately still asks.
    assert spent.wait_s("b", 0.0) == pytest.approx(80.0)
    assert spent.wait_s("b", 80.0) == 0.0
    assert spent.wait_s("e", 0.0) == 0.0
    spent.charge("e", 29.0, 0.0)
    assert spent.wait_s("e", 0.0) == 0.0
    spent.charge("e", 1.0, 0.0)
    assert spent.wait_s("e", 0.0) == pytest.approx((190.0 - 120.0) / 0.5)


async def test_an_asker_past_its_share_of_what_if_time_is_told_when_to_ask_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from corral.services.forecast import service

    def long(*_: object) -> dict[str, object]:
        return {"seq": 0, "answered": True}

    monkeypatch.setattr(service, "whatif_answer", long)
    role = _Asked()
    svc = role.svc
    svc._spent.charge("a", service.WHATIF_MOST_S + 5.0, time.monotonic())  # its questions ran long
    await role.ask("a")
    await role.ask("b")
    await asyncio.gather(*svc._answering)
    a, b = role.told("a"), role.told("b")
    assert a["busy"] and 0 < float(a["retry_s"]) <= 5.0 / service.WHATIF_SHARE  # type: ignore[arg-type]
    assert b == {"seq": 0, "answered": True}
    assert svc._spent._owed["b"][0] > 0  # what b's question used is charged to b


async def test_the_client_tells_when_to_ask_a_busy_role_again() -> None:
    # The role says when an asker past its share may ask again; Busy said 0.0, "ask at once".
    import json
    from types import SimpleNamespace

    from corral.client import AsyncClient
    from corral.services.client.results import Busy

    told = {"seq": 7, "error": "busy: ask again in 42 s", "busy": True, "retry_s": 42.0}

    class Session:
        async def request(self, *_: object, **__: object) -> SimpleNamespace:
            return SimpleNamespace(data=json.dumps(told).encode())

    async def connected() -> Session:
        return Session()

    client = AsyncClient("nats://127.0.0.1:1", tenant="a")
    client._connected = connected  # type: ignore[method-assign,assignment]
    with pytest.raises(Busy) as caught:
        await client.whatif({"queue": "q", "resources": {"gpus": 1}})
    assert caught.value.retry_s == 42.0


async def test_forecasts_are_written_while_the_buckets_keys_cannot_be_listed() -> None:
    # Listing the keys a writer before left is for their removal alone: while the bucket would
    # not list them, no forecast went out at all.
    class Unlisted(forecasts.MemoryForecasts):
        listings = 0

        async def tenants(self) -> set[str]:
            self.listings += 1
            if self.listings == 1:
                raise TimeoutError("no answer")
            return await super().tenants()

    store = Unlisted()
    await store.put("gone", forecasts.encode(forecasts.TenantForecast(1, 0.0, 3600.0, "", {})))
    svc = _Asked(store=store).svc

    await _forecast(svc, busy(("t1", "t")).state)
    assert set(store.values) == {"t", "gone"}  # written; the old key left for the next listing
    await _forecast(svc, busy(("t1", "t")).state)
    assert set(store.values) == {"t"}


async def test_a_what_if_says_as_of_when_while_the_log_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A what-if runs on the state folded so far: with the stream's leader gone it answered as
    # if that state were current, where the read service's answers say since when they may not be.
    import asyncio

    from corral.events.reader import Stall
    from corral.services.forecast import service

    monkeypatch.setattr(service, "whatif_answer", lambda *_: {"seq": 0, "answered": True})
    role = _Asked()
    stall: list[Stall | None] = [None]
    role.svc.log.stalled = lambda: stall[0]  # type: ignore[attr-defined]
    await role.ask("a", 0)
    await asyncio.gather(*role.svc._answering)
    stall[0] = Stall(1700000000.0, "no stream leader")
    await role.ask("a", 1)
    await asyncio.gather(*role.svc._answering)
    assert "stale" not in role.told("a", 0)
    assert role.told("a", 1)["stale"] == {"since": 1700000000.0, "why": "no stream leader"}
