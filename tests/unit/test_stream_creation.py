"""A stream's creation is asked again while the server cannot place or store it yet, or nobody
answers (a cluster electing a leader again on a loaded machine), and only then: any other
refusal is raised at once."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from corral.events.jetstream import NO_PEERS, STORE_FAILED, placed


def refusing(*errors: Exception):
    asked: list[int] = []

    async def make() -> str:
        asked.append(1)
        if len(asked) <= len(errors):
            raise errors[len(asked) - 1]
        return "created"

    return make, asked


@pytest.mark.parametrize(
    "error",
    [
        nats.js.errors.ServerError(code=500, err_code=STORE_FAILED, description="error creating store"),
        nats.js.errors.BadRequestError(code=400, err_code=NO_PEERS, description="insufficient resources"),
        nats.js.errors.ServiceUnavailableError(code=503, description="unavailable"),
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
    ],
)
async def test_a_creation_the_server_cannot_make_yet_is_asked_again(error: Exception) -> None:
    make, asked = refusing(error, error)
    assert await placed(make, within=5.0) == "created"
    assert len(asked) == 3


@pytest.mark.parametrize(
    "error",
    [
        nats.js.errors.ServerError(code=500, err_code=10001, description="some other failure"),
        nats.js.errors.BadRequestError(code=400, err_code=10058, description="stream name already in use"),
    ],
)
async def test_any_other_refusal_is_raised_at_once(error: Exception) -> None:
    make, asked = refusing(error)
    with pytest.raises(type(error)):
        await placed(make, within=5.0)
    assert len(asked) == 1


async def test_the_retries_are_bounded() -> None:
    error = nats.js.errors.ServerError(code=500, err_code=STORE_FAILED, description="error creating store")
    make, asked = refusing(*[error] * 1000)
    with pytest.raises(nats.js.errors.ServerError):
        await placed(make, within=0.3)
    assert 1 < len(asked) < 1000


async def test_nobody_answering_is_bounded_too() -> None:
    make, asked = refusing(*[nats.errors.TimeoutError()] * 1000)
    with pytest.raises(nats.errors.TimeoutError):
        await placed(make, within=0.3)
    assert 1 < len(asked) < 1000
