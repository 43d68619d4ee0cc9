"""``corral replay --verify`` on logs written in memory by the real service shells, and on small
hand-made logs for the cases a live run does not produce (a lost append race, a failing decide,
ids that name no cycle)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import msgspec
import pytest

from corral.events import codec, subjects
from corral.events.base import Event, Reason
from corral.events.decisions import GpuClaim, JobsPlaced, JobsUnschedulable, Unschedulable
from corral.events.jobs import Admission, JobAccepted, JobsAdmitted, JobSpec, Resources, SubmitJob
from corral.events.log import Append, InMemoryLog, Record
from corral.events.queues import ApplyPriorityClass, ApplyQueue, PriorityClassSpec, QueueSpec, Quota
from corral.projections.fold import fold
from corral.projections.rules import RULES
from corral.projections.state import State
from corral.services.agent import inventory
from corral.services.cli.up import register_nodes, service_roles
from corral.services.replay.report import as_dict, format_report
from corral.services.replay.verify import verify
from corral.services.runtime.shell import Decide, Service
from tests.builders import TRAIN

T0 = 1_700_000_000.0

# -- a live run in memory -----------------------------------------------------------------------


def _submit(tenant: str, job_id: str, gpus: int, replicas: int = 1) -> Append:
    spec = JobSpec(
        queue=tenant, replicas=replicas, resources=Resources(gpus=gpus, cpu_milli=1000), command=TRAIN
    )
    body = SubmitJob(request_id=job_id, job=spec)
    return Append(subjects.request(tenant, "submit"), codec.encode(body), msg_id=f"submit:{job_id}")


async def _drive(log: InMemoryLog, services: list[Service], clock: list[float]) -> None:
    """Every service folds what is new and runs a cycle, round after round, until a round
    appends nothing: what ``Service.run`` does, without its timer. The stream stamps records
    with the services' clock, as a server beside them would."""
    for _ in range(50):
        appended = 0
        for svc in services:
            log.now = clock[0]
            svc.fold(list(log.records[svc.state.seq :]))
            appended += await svc.cycle()
            clock[0] += 0.25
        if not appended:
            return
    raise AssertionError("the services never went quiet")


async def live_log() -> list[Record]:
    """Two teams with 16 GPUs of quota each on two 8×H100 nodes submit more than fits: jobs are
    accepted, admitted, placed, held back by quota and reported unschedulable."""
    log = InMemoryLog()
    log.now = T0
    clock = [T0]
    await register_nodes(log, inventory.cluster(2, "h100-8x"), T0)
    normal = ApplyPriorityClass(priority_class=PriorityClassSpec("normal", 0))
    await log.append(Append(subjects.admin("priority-class"), codec.encode(normal)))
    for team in ("team-a", "team-b"):
        spec = QueueSpec(team, quotas={"*": Quota(nominal=16)}, tenants=(team,))
        await log.append(Append(subjects.admin("queue"), codec.encode(ApplyQueue(queue=spec))))
    services = [
        Service(role, decide, log, clock=lambda: clock[0]) for role, decide in service_roles().items()
    ]
    for i, gpus in enumerate((4, 2, 8, 1)):
        await log.append(_submit("team-a", f"a-{i}", gpus))
    await _drive(log, services, clock)
    for i, (gpus, replicas) in enumerate(((8, 1), (2, 2), (1, 1), (8, 2))):
        await log.append(_submit("team-b", f"b-{i}", gpus, replicas))
    await _drive(log, services, clock)
    return list(log.records)


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return asyncio.run(live_log())


def _envelope(r: Record) -> codec.Envelope:
    return codec.decode_envelope(r.data)


def _with_body(records: list[Record], seq: int, body: Event) -> list[Record]:
    out = list(records)
    r = out[seq - 1]
    env = msgspec.structs.replace(_envelope(r), body=body)
    out[seq - 1] = msgspec.structs.replace(r, data=codec.encode(env))
    return out


def _first(records: list[Record], kind: type[Event]) -> tuple[Record, codec.Envelope]:
    for r in records:
        if r.subject.startswith("corral.ev."):
            env = _envelope(r)
            if isinstance(env.body, kind):
                return r, env
    raise AssertionError(f"no {kind.__name__} in the log")


# -- live logs ----------------------------------------------------------------------------------


def test_a_live_log_verifies_clean(records: list[Record]) -> None:
    report = verify(records, service_roles())
    assert report.clean, format_report(report)
    assert report.decisions["admission"] >= 2 and report.decisions["placer"] >= 2
    state = fold(records)
    assert {j.phase for j in state.jobs.values()} >= {"placed", "queued"}  # the log has both kinds
    assert any(isinstance(_envelope(r).body, JobsUnschedulable) for r in records if "decision" in r.subject)


def test_a_placement_on_another_gpu_is_reported(records: list[Record]) -> None:
    r, env = _first(records, JobsPlaced)
    placed = env.body
    assert isinstance(placed, JobsPlaced)
    p = placed.placements[0]
    w = p.workers[0]
    used = {c.gpu for c in w.gpus}
    other = next(g for g in range(8) if g not in used)
    moved = msgspec.structs.replace(w, gpus=(GpuClaim(other), *w.gpus[1:]))
    tampered = msgspec.structs.replace(
        placed,
        placements=(msgspec.structs.replace(p, workers=(moved, *p.workers[1:])), *placed.placements[1:]),
    )
    report = verify(_with_body(records, r.seq, tampered), service_roles())
    first = report.divergences[0]
    assert (first.seq, first.role, first.based_on, first.kind) == (
        r.seq,
        "placer",
        placed.based_on,
        "differs",
    )
    assert any(c.startswith(f"job {p.job_id}: placed differently") and str(other) in c for c in first.changes)
    assert f"seq {r.seq}: placer decision based on seq {placed.based_on}" in format_report(report)


def test_a_divergence_names_the_older_rules_it_was_decided_under(records: list[Record]) -> None:
    """After a rolling upgrade the log holds cycles an older build decided; where one differs,
    its report says under which rules it was written, beside who wrote it."""
    r, env = _first(records, JobsPlaced)
    assert isinstance(env.body, JobsPlaced)
    older = msgspec.structs.replace(
        env, body=msgspec.structs.replace(env.body, placements=()), rules=RULES - 2
    )
    tampered = list(records)
    tampered[r.seq - 1] = msgspec.structs.replace(r, data=codec.encode(older))
    report = verify(tampered, service_roles())
    first = report.divergences[0]
    assert first.seq == r.seq and first.rules == [RULES - 2]
    assert f"{env.producer}, under rules {RULES - 2} (this build's {RULES})" in format_report(report)


def test_a_divergence_of_a_record_sealed_before_rules_were_recorded_says_so(records: list[Record]) -> None:
    # It said "under rules 0", a version that never was.
    r, env = _first(records, JobsPlaced)
    assert isinstance(env.body, JobsPlaced)
    older = msgspec.structs.replace(env, body=msgspec.structs.replace(env.body, placements=()), rules=0)
    tampered = list(records)
    tampered[r.seq - 1] = msgspec.structs.replace(r, data=codec.encode(older))
    report = verify(tampered, service_roles())
    assert report.divergences[0].rules == [0]
    text = format_report(report)
    assert f"{env.producer}, under rules not recorded (this build's {RULES})" in text
    assert "rules 0" not in text


def test_an_admission_left_out_is_reported(records: list[Record]) -> None:
    r, env = _first(records, JobsAdmitted)
    admitted = env.body
    assert isinstance(admitted, JobsAdmitted) and admitted.admissions
    dropped = admitted.admissions[-1]
    fewer = msgspec.structs.replace(admitted, admissions=admitted.admissions[:-1])
    report = verify(_with_body(records, r.seq, fewer), service_roles())
    first = report.divergences[0]
    assert (first.seq, first.role) == (r.seq, "admission")
    assert f"job {dropped.job_id}: the code now admits it" in first.changes[0]


def test_a_decision_by_a_foreign_writer_is_reported(records: list[Record]) -> None:
    last = records[-1].seq
    state = fold(records)
    waiting = next(j for j in state.jobs.values() if j.phase == "queued")
    forged = JobsAdmitted(based_on=last, now=T0 + 999, admissions=(Admission(waiting.id, 0, 1),))
    env = codec.seal(forged, event_id="by-hand-1", time=T0 + 999, producer="operator@laptop")
    extra = Record(last + 1, subjects.decision("admission"), codec.encode(env), None, T0 + 999)
    report = verify([*records, extra], service_roles())
    assert len(report.divergences) == 1
    d = report.divergences[0]
    assert (d.seq, d.role, d.based_on, d.kind) == (last + 1, "admission", last, "differs")
    assert d.producers == ["operator@laptop"]
    assert "written by operator@laptop, not by the admission service" in d.changes[0]
    assert any(f"job {waiting.id}: admitted in the log" in c for c in d.changes)


def test_the_report_is_json(records: list[Record]) -> None:
    r, env = _first(records, JobsPlaced)
    assert isinstance(env.body, JobsPlaced)
    report = verify(
        _with_body(records, r.seq, msgspec.structs.replace(env.body, placements=())), service_roles()
    )
    data = json.loads(json.dumps(as_dict(report)))
    assert data["clean"] is False
    assert data["divergences"][0]["seq"] == r.seq
    assert data["divergences"][0]["role"] == "placer"
    assert data["decisions"]["placer"] >= 1


# -- hand-made logs, with roles whose decisions are known -----------------------------------------


def _decision(seq: int, role: str, body: Event, event_id: str, producer: str | None = None) -> Record:
    env = codec.seal(body, event_id=event_id, time=T0 + seq, producer=producer or f"{role}@host:1")
    return Record(seq, subjects.decision(role), codec.encode(env), None, T0 + seq)


def _job_fact(seq: int, body: Event, event_id: str, producer: str = "admission@host:1") -> Record:
    env = codec.seal(body, event_id=event_id, time=T0 + seq, producer=producer)
    job_id: str = body.job_id  # type: ignore[attr-defined]
    return Record(seq, subjects.job(job_id), codec.encode(env), None, T0 + seq)


def _noise(seq: int) -> Record:
    """A record no role wrote, so that the state moves."""
    body = ApplyQueue(queue=QueueSpec(f"q{seq}"))
    return Record(seq, subjects.admin("queue"), codec.encode(body), None, T0 + seq)


def _stuck(state: State, now: float) -> list[Event]:
    """Reports job ``j`` unschedulable, then accepts it: two events, index 0 on the decision
    subject, as a placer-like role would."""
    why = (Reason("no-fit", f"queues: {len(state.queues)}"),)
    return [
        JobsUnschedulable(based_on=state.seq, now=now, jobs=(Unschedulable("j", 0, why),)),
        JobAccepted(job_id="j", priority=len(state.queues)),
    ]


def test_a_missing_first_event_with_the_rest_in_place_is_a_lost_race() -> None:
    log = [_noise(1), _noise(2)]
    events = _stuck(fold(log), T0 + 3)
    log.append(_job_fact(3, events[1], "placer:2:1", producer="placer@host:1"))
    report = verify(log, {"placer": _stuck})
    assert report.clean, format_report(report)
    assert any("was not stored, the append losing a race" in n for n in report.notes)


def test_an_event_at_the_wrong_position_is_not_a_lost_race() -> None:
    log = [_noise(1), _noise(2)]
    events = _stuck(fold(log), T0 + 3)
    log.append(_job_fact(3, msgspec.structs.replace(events[1], priority=7), "placer:2:1", "placer@host:1"))
    report = verify(log, {"placer": _stuck})
    assert [d.kind for d in report.divergences] == ["differs"]
    assert any(
        "job j: accepted differently: log priority 7 (seq 3); now priority 2" in c
        for c in report.divergences[0].changes
    )


def test_decisions_see_the_state_folded_up_to_based_on() -> None:
    seen: list[tuple[int, int, float]] = []

    def spy(state: State, now: float) -> list[Event]:
        seen.append((state.seq, len(state.queues), now))
        return _stuck(state, now)

    log: list[Record] = [_noise(1), _noise(2)]
    events = _stuck(fold(log), T0 + 3)
    log += [_decision(3, "admission", events[0], "admission:2:0"), _job_fact(4, events[1], "admission:2:1")]
    log.append(_noise(5))
    later = _stuck(fold(log), T0 + 6)
    log += [_decision(6, "admission", later[0], "admission:5:0"), _job_fact(7, later[1], "admission:5:1")]
    report = verify(log, {"admission": spy})
    assert report.clean, format_report(report)
    assert seen == [(2, 2, T0 + 3), (5, 3, T0 + 6)]
    assert report.decisions == {"admission": 2} and report.events == 4


def test_a_role_that_changes_its_input_changes_nothing_else() -> None:
    def vandal(state: State, now: float) -> list[Event]:
        decided = _stuck(state, now)[:1]
        state.queues.clear()
        return decided

    log = [_noise(1), _noise(2)]
    first = _stuck(fold(log), T0 + 3)[0]
    log.append(_decision(3, "placer", first, "placer:2:0"))
    # Admission decides on the same state as the vandal did, and again on a later one.
    events = _stuck(fold(log[:2]), T0 + 4)
    log += [_decision(4, "admission", events[0], "admission:2:0"), _job_fact(5, events[1], "admission:2:1")]
    log.append(_noise(6))
    later = _stuck(fold(log), T0 + 7)
    log += [_decision(7, "admission", later[0], "admission:6:0"), _job_fact(8, later[1], "admission:6:1")]
    report = verify(log, {"placer": vandal, "admission": _stuck})
    assert report.clean, format_report(report)


def test_a_decide_that_fails_is_reported() -> None:
    def broken(state: State, now: float) -> Sequence[Event]:
        raise KeyError("gone")

    log = [_noise(1), _decision(2, "placer", JobsPlaced(based_on=1, now=T0, placements=()), "placer:1:0")]
    report = verify(log, {"placer": broken})
    assert [(d.kind, d.seq) for d in report.divergences] == [("error", 2)]
    assert "KeyError" in report.divergences[0].changes[0]


@pytest.mark.parametrize(
    ("record", "why"),
    [
        pytest.param(
            _job_fact(2, JobAccepted(job_id="j", priority=0), "accept-j", producer="someone@else"),
            "does not name the cycle",
            id="job-fact-without-cycle-id",
        ),
        pytest.param(
            _decision(2, "placer", JobsPlaced(based_on=2, now=T0, placements=()), "by-hand"),
            "not before its own seq 2",
            id="based-on-itself",
        ),
        pytest.param(
            Record(2, subjects.decision("placer"), b'{"id": "placer:1:0", "type": "JobsPl', None, T0),
            "not a readable event",
            id="torn-record",
        ),
    ],
)
def test_decisions_that_cannot_be_rerun_are_reported(record: Record, why: str) -> None:
    roles: dict[str, Decide] = {"placer": lambda s, n: [], "admission": lambda s, n: []}
    report = verify([_noise(1), record], roles)
    assert [d.kind for d in report.divergences] == ["unverifiable"]
    assert why in report.divergences[0].changes[0]


def test_records_of_other_writers_are_not_decisions() -> None:
    roles: dict[str, Decide] = {"placer": lambda s, n: []}
    node = inventory.cluster(1, "t4-2x")[0]
    from corral.events.nodes import NodeRegistered

    env = codec.seal(
        NodeRegistered(node=node[0], inventory=node[1]), event_id="register:x", time=T0, producer="a"
    )
    report = verify([_noise(1), Record(2, subjects.node(node[0]), codec.encode(env), None, T0)], roles)
    assert report.clean and report.decisions == {} and report.events == 0


def test_processes_sharing_the_work_report_the_same(records: list[Record]) -> None:
    r, env = _first(records, JobsPlaced)
    assert isinstance(env.body, JobsPlaced)
    tampered = _with_body(
        records, r.seq, msgspec.structs.replace(env.body, placements=env.body.placements[1:])
    )
    for log in (records, tampered):
        alone = verify(log, service_roles(), workers=1)
        shared = verify(log, service_roles(), workers=2)
        assert as_dict(shared) == as_dict(alone)
    assert not alone.clean


def test_an_event_a_role_stamped_is_checked_wherever_it_sits(records: list[Record]) -> None:
    r, env = _first(records, JobsPlaced)
    last = records[-1].seq
    body = msgspec.structs.replace(env.body, based_on=last)
    moved = codec.seal(body, event_id=f"placer:{last}:0", time=T0 + 999, producer="placer@elsewhere:1")
    node = next(iter(fold(records).nodes))
    extra = Record(last + 1, subjects.node(node), codec.encode(moved), None, T0 + 999)
    report = verify([*records, extra], service_roles())
    assert [(d.seq, d.role, d.based_on) for d in report.divergences] == [(last + 1, "placer", last)]


def test_a_log_that_ends_inside_a_cycle_matches_up_to_its_end(records: list[Record]) -> None:
    r, env = _first(records, JobsAdmitted)
    cycle_start = min(x.seq for x in records if _is_from(x, env.id.rsplit(":", 1)[0]))
    assert cycle_start < r.seq - 1  # the cycle accepted jobs before it admitted them
    report = verify(records[: r.seq - 2], service_roles())
    assert report.clean, format_report(report)
    assert any("the log ends before the rest of the cycle" in n for n in report.notes)


def _is_from(r: Record, cycle: str) -> bool:
    return r.subject.startswith("corral.ev.") and _envelope(r).id.startswith(cycle + ":")
