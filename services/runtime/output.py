"""Workers' output over NATS: the ``corral_output`` stream, which the agents write and the read
service reads, and nobody else.

Each node's agent ships what its workers print (``services/agent/output.py``) as messages of
whole lines on ``corral.out.<node>.<job>.<run>.<attempt>.<rank>``: the node first, so that NATS
lets an agent write its own node's subjects only; then the job and its run (the log position of
its submission: a job id is free again once its job was let go, while the stream keeps a week,
and a later job of the id must not read the earlier one's output as its own), then the attempt
and rank, so that a reader takes one run of a job (``corral.out.*.<job>.<run>.>``) or one rank
of it. A message's ``Corral-Offset`` header is how far into the worker's file its lines reach,
where a restarted agent resumes.

The stream is not the log: it is not folded, not replayed, and it forgets. Its limits keep a
worker that prints without end from filling the server (DESIGN.md, "Worker output"): each
worker's subject keeps its newest ``MAX_MSGS_PER_WORKER`` messages of at most ``MAX_MESSAGE``
bytes, the stream at most ``MAX_BYTES`` and ``MAX_AGE``, and when full it drops the oldest
(discard old), never refusing what an agent ships now. Tenants may neither subscribe to these
subjects nor read the stream (``identities``): a tenant reads its own jobs' output through the
read service, which checks the job is the asker's first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import Any, NamedTuple

import nats.errors
from nats.js import api
from nats.js import errors as js_errors

from corral.events import subjects
from corral.events.jetstream import placed
from corral.services.runtime import buckets

log = logging.getLogger(__name__)

STREAM = "corral_output"
OUT = "corral.out"  # corral.out.<node>.<job>.<run>.<attempt>.<rank>
OFFSET = "Corral-Offset"  # header: bytes of the worker's file the message's lines reach to

MAX_LINE = 16 * 1024  # bytes of one line shipped; the rest of a longer one is cut, with a mark
MAX_MESSAGE = 64 * 1024  # bytes of lines in one message
MAX_MSGS_PER_WORKER = 256  # messages kept per worker (subject): 16 MiB of its newest output
MAX_BYTES = 4 * 1024**3  # the whole stream
MAX_AGE = 7 * 86400.0  # seconds a line is kept
MAX_MSG_SIZE = 4 * MAX_MESSAGE  # what the server takes: headroom over what an agent sends
# C0 controls but tab, DEL, and the C1 controls: what a terminal would act on rather than show.
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# A run, an attempt or a rank in a subject: ASCII digits, written one way only. ``str.isdigit`` takes
# "²" (which ``int`` refuses) and "١" (which it reads as 1).
_NUMBER = re.compile(r"0|[1-9][0-9]{0,17}")
_ASK_TIMEOUT = 5.0  # seconds a direct get may take, as nats-py's JetStream calls


def shown(text: str) -> str:
    """``text`` as a reader's terminal may show it: control characters written out (``\\x1b``)."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def safe_text(raw: bytes) -> str:
    """A line as a reader's terminal may show it: valid UTF-8, no control characters."""
    return shown(raw.decode("utf-8", errors="replace"))


def subject(node: str, job_id: str, run: int, attempt: int, rank: int) -> str:
    """Where ``node``'s agent ships the output of a worker of ``job_id``'s ``run`` (its
    submission's log position, ``JobState.submitted_seq``)."""
    return f"{OUT}.{node}.{job_id}.{run}.{attempt}.{rank}"


def job_filter(job_id: str, run: int, rank: int | None = None, node: str = "*") -> str:
    """The subjects of one run of a job's output (of one rank of it, of one node's). ``job_id``
    must be a token: a wildcard in it would name other jobs."""
    assert subjects.is_token(job_id), job_id
    return f"{OUT}.{node}.{job_id}.{run}.*.{'*' if rank is None else rank}"


class Source(NamedTuple):
    """Whose output a message is, as its subject says."""

    node: str
    job_id: str
    run: int
    attempt: int
    rank: int


def parse(subj: str) -> Source | None:
    """The worker a subject names, or None for one no corral agent writes now (one an older
    agent wrote, without the run; one with an odd number)."""
    parts = subj.split(".")
    if len(parts) != 7 or f"{parts[0]}.{parts[1]}" != OUT:
        return None
    if not all(_NUMBER.fullmatch(p) for p in parts[4:]):
        return None
    return Source(parts[2], parts[3], int(parts[4]), int(parts[5]), int(parts[6]))


def config(replicas: int) -> api.StreamConfig:
    return api.StreamConfig(
        name=STREAM,
        subjects=[f"{OUT}.>"],
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        max_age=MAX_AGE,
        max_bytes=MAX_BYTES,
        max_msgs_per_subject=MAX_MSGS_PER_WORKER,
        max_msg_size=MAX_MSG_SIZE,
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        allow_direct=True,  # the read service and the agents get messages by subject
    )


async def ensure_stream(nc: Any, replicas: int = 1) -> None:
    """Create the output stream with ``replicas`` (the log's) or bring it to them and to these
    limits; whoever sets the corral up does it, as for the buckets. Idempotent."""
    js = nc.jetstream()
    wanted = config(replicas)
    try:
        await js.stream_info(STREAM)
    except js_errors.NotFoundError:
        with contextlib.suppress(js_errors.BadRequestError):  # another made it first
            await placed(lambda: js.add_stream(wanted))
            return
    await placed(lambda: js.update_stream(wanted))


class JetStreamOutput:
    """Where an agent ships its workers' output (``services/agent/output.OutputSink``)."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self._warned = False

    async def send(self, subj: str, data: bytes, offset: int) -> None:
        try:
            await self.js.publish(subj, data, stream=STREAM, headers={OFFSET: str(offset)})
        except js_errors.NoStreamResponseError:
            # No stream (a server set up before it existed): make it where this login may.
            with contextlib.suppress(js_errors.Error, nats.errors.Error):
                await ensure_stream(self.nc, await buckets.replicas_of_log(self.js))
            await self.js.publish(subj, data, stream=STREAM, headers={OFFSET: str(offset)})

    async def shipped(self, subj: str) -> int | None:
        """How far into its file the newest message on ``subj`` reached; None: nothing kept."""
        try:
            msg = await self.js.get_msg(STREAM, subject=subj, direct=True)
        except (js_errors.NotFoundError, nats.errors.NoRespondersError):  # nothing kept; no stream yet
            return None
        try:
            return int((msg.headers or {}).get(OFFSET, ""))
        except ValueError:
            return None


class Chunk(NamedTuple):
    seq: int
    # None: a subject no corral agent writes (an attempt or rank no number), never shown. Given
    # to the reader, not skipped here: it counts them against what one answer walks past, and
    # an agent not corral's own wrote any number of them.
    source: Source | None
    text: str  # whole lines, each ending in a newline
    time: float  # when the stream stored it (seconds since the epoch; 0: not said)


async def next_chunk(
    js: Any, job_id: str, run: int, rank: int | None, after: int, until: int | None = None
) -> Chunk | None:
    """The first message of the job's ``run`` past stream sequence ``after`` (None: none yet, or
    none up to ``until``)."""
    if until is not None and after >= until:
        return None
    try:
        msg = await js.get_msg(
            STREAM, seq=after + 1, subject=job_filter(job_id, run, rank), direct=True, next=True
        )
    except (js_errors.NotFoundError, nats.errors.NoRespondersError):  # none; no stream yet
        return None
    if until is not None and msg.seq > until:
        return None
    source = parse(msg.subject)
    if source is not None and (source.job_id != job_id or source.run != run):
        source = None
    stored = msg.time.timestamp() if msg.time is not None else 0.0
    return Chunk(msg.seq, source, (msg.data or b"").decode("utf-8", errors="replace"), stored)


async def last_seq(nc: Any, job_id: str, run: int, rank: int | None) -> int | None:
    """The stream sequence of the newest message of the job's ``run`` (None: none kept, or no
    stream yet): where a tail starts reading back from. Asked in the request's body, on the one
    direct-get subject the read service may use (``identities``)."""
    body = json.dumps({"last_by_subj": job_filter(job_id, run, rank)}).encode()
    try:
        msg = await nc.request(f"$JS.API.DIRECT.GET.{STREAM}", body, timeout=_ASK_TIMEOUT)
    except nats.errors.NoRespondersError:
        return None
    headers = msg.headers or {}
    if headers.get("Status") == "404":
        return None
    if headers.get("Status"):
        raise js_errors.APIError.from_msg(msg)
    seq = headers.get("Nats-Sequence", "")
    return int(seq) if seq.isascii() and seq.isdigit() else None
