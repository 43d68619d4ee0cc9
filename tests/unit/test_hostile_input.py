"""Whatever bytes a client publishes, the fold records a rejection and loses nothing else.

Every hostile payload here reached the log on an earlier build and broke something past the fold:
a document nested a thousand levels deep raised RecursionError in decoders that caught only
DecodeError (the read service died, and a corral could not start again from its log); an integer
of 100 bits passed validation and broke the msgpack snapshot and parallel ``replay --verify``; a
job id ending in a newline passed the token check and made admission admit it forever. Each is
tried on every verb, in the log beside valid jobs, and then the log must fold, snapshot, answer
the read service, replay and verify.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from corral.events import codec, subjects
from corral.events.base import Reason
from corral.events.codec import DecodeError
from corral.events.jobs import JobSpec, Mount
from corral.events.log import Record
from corral.events.subjects import is_token
from corral.projections.fold import MAX_MESSAGE, fold, fold_refusals
from corral.projections.index import job_events
from corral.projections.state import State
from corral.services.admission.validate import validate
from corral.services.cli.up import service_roles
from corral.services.query.decide import BadAsk, parse_ask
from corral.services.replay.verify import verify
from tests.builders import Cluster, LogBuilder, job

DEEP = 5000
BIG = 10**30
ID = "a" * 64  # the longest id a job may have


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _submit(**job_fields: object) -> dict[str, object]:
    spec: dict[str, object] = {"queue": "team-a", "resources": {"gpus": 1}}
    spec.update(job_fields)
    return {"request_id": "hostile", "job": spec}


# (id, verb, payload as bytes)
HOSTILE: list[tuple[str, str, bytes]] = [
    ("deep-top-level", "submit", _nested(DEEP).encode()),
    ("deep-unknown-field", "submit", b'{"request_id":"h1","x":' + _nested(DEEP).encode() + b"}"),
    ("deep-known-field", "submit", b'{"request_id":"h2","job":{"env":' + _nested(DEEP).encode() + b"}}"),
    ("deep-cancel", "cancel", b'{"job_id":"j1","reason":' + _nested(DEEP).encode() + b"}"),
    ("deep-admin-queue", "queue", b'{"queue":{"name":"q","quotas":' + _nested(DEEP).encode() + b"}}"),
    ("big-replicas", "submit", json.dumps(_submit(replicas=BIG)).encode()),
    ("big-gpus", "submit", json.dumps(_submit(resources={"gpus": BIG})).encode()),
    ("big-negative", "submit", json.dumps(_submit(max_restarts=-BIG)).encode()),
    ("big-resize", "resize", json.dumps({"job_id": "j1", "replicas": BIG}).encode()),
    ("big-quota", "queue", json.dumps({"queue": {"name": "q", "quotas": {"*": {"nominal": BIG}}}}).encode()),
    ("id-with-newline", "submit", json.dumps({"request_id": "job\n", "job": {"queue": "team-a"}}).encode()),
    ("id-with-nul", "submit", json.dumps({"request_id": "job\x00", "job": {"queue": "team-a"}}).encode()),
    ("id-with-dot", "submit", json.dumps({"request_id": "a.b", "job": {"queue": "team-a"}}).encode()),
    ("id-too-long", "submit", json.dumps({"request_id": ID + "a", "job": {"queue": "team-a"}}).encode()),
    ("cancel-huge-id", "cancel", json.dumps({"job_id": "x" * 100_000}).encode()),
    ("unknown-field", "submit", json.dumps({**_submit(), "tenant": "team-b"}).encode()),
    ("unknown-spec-field", "submit", json.dumps(_submit(replica=2)).encode()),
    ("huge-unknown-field-name", "submit", json.dumps({**_submit(), "k" * 100_000: 1}).encode()),
    ("not-json", "submit", b"\xff\xfe{{{"),
    ("json-not-object", "submit", b'"a string"'),
    ("wrong-types", "submit", json.dumps({"request_id": 7, "job": []}).encode()),
    ("float-for-int", "submit", json.dumps(_submit(replicas=1e30)).encode()),
    ("empty", "submit", b""),
]


def _log_with(verb: str, payload: bytes) -> LogBuilder:
    """A valid job before and after the hostile record, as a flood interleaves with real work."""
    lb = LogBuilder().nodes(Cluster(1)).queues("team-a").submit("alice", "before", job())
    tenant = subjects.ADMIN if verb == "queue" else "alice"
    lb.raw(subjects.request(tenant, verb), payload)
    return lb.submit("alice", "after", job())


@pytest.mark.parametrize(("verb", "payload"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_record_is_refused_and_loses_nothing_else(verb: str, payload: bytes) -> None:
    lb = _log_with(verb, payload)
    hostile_seq = lb.last_seq - 1
    state = fold(lb.records)
    assert set(state.jobs) == {"before", "after"}  # both valid jobs, and nothing else
    assert state.faults == 0
    (refusal,) = [r for r in state.rejections if r.seq == hostile_seq]
    assert refusal.code in ("malformed", "unknown")
    assert len(refusal.message) <= MAX_MESSAGE and len(refusal.job_id) <= len(ID)
    # What every reader of the log does with it must not raise either.
    msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State)  # the snapshot round trip
    replayed = State()
    job_events(replayed, lb.records, fold_refusals(replayed, lb.records))
    assert verify(lb.records, service_roles()).clean


# Those the fold refuses for what the fields say, not for how they are written.
NAMES = {"id-with-newline", "id-with-nul", "id-with-dot", "id-too-long", "cancel-huge-id"}
UNDECODABLE = [h for h in HOSTILE if h[0] not in NAMES]


@pytest.mark.parametrize(("verb", "payload"), [h[1:] for h in UNDECODABLE], ids=[h[0] for h in UNDECODABLE])
def test_every_decoder_says_decode_error(verb: str, payload: bytes) -> None:
    tenant = subjects.ADMIN if verb == "queue" else "alice"
    with pytest.raises(DecodeError):
        codec.decode_request(verb, payload)
    with pytest.raises(DecodeError):
        codec.decode_body(subjects.request(tenant, verb), payload)


def test_a_deep_service_event_is_malformed_not_a_fault() -> None:
    deep = b'{"id":"e","body":{"type":"JobAccepted","x":' + _nested(DEEP).encode() + b"}}"
    with pytest.raises(DecodeError):
        codec.decode_envelope(deep)
    state = fold([Record(1, subjects.job("j1"), deep, None, 1.0)])
    assert state.faults == 0 and state.rejections[0].code == "malformed"


def test_a_deep_question_is_a_bad_question() -> None:
    with pytest.raises(BadAsk):
        parse_ask(b'{"job":"j1","x":' + _nested(DEEP).encode() + b"}")


@pytest.mark.parametrize("name", ["job\n", "\njob", "job\r", "a b", "a.b", "a*", "a>", "", "x" * 65, "ü"])
def test_a_token_is_the_whole_name(name: str) -> None:
    assert not is_token(name)


def test_the_largest_wire_integer_still_decodes() -> None:
    body = json.dumps({"job_id": "j1", "replicas": 2**63 - 1}).encode()
    assert codec.decode_request("resize", body).replicas == 2**63 - 1  # type: ignore[attr-defined]
    with pytest.raises(DecodeError):
        codec.decode_request("resize", json.dumps({"job_id": "j1", "replicas": 2**63}).encode())


@pytest.mark.parametrize(
    "spec",
    [
        msgspec.structs.replace(job().build(), name="\x1b[2J"),
        msgspec.structs.replace(job().build(), name="two\nlines"),
        msgspec.structs.replace(job().build(), labels={"team": "a\rb"}),
        msgspec.structs.replace(job().build(), node_selector={"\x00": "x"}),
    ],
)
def test_names_and_labels_with_control_characters_are_refused_at_admission(spec: JobSpec) -> None:
    state = LogBuilder().queues("team-a").submit("alice", "j", spec).fold()
    reason = validate(state, state.jobs["j"])
    assert reason is not None and "control characters" in reason.message


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"command": ("python", "-c", "pass\0")}, "NUL"),
        ({"env": {"A=B": "x"}}, "'A=B' is not a variable"),
        ({"env": {"": "x"}}, "'' is not a variable"),
        ({"env": {"A\0B": "x"}}, "is not a variable"),
        ({"env": {"TOKEN": "a\0b"}}, "'TOKEN' is not a variable"),
        ({"mounts": (Mount("/data\0x", "/data"),)}, "NUL"),
        ({"mounts": (Mount("/data", "data"),)}, "must be an absolute path below /"),
        ({"mounts": (Mount("/data", "/proc/x"),)}, "would hide the sandbox's /proc"),
        ({"mounts": (Mount("/data", "/"),)}, "must be an absolute path below /"),
        ({"image": "registry.example/t:1", "mounts": (Mount("/a:b", "/data"),)}, "':' or ','"),
    ],
    ids=[
        "nul-argument",
        "equals-in-name",
        "empty-name",
        "nul-in-name",
        "nul-in-value",
        "nul-in-path",
        "relative-target",
        "target-in-proc",
        "target-root",
        "colon-in-a-container-volume",
    ],
)
def test_what_no_process_can_be_given_is_refused_at_admission(fields: dict[str, object], said: str) -> None:
    # Accepted, such a job was admitted and placed, then failed to start on every node it was
    # given, holding its GPUs each time, until its restarts ran out.
    spec = msgspec.structs.replace(job().build(), **fields)
    state = LogBuilder().queues("team-a").submit("alice", "j", spec).fold()
    reason = validate(state, state.jobs["j"])
    assert reason is not None and said in reason.message, reason


def _submitted(image: str) -> Reason | None:
    spec = msgspec.structs.replace(job().build(), image=image)
    state = LogBuilder().queues("team-a").submit("alice", "j", spec).fold()
    return validate(state, state.jobs["j"])


@pytest.mark.parametrize(
    "image",
    [
        "--volume=/data:/peek",
        "-v",
        "--privileged",
        "img name",
        "img\n",
        " img",
        "img;rm",
        "ü:1",
        # transports: the engine would read a host path as the image
        "dir:/etc",
        "oci-archive:/data/x.tar",
        "docker-archive:foo.tar",
        "containers-storage:x",
        "docker://busybox",
        "Upper/Case",
        "a/../b",
    ],
)
def test_an_image_that_is_no_reference_is_refused_at_admission(image: str) -> None:
    # A leading dash would reach the container engine's command line as an option of its own.
    reason = _submitted(image)
    assert reason is not None and reason.code == "invalid"
    assert reason.message.startswith("image must be a reference")


@pytest.mark.parametrize(
    "image",
    ["pytorch", "pytorch:2.3", "nvcr.io/nvidia/pytorch:24.05-py3", "localhost:5000/a/b@sha256:" + "0" * 64],
)
def test_image_references_are_admitted(image: str) -> None:
    assert _submitted(image) is None


def test_jobs_of_the_most_workers_an_int_holds_leave_a_state_that_encodes() -> None:
    # A job is counted in the fold's per-ask index from its submission, before admission has
    # judged its size: three of 2**63 - 1 workers carried the sum past what msgpack holds, and the
    # forecast role's copy of the state (and every snapshot) raised on it.
    log = LogBuilder().queues("team-a")
    for i in range(3):
        log.submit("alice", f"huge-{i}", msgspec.structs.replace(job().build(), replicas=2**63 - 1))
    state = log.fold()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=State).workers_by_ask


@pytest.mark.parametrize("models", [("*",), ("*", "H100-80GB"), ("H100-80GB", "*")])
def test_the_any_model_of_a_quota_is_no_gpu_model_a_job_may_name(models: tuple[str, ...]) -> None:
    # ``*`` in gpu_models was accepted, admitted on a queue's ``*`` quota and then placed on
    # GPUs of model ``*`` only, which none is: admitted and withdrawn again, for ever.
    spec = job().models(*models).build()
    state = LogBuilder().queues("team-a").submit("alice", "j", spec).fold()
    reason = validate(state, state.jobs["j"])
    assert reason is not None and "'*' is none" in reason.message


@pytest.mark.parametrize("subject", ["corral.in..submit", "corral.in.a b.submit", "corral.in.*.submit"])
def test_a_request_with_no_tenant_in_its_subject_is_refused(subject: str) -> None:
    # A file replay reached the fold with "corral.in..submit", and folded a job of tenant "".
    from corral.events.jobs import SubmitJob
    from tests.builders import LogBuilder, job

    lb = LogBuilder().queues("team-a")
    lb.raw(subject, codec.encode(SubmitJob(request_id="j1", job=job("team-a").build())))
    state = fold(lb.records)
    assert "j1" not in state.jobs and state.rejections[-1].subject == subject
