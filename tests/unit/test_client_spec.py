"""``Client.submit`` of a dict says what is wrong with it as ``corral submit -f`` says it of a job
file: one rule (``events.documents``), so a notebook user reads the same message as a CLI user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.client import AsyncClient, Client, Invalid, Unreachable
from corral.events.jobs import JobSpec
from corral.services.cli.jobfile import BadInput, convert, load_document

CASES = [
    pytest.param(
        {"queue": "q", "resources": {"gpu": 1}}, "resources.gpu (did you mean resources.gpus?)", id="typo"
    ),
    pytest.param({"queue": "q", "replica": 2, "comand": ["x"]}, "unknown fields replica", id="two-typos"),
    pytest.param(
        {"queue": "q", "resources": {"gpus": "many"}}, "expected an integer, got a string", id="type"
    ),
]


def _cli_message(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as told:
        convert(load_document(path), JobSpec, "job spec")
    return str(told.value)


@pytest.mark.parametrize(("doc", "says"), CASES)
async def test_the_async_client_refuses_a_dict_as_the_cli_refuses_a_file(
    tmp_path: Path, doc: dict[str, Any], says: str
) -> None:
    # No server is needed: a spec that does not check is refused before anything is sent.
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    with pytest.raises(Invalid) as told:
        await client.submit(doc)
    assert says in str(told.value)
    assert str(told.value) == _cli_message(tmp_path, doc)


def test_the_sync_client_refuses_it_too() -> None:
    with (
        Client("nats://127.0.0.1:1", tenant="team-a") as client,
        pytest.raises(Invalid, match="did you mean"),
    ):
        client.submit({"queue": "q", "resources": {"gpu": 1}})


@pytest.mark.parametrize(
    "spec",
    [{"queue": "q", "resources": {"gpus": 1}}, JobSpec(queue="q")],
    ids=["dict", "spec"],
)
async def test_a_job_with_nothing_to_run_is_refused_before_it_is_sent(spec: dict[str, Any] | JobSpec) -> None:
    # Admission would reject it; without ``wait`` the caller would not hear of it. No server
    # answers here: had it been sent, the error would be Unreachable.
    client = AsyncClient("nats://127.0.0.1:1", tenant="team-a")
    with pytest.raises(Invalid, match="^nothing to run: give a command, or an image whose entrypoint runs$"):
        await client.submit(spec, wait=False)
    with_image = {"queue": "q", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    with pytest.raises(Unreachable):  # its image's entrypoint runs: sent, to nobody here
        await client.submit(with_image, wait=False)
