"""What the client answers with, and how it says no: typed results and one family of errors.

The errors are the CLI's exit statuses in Python: ``Refused`` (the cluster said no: the fold
refused the request, or admission ``Rejected`` the job, or there is ``NoSuchJob`` the asker may
see) is exit 1; ``Unreachable``, ``Forbidden`` and ``Invalid`` (the request could not be made)
are exit 2; ``TimedOut`` (the request stands, its outcome is not known yet) is exit 3.
"""

from __future__ import annotations

import msgspec

from corral.services.query.present import stale_text


class CorralError(Exception):
    """Anything the client could not do; ``str()`` is one line for a person."""


class Unreachable(CorralError):
    """No corral answers there: the server, its login, the intake or the read service."""


class Forbidden(CorralError):
    """The server refused the message: this login may not act as that tenant."""


class Invalid(CorralError, ValueError):
    """Bad input, caught before anything was sent."""


class Busy(CorralError):
    """corral is up but cannot take this now: the intake (or the log behind it) a request, the
    read service or the forecast role a question, with too many of this tenant's in hand or in
    all, or the tenant sending faster than its rate. Nothing was wrong with it and nothing was
    done, unless ``maybe_stored`` (the log did not say whether it stored the request: the
    client sent it again under the same id, which the log stores once, until its ``timeout``,
    and sends it under that id again when asked to send the same request again); send it again
    after ``retry_s`` seconds (0.0 when corral did not say). A request the intake could not
    take was sent again by the client until its ``timeout`` already."""

    def __init__(
        self, message: str, retry_s: float = 0.0, too_fast: bool = False, maybe_stored: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_s = retry_s
        self.too_fast = too_fast  # the tenant past its rate (the intake's 429), not corral busy
        self.maybe_stored = maybe_stored

    @property
    def resend(self) -> bool:
        """The client sends the same message again by itself (the same id)."""
        return self.too_fast or self.maybe_stored


class TimedOut(CorralError):
    """No verdict, or not the state waited for, within the time given. The request stands."""


class Refused(CorralError):
    """The cluster said no: ``code`` is stable (``unknown``, ``duplicate``, ``illegal``,
    ``forbidden``, ``malformed``, admission's reason codes), ``reason`` is for people."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class NoSuchJob(Refused):
    """No job of that id that the asker may see (another tenant's job is answered the same)."""


class Rejected(Refused):
    """Admission rejected the job: it would never run (unknown queue, more than quota can ever
    give, a shape no node can host, ...)."""


class Submitted(msgspec.Struct, frozen=True):
    """A submit the log stored at ``seq``; ``phase`` the job's once accepted ("" when not waited
    for); ``duplicate``: the id was already this tenant's job, which this is."""

    job_id: str
    seq: int
    phase: str = ""
    duplicate: bool = False


class Applied(msgspec.Struct, frozen=True):
    """A cancel or resize the log stored at ``seq``; ``applied``: the fold took it (False when
    not waited for)."""

    job_id: str
    seq: int
    applied: bool = False


class Eta(msgspec.Struct, frozen=True):
    """A waiting job's forecast start (log time, seconds since the epoch; None: not within
    ``horizon_s`` of the forecast) and how sure it is: ``early`` and ``late`` are the starts
    forecast with every runtime estimate halved and doubled. ``assumption`` says what the
    forecast takes for granted (no later submission, jobs run for their estimates)."""

    start: float | None
    early: float | None
    late: float | None
    forecast_at: float
    horizon_s: float
    assumption: str


class OutputLine(msgspec.Struct, frozen=True, array_like=True):
    """One line a worker printed (stdout and stderr together, as written): on ``node``, in
    ``attempt`` of its job, as worker ``rank``. ``text`` is safe to print: invalid UTF-8 shows
    as U+FFFD, control characters as ``\\x1b``, a line cut at 16 KiB says so at its end."""

    node: str
    attempt: int
    rank: int
    text: str


class Job(msgspec.Struct, frozen=True):
    """A job as ``corral jobs`` lists it: ``workers`` the most it asks for, ``min_workers`` the
    least an elastic job runs with (``workers`` for any other; 0 in rows of jobs let go before
    it was recorded), ``running_workers`` how many run now; ``per_worker`` for people,
    ``gpus_per_worker`` (whole or a fraction; 0 for a MIG slice, named in ``mig``) for programs;
    ``eta``, its forecast start while it waits; ``nodes`` where it holds GPUs now, ``was_on``
    where it was once it holds them no more."""

    id: str
    tenant: str
    queue: str
    phase: str
    attempt: int
    workers: int
    per_worker: str
    nodes: str
    reason: str
    min_workers: int = 0
    running_workers: int = 0
    gpus_per_worker: int | float = 0
    mig: str = ""
    eta: Eta | None = None
    was_on: str = ""


class Reason(msgspec.Struct, frozen=True):
    """Why a job waits. ``reserved_for``: the job the free GPUs it waits for are reserved for,
    where the asker may see that job (the admin, or that job's owner); else None."""

    code: str
    message: str
    preemption_helps: bool = False
    reserved_for: str | None = None


class HistoryEntry(msgspec.Struct, frozen=True):
    seq: int
    time: float
    type: str
    subject: str
    summary: str


class Refusal(msgspec.Struct, frozen=True):
    """A request about the job that the fold refused."""

    seq: int
    code: str
    message: str


class Explanation(msgspec.Struct, frozen=True):
    """``corral explain``: the job, why it waits, its history, what of it was refused, and
    ``text`` as a person reads it."""

    job: Job
    reasons: list[Reason]
    history: list[HistoryEntry]
    text: str
    refused: list[Refusal] = []


class AsOf(msgspec.Struct, frozen=True):
    """How current an answer of the read service is: the log position its state was folded up to
    (``seq``) and, while it cannot read the log on (the stream has no leader, NATS does not
    answer), since when (``stale_since``, seconds since the epoch) and ``why``. ``text`` says
    it in one line ("" while current)."""

    seq: int
    stale_since: float | None = None
    why: str = ""

    @property
    def current(self) -> bool:
        return self.stale_since is None

    @property
    def text(self) -> str:
        if self.stale_since is None:
            return ""
        return stale_text(self.seq, self.stale_since, self.why)


def as_of(answer: dict[str, object]) -> AsOf:
    """An answer's ``AsOf``: ``seq``, and ``stale`` when the read service said it (one that
    predates it says nothing, read as current)."""
    seq = answer.get("seq", 0)
    stale = answer.get("stale")
    if not isinstance(stale, dict):
        return AsOf(seq if isinstance(seq, int) else 0)
    since, why = stale.get("since"), stale.get("why")
    return AsOf(
        seq if isinstance(seq, int) else 0,
        float(since) if isinstance(since, int | float) else 0.0,
        why if isinstance(why, str) else "",
    )


class Placed(msgspec.Struct, frozen=True):
    rank: int
    node: str
    gpus: list[int]
    islands: list[int]


class WhatIf(msgspec.Struct, frozen=True):
    """What corral would do with a job submitted now (``corral whatif``); nothing is written.
    ``start`` None: not accepted, or not within ``horizon_s``, or not found within the ``cut_s``
    seconds a what-if may simulate (``cut_s`` set then). ``preempts``: the jobs it would
    stop (another tenant's as "a job of queue X", or of "another queue"); a job that stops any
    does not start now: its ``start`` is when they must have left, ``early`` when it would if
    they left as soon as they could. ``start_now_with``:
    smaller asks that would start it at once, each checked by running it. ``text``: as a person
    reads it."""

    seq: int
    now: float
    accepted: bool
    text: str
    reason: str = ""
    starts_now: bool = False
    start: float | None = None
    early: float | None = None
    horizon_s: float = 0.0
    cut_s: float | None = None
    placed: list[Placed] = []
    preempts: list[str] = []
    why_waiting: str = ""
    assumption: str = ""
    start_now_with: list[str] = []
