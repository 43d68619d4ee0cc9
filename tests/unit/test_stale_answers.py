"""How current an answer of the read service is, from its reader to the CLI's line.

A read service that cannot read the log on (the stream has no leader, NATS does not answer)
answers from what it folded, and says since when and why (``answers.as_of``); the client reads
that as an ``AsOf`` (an answer of an older read service, saying nothing, as current), and the
CLI prints it in one line. The reader names why in an operator's words (``why_unread``).
"""

from __future__ import annotations

import json
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from corral.client import AsOf, AsyncClient, NoSuchJob
from corral.events.reader import Stall, why_unread
from corral.projections.state import State
from corral.services.cli.display import say_if_stale
from corral.services.client.results import as_of as read_as_of
from corral.services.query.decide import refusal
from corral.services.query.present import clock, stale_text
from corral.services.runtime.answers import as_of
from tests.unit.test_client_answers import client_answered

SINCE = 1_800_000_000.0


@pytest.mark.parametrize(
    ("error", "said"),
    [
        pytest.param(None, "the stream stopped sending", id="heartbeats-stopped"),
        pytest.param(nats.errors.TimeoutError(), "no stream leader", id="no-answer"),
        pytest.param(nats.js.errors.ServiceUnavailableError(), "no stream leader", id="unavailable"),
        pytest.param(nats.errors.ConnectionClosedError(), "no NATS server answers", id="closed"),
        pytest.param(nats.errors.ConnectionReconnectingError(), "no NATS server answers", id="reconnecting"),
        pytest.param(nats.js.errors.NotFoundError(), "NATS refuses to read", id="refused"),
    ],
)
def test_why_a_reader_cannot_read_on(error: Exception | None, said: str) -> None:
    assert why_unread(error).startswith(said)


def test_an_answer_says_nothing_more_while_the_log_is_read() -> None:
    body = {"seq": 7, "jobs": []}
    assert as_of(body, None) == {"seq": 7, "jobs": []}


def test_an_answer_says_since_when_and_why_it_may_be_stale() -> None:
    body = {"seq": 7, "jobs": []}
    sent = as_of(body, Stall(SINCE, "no stream leader"))
    assert sent == {"seq": 7, "jobs": [], "stale": {"since": SINCE, "why": "no stream leader"}}
    assert body == {"seq": 7, "jobs": []}  # the answer built is not changed: it may be sent again


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        pytest.param({"seq": 7, "jobs": []}, AsOf(7), id="current"),
        pytest.param(
            {"seq": 7, "stale": {"since": SINCE, "why": "no stream leader"}},
            AsOf(7, SINCE, "no stream leader"),
            id="stale",
        ),
        pytest.param({"seq": 7, "stale": {}}, AsOf(7, 0.0, ""), id="stale-saying-nothing-more"),
        pytest.param({"jobs": []}, AsOf(0), id="no-seq"),
        pytest.param({"seq": "7", "stale": "yes"}, AsOf(0), id="malformed"),
    ],
)
def test_the_client_reads_how_current_an_answer_is(answer: dict[str, Any], want: AsOf) -> None:
    assert read_as_of(json.loads(json.dumps(answer))) == want


def test_stale_text_says_since_when_why_and_as_of_which_position() -> None:
    assert stale_text(7, SINCE, "no stream leader") == (
        f"the log cannot be read since {clock(SINCE)} (no stream leader); this answer is as of position 7"
    )
    assert AsOf(7, SINCE, "no stream leader").text == stale_text(7, SINCE, "no stream leader")
    assert AsOf(7).text == "" and AsOf(7).current


async def test_the_client_keeps_how_current_its_last_answer_was() -> None:
    stale = as_of({"seq": 4, "jobs": []}, Stall(SINCE, "no stream leader"))
    client = client_answered(stale)
    assert client.as_of is None  # nothing asked yet
    assert await client.jobs() == []
    assert client.as_of == AsOf(4, SINCE, "no stream leader")
    refused = client_answered(as_of(refusal(State(seq=4), "no job 'x'"), Stall(SINCE, "no stream leader")))
    with pytest.raises(NoSuchJob):
        await refused.explain("x")
    assert refused.as_of is not None and not refused.as_of.current  # said of a refusal too


def test_the_cli_says_it_in_one_line_and_only_when_stale(capsys: pytest.CaptureFixture[str]) -> None:
    say_if_stale(None)
    say_if_stale(AsOf(7))
    assert capsys.readouterr() == ("", "")
    say_if_stale(AsOf(7, SINCE, "no stream leader"))
    out, err = capsys.readouterr()
    assert out == "" and err == f"corral: {stale_text(7, SINCE, 'no stream leader')}\n"


class Pages:
    """Stands in for the wire session: answers each question with the next of ``answers``."""

    closed = False

    def __init__(self, *answers: dict[str, object]) -> None:
        self.answers = [json.loads(json.dumps(a)) for a in answers]

    async def ask(self, asker: str, question: str, **fields: object) -> dict[str, object]:
        return self.answers.pop(0)


async def test_a_list_of_several_pages_is_as_current_as_its_least_current_page() -> None:
    # The client kept the last page's as_of: a first page answered from a stale state read as
    # current once a later page was.
    stale = as_of({"seq": 4, "jobs": [], "next": 1}, Stall(SINCE, "no stream leader"))
    current = as_of({"seq": 9, "jobs": []}, None)
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    client._session = Pages(stale, current)  # type: ignore[assignment]
    assert await client.jobs() == []
    assert client.as_of == AsOf(4, SINCE, "no stream leader")
    last = {k: v for k, v in stale.items() if k != "next"}
    client._session = Pages({**current, "next": 1}, last)  # type: ignore[assignment]
    assert await client.jobs() == []
    assert client.as_of == AsOf(4, SINCE, "no stream leader")
    client._session = Pages({**current, "next": 1}, {"seq": 11, "jobs": []})  # type: ignore[assignment]
    assert await client.jobs() == []
    assert client.as_of == AsOf(11)
