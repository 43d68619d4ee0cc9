"""What the client makes of the read and forecast services' answers that are no answers: a
service with too many of the asker's questions in hand says so, and the client raises ``Busy``
(ask again), never a refusal of a malformed question."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from corral.client import AsyncClient, Busy, NoSuchJob, Refused
from corral.projections.state import State
from corral.services.query.decide import refusal


class Session:
    """Stands in for the wire session: answers every question with ``answer``."""

    closed = False

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = json.loads(json.dumps(answer))  # as it comes over the wire

    async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
        return self.answer

    async def request(self, subject: str, body: bytes, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(data=json.dumps(self.answer).encode())


def client_answered(answer: dict[str, Any]) -> AsyncClient:
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    client._session = Session(answer)  # type: ignore[assignment]
    return client


async def test_a_busy_read_service_is_busy_not_a_malformed_question() -> None:
    client = client_answered(refusal(State(), "busy: 64 questions of yours wait", busy=True))
    with pytest.raises(Busy, match="busy: 64"):
        await client.jobs()
    assert not issubclass(Busy, Refused)  # a question to ask again, not one refused


async def test_a_busy_forecast_role_is_busy_too() -> None:
    client = client_answered({"seq": 3, "error": "busy: 2 what-if questions of yours", "busy": True})
    with pytest.raises(Busy, match="what-if"):
        await client.whatif({"queue": "q", "resources": {"gpus": 1}})


@pytest.mark.parametrize(
    ("answer", "raised"),
    [
        (refusal(State(), "no job 'x'"), NoSuchJob),
        (refusal(State(), "no question 'nope'"), Refused),
        ({"seq": 1, "error": "x", "busy": "yes"}, Refused),  # only a true busy is busy
    ],
)
async def test_other_refusals_stay_refusals(answer: dict[str, Any], raised: type[Exception]) -> None:
    with pytest.raises(raised) as told:
        await client_answered(answer).jobs()
    assert not isinstance(told.value, Busy)


async def test_no_job_keeps_what_the_read_service_says_of_why() -> None:
    # A job the read service no longer keeps was told as a bare "no such job": the client
    # dropped what the service said, that it may be older than it keeps and the log has it.
    told = "no job j1 among those the read service keeps: ... older than the read service keeps"
    with pytest.raises(NoSuchJob, match="^no such job j1 among those .* older than") as raised:
        await client_answered(refusal(State(), told)).explain("j1")
    assert raised.value.code == "unknown"
    with pytest.raises(NoSuchJob, match="^no such job j1$"):
        await client_answered(refusal(State(), "no job j1")).explain("j1")


class Answers(Session):
    """Answers each question with the next of ``answers``, the last over and over."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = [json.loads(json.dumps(a)) for a in answers]
        self.asked = 0

    async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _share_used() -> dict[str, Any]:
    return refusal(State(), "busy: your questions used their share", busy=True, retry_s=0.01)


async def test_a_watch_waits_out_a_busy_answer_and_goes_on() -> None:
    # A watch lists the jobs again each time the log moves: a tenant with many jobs uses its
    # share of the read service's time, and `corral jobs --watch` ended at the first busy
    # answer. Told when to ask again, it waits that long and asks.
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    client._session = Answers({"seq": 5, "jobs": []}, _share_used(), {"seq": 6, "jobs": []})  # type: ignore[assignment]
    watched = client.watch()
    assert await anext(watched) == []
    assert await anext(watched) == []
    await watched.aclose()


async def test_waiting_for_a_phase_waits_out_a_busy_answer() -> None:
    # ``wait`` asks until the job gets there or its timeout passes: a busy answer in between
    # is a reason to ask again later, not an end of the wait.
    job = {"id": "j", "tenant": "team-a", "queue": "q", "phase": "running", "attempt": 1, "workers": 1}
    job |= {"per_worker": "1 GPU", "nodes": "n0", "reason": ""}
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    client._session = Answers(_share_used(), {"seq": 5, "job": job})  # type: ignore[assignment]
    assert (await client.wait("j", timeout=5.0)).phase == "running"


class Recorded(Answers):
    """``Answers``, keeping the fields of each question asked."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        super().__init__(*answers)
        self.fields: list[dict[str, Any]] = []

    async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
        self.fields.append(fields)
        return await super().ask(asker, question, **fields)


async def test_a_wait_asked_again_after_a_busy_answer_asks_only_what_is_left_of_its_timeout() -> None:
    # After waiting out a busy answer, the wait asked again for as long as its whole timeout
    # had left before the pause: answered only then, it ended past its timeout by the pause.
    job = {"id": "j", "tenant": "team-a", "queue": "q", "phase": "running", "attempt": 1, "workers": 1}
    job |= {"per_worker": "1 GPU", "nodes": "n0", "reason": ""}
    busy = refusal(State(), "busy: your questions used their share", busy=True, retry_s=0.3)
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    session = client._session = Recorded(busy, {"seq": 5, "job": job})  # type: ignore[assignment]
    assert (await client.wait("j", timeout=5.0)).phase == "running"
    first, again = session.fields[0]["wait"], session.fields[1]["wait"]
    assert again <= first - 0.3, session.fields


async def test_a_wait_with_no_time_left_to_ask_again_after_a_busy_answer_times_out() -> None:
    # Its timeout passing before it may ask again, the job was not seen in the phase in time:
    # TimedOut, as the wait says it raises, not the busy answer's Busy.
    from corral.client import TimedOut

    busy = refusal(State(), "busy: your questions used their share", busy=True, retry_s=30.0)
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    client._session = Answers(busy)  # type: ignore[assignment]
    with pytest.raises(TimedOut, match="busy"):
        await client.wait("j", timeout=0.5)
