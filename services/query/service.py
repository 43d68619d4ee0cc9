"""The read service: folds the log and answers tenants' questions on ``corral.read.<asker>.<q>``.

Tenants may not read the stream (their NATS permissions leave out ``$JS.API`` and ``corral.ev``),
so this is how a tenant sees its jobs, why they wait, its queues and its refused requests. It
follows the whole log with the one fold, like every service, and keeps each job's history
(``projections.index``) for ``explain``, and the jobs the fold lets go in SQLite (``view.py``)
for ``jobs --all`` and ``explain`` of an old job. Questions arrive on core NATS, request-reply.

Invariants:

- the asker is the second token of the subject, never anything in the payload (``answer``);
- an answer goes only into the asker's own inbox (``_INBOX.corral.<asker>.``); a question that
  names any other reply subject is dropped. Under authentication the server enforces the same
  (the ``query`` identity may publish nowhere else), so no question can make this service write
  into the log or into another identity's inbox;
- while the service cannot read the log on (its reader's consumer cannot be made again, or the
  stream has no leader), every answer says since when and why (``answers.as_of``): what it
  folded is answered still, never as if it were current;
- questions are taken only once the log has been folded to where it stood at start, and a
  question that asks for a later position (``after``) waits for it, at most ``freshness_wait``
  (not while the log cannot be read on: it is answered at once, saying as of when);
  one that asks to wait for its answer to settle (``wait``: a request's verdict, a job reaching
  a phase) waits for that, at most as long as it asked (``decide.MAX_WAIT`` at most);
- at most ``MAX_WAITING`` questions wait at once, ``MAX_WAITING_PER_ASKER`` of one asker's:
  more are answered now, in turn per asker (``MAX_QUEUED_PER_ASKER`` queued at most, output
  pages included), so no one asker can take every wait, or every answer, from the others;
- a job's output is shown only from its run's subjects, of the workers the fold placed for it
  (``decide.OutputScope``): never an earlier job of its id's.
- a question is at most ``MAX_QUESTION_BYTES``, so what questions queued or waiting hold is
  bounded too;
- what one asker's answers take of the service's time is bounded (``runtime.spent.Spent``:
  ``ANSWER_SHARE`` of a core kept up, ``ANSWER_MOST_S`` at once); past it, its next question is
  answered busy with when to ask again, not a request's verdict (a submit's would read as not
  taken) nor output (bounded by its reading slots), and never the admin's.
- one output answer costs bounded work, a ``tail`` too (it reads back from the job's newest
  message only as far as its lines need, ``TAIL_READS`` and ``TAIL_BYTES`` at most), and at
  most ``READING_AT_ONCE`` are read at once, ``READING_PER_ASKER`` of one asker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import errors as js_errors

from corral.events import subjects
from corral.events.jetstream import JetStreamLog
from corral.events.log import LogError, Record
from corral.events.nats_client import heard, open_client
from corral.projections.state import State
from corral.services.query.decide import (
    Ask,
    BadAsk,
    OutputScope,
    answer,
    output_ended,
    output_scope,
    parse_ask,
    refusal,
    settled,
    tenants_to_read,
)
from corral.services.query.view import KEPT_IN_ALL, KEPT_PER_TENANT, JobView
from corral.services.runtime import heap, identities, logs, metrics, output
from corral.services.runtime.answers import as_of
from corral.services.runtime.forecasts import ForecastStore, KvForecasts, TenantForecast
from corral.services.runtime.spent import Spent

log = logging.getLogger("corral.query")

ROLE = "query"
MAX_WAITING = 256  # questions waiting for a later log position at once; more are answered now
# ... of one asker: one tenant following many jobs leaves the others room to wait
MAX_WAITING_PER_ASKER = 32
# Questions answered at once wait their turn per asker, taken round-robin across askers, so one
# tenant asking in a loop delays another's question by at most one of its own; past this many
# queued, one asker's next is answered at once that the service is busy.
MAX_QUEUED_PER_ASKER = 64
# What one asker's answers may take of the service's time (``Spent``): a tenant keeps up a tenth
# of a core, after 2 s at once (thousands of its jobs listed page by page, each page a walk of
# the state); askers together half a core, after 4 s, binding only askers who used half their own
# lately. Turns per asker bounded how long one tenant's loop of questions delayed another's, not
# how much of the service it took: a page of jobs costs some 30 ms at 40,000 jobs, and one tenant
# asking in a loop kept the fold (in ``corral up``, every service) behind its answers.
ANSWER_SHARE, ANSWER_MOST_S = 0.1, 2.0
ANSWER_SHARE_ALL, ANSWER_MOST_ALL_S = 0.5, 4.0
# A question is a few short fields (ids are NATS tokens); one as large as NATS carries, a
# megabyte, was parsed and held queued or waiting, 96 of them per tenant at once.
MAX_QUESTION_BYTES = 16 * 1024
# Questions no share binds: a request's verdict (how a client learns what became of what it
# sent; refused busy, a stored submit would read as not taken), and output, whose pages have
# bounds of their own (``ReadingSlots``, ``TAIL_READS``).
UNCHARGED = ("verdict", "output")
PAGE_BYTES = 256 * 1024  # workers' output in one answer, as sent (NATS carries 1 MiB by default)
READING_AT_ONCE = 8  # pages of output read at once: what answers hold in memory is bounded
# ... of one asker's: another asker's question is not queued behind one asker's flood of them
READING_PER_ASKER = 2
# A tail reads back from the job's newest message, in windows of the stream's sequences each
# twice the last, until it has its lines; one answer reads at most this many messages, and bytes.
TAIL_READS = 512
TAIL_BYTES = 32 * PAGE_BYTES
TAIL_SPAN = 16  # stream sequences the first window back spans
SETTLE = 2.0  # seconds an ended job's output is waited for: its agent ships every 0.25 s

_encode = msgspec.json.Encoder().encode


async def connect(url: str, **options: Any) -> JetStreamLog:
    """A read-only log for the read service: its own inbox prefix, and no stream creation (which
    the ``query`` identity may not do; the services that write create the stream)."""
    try:
        nc = await open_client(url, name=ROLE, inbox_prefix=identities.QUERY_INBOX, **options)
    except Exception as e:
        raise LogError(f"cannot connect to {url}: {e}") from e
    return JetStreamLog(nc)


class ReadService:
    role = ROLE

    def __init__(
        self,
        log_: JetStreamLog,
        *,
        freshness_wait: float = 5.0,
        view: str = "",
        let_go_per_tenant: int = KEPT_PER_TENANT,
        let_go_in_all: int = KEPT_IN_ALL,
        forecasts: ForecastStore | None = None,
    ) -> None:
        """``view``: the SQLite file of the jobs the fold let go (by default a private temporary
        one: the service refolds the log from its start whenever it starts), which keeps at
        most ``let_go_per_tenant`` of one tenant's and ``let_go_in_all`` in all, the oldest let
        go first out. ``forecasts``: where the forecast role keeps start forecasts (by default
        its bucket, read over the log's connection)."""
        self.log = log_
        self.forecasts = forecasts if forecasts is not None else KvForecasts(log_.nc)
        self.freshness_wait = freshness_wait
        self.view = JobView(view, per_tenant=let_go_per_tenant, in_all=let_go_in_all)
        self.caught_up = asyncio.Event()
        self._folded = asyncio.Condition()
        self._waiting: set[asyncio.Task[None]] = set()
        self._waiting_of: Counter[str] = Counter()  # of those, each asker's
        # Questions to answer now, per asker in the order they came; askers served in turn.
        self._queued: dict[str, deque[tuple[str, str, Ask]]] = {}
        self._turns: deque[str] = deque()  # askers with questions queued
        self._queue_moved = asyncio.Event()
        self._watch: metrics.FoldWatch | None = None
        self._reading = ReadingSlots(READING_AT_ONCE, READING_PER_ASKER)
        self.spent = Spent(ANSWER_SHARE, ANSWER_MOST_S, ANSWER_SHARE_ALL, ANSWER_MOST_ALL_S)

    # -- folding --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the view of the jobs let go (a temporary one is deleted)."""
        self.view.close()

    @property
    def state(self) -> State:
        return self.view.state

    def fold(self, batch: list[Record]) -> None:
        self.view.fold(batch, self._watch)
        heap.settle()  # what the batch folded lives long: no full collection walks it

    # -- answering ------------------------------------------------------------------------------

    async def _on_question(self, msg: Msg) -> None:
        parsed = identities.parse_read(msg.subject)
        if parsed is None:
            return
        asker, question = parsed
        if question == "whatif":
            return  # the forecast role answers what-if questions (``services/forecast``)
        if not msg.reply.startswith(identities.inbox_prefix(asker) + "."):
            log.debug("dropped a question of %s whose answer would go to %r", asker, msg.reply)
            return
        if len(msg.data) > MAX_QUESTION_BYTES:
            too_big = f"a question is at most {MAX_QUESTION_BYTES} bytes, not {len(msg.data)}"
            await self._send(msg.reply, refusal(self.state, too_big))
            return
        if await self._past_share(msg.reply, asker, question):
            return
        try:
            ask = parse_ask(msg.data)
        except BadAsk as e:
            await self._send(msg.reply, refusal(self.state, str(e)))
            return
        may_wait = len(self._waiting) < MAX_WAITING and self._waiting_of[asker] < MAX_WAITING_PER_ASKER
        if question == "output":
            if may_wait:
                self._wait(asker, self._output(msg.reply, asker, ask))
                return
            # Answered now, in the asker's turn like any other question: a task each let one
            # asker's flood of them hold every other asker's output behind its own.
            ask = msgspec.structs.replace(ask, wait=0.0)
        else:
            # A later position is waited for while the log is read; not while it cannot be
            # (the answer then says as of when it is, at once).
            behind = ask.after > self.state.seq and self.log.stalled() is None
            wait = max(self.freshness_wait if behind else 0.0, ask.patience())
            if wait > 0 and may_wait and not self._settled(asker, question, ask):
                self._wait(asker, self._answer_later(msg.reply, asker, question, ask, wait))
                return
        queued = self._queued.get(asker)
        if queued is None:
            queued = self._queued[asker] = deque()
            self._turns.append(asker)
        if len(queued) >= MAX_QUEUED_PER_ASKER:
            busy = f"busy: {len(queued)} questions of yours wait to be answered; ask again once they are"
            await self._send(msg.reply, refusal(self.state, busy, busy=True))
            return
        queued.append((msg.reply, question, ask))
        self._queue_moved.set()

    async def _serve_queued(self) -> None:
        """Answer the queued questions as they come."""
        while True:
            await self._queue_moved.wait()
            self._queue_moved.clear()
            await self._answer_queued()

    async def _answer_queued(self) -> None:
        """Answer every question queued, one of each asker in turn."""
        while self._turns:
            asker = self._turns.popleft()
            queued = self._queued[asker]
            reply, question, ask = queued.popleft()
            if queued:
                self._turns.append(asker)
            else:
                del self._queued[asker]
            try:
                if question == "output":
                    await self._output(reply, asker, ask)
                elif not await self._past_share(reply, asker, question):  # used since it came?
                    await self._answer(reply, asker, question, ask)
            except Exception:  # noqa: BLE001 - one bad answer must not stop the others
                log.exception("answering %s's %s failed", asker, question)
            # An answer is work on the loop with no wait in it: a pass over every asker's queue
            # answered whole held the fold (in ``corral up``, every service) for its sum.
            await asyncio.sleep(0)

    def _wait(self, asker: str, answering: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(answering)
        self._waiting.add(task)
        self._waiting_of[asker] += 1

        def done(t: asyncio.Task[None]) -> None:
            self._waiting.discard(t)
            self._waiting_of[asker] -= 1
            if not self._waiting_of[asker]:
                del self._waiting_of[asker]

        task.add_done_callback(done)

    async def _past_share(self, reply: str, asker: str, question: str) -> bool:
        """Whether ``asker``'s answers used their share of the service's time lately (``spent``):
        then it is told so, and when to ask again."""
        if asker == subjects.ADMIN or question in UNCHARGED:
            return False  # the admin is the operator: its dashboard lists every tenant's jobs
        wait = self.spent.wait_s(asker, time.monotonic())
        if wait <= 0.0:
            return False
        busy = f"busy: your questions used their share of the read service's time; ask again in {wait:.1f} s"
        await self._send(reply, refusal(self.state, busy, busy=True, retry_s=wait))
        return True

    def _settled(self, asker: str, question: str, ask: Ask) -> bool:
        return settled(self.state, asker, question, ask, self.view)

    async def _answer_later(self, reply: str, asker: str, question: str, ask: Ask, wait: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with self._folded:
                await asyncio.wait_for(
                    self._folded.wait_for(lambda: self._settled(asker, question, ask)), wait
                )
        if not await self._past_share(reply, asker, question):  # used since it came?
            await self._answer(reply, asker, question, ask)

    async def _answer(self, reply: str, asker: str, question: str, ask: Ask) -> None:
        view = self.view
        wanted = tenants_to_read(view.state, asker, question, ask)
        forecasts: dict[str, TenantForecast] = {}
        if wanted:
            got = await asyncio.gather(*(self.forecasts.get(t) for t in wanted), return_exceptions=True)
            forecasts = {t: f for t, f in zip(wanted, got, strict=True) if isinstance(f, TenantForecast)}
        began = time.thread_time()  # the answer is work on the loop's own thread, with no wait
        told = answer(view.state, view.history, asker, question, ask, view, forecasts)
        used = time.thread_time() - began
        used += await self._send(reply, told)  # a page of 512 KiB costs its encoding too
        if question not in UNCHARGED:
            self.spent.charge(asker, used, time.monotonic())

    async def _output(self, reply: str, asker: str, ask: Ask) -> None:
        """A page of a job's output past ``ask.cursor`` (``services/runtime/output.py``), for the
        asker's own jobs only. Asked to wait, it waits for the job to print more (it hears the
        job's subjects), or, once the job ended, a moment for its last lines (``SETTLE``)."""
        scope = output_scope(self.state, asker, ask, self.view.placed, self.view)
        if not isinstance(scope, OutputScope):
            await self._send(reply, scope)
            return
        nc = self.log.nc
        rank = ask.rank if ask.rank >= 0 else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ask.patience()
        heard = asyncio.Event()

        async def on_output(_: Msg) -> None:
            heard.set()

        run = scope.run  # the job asked about: a later job of its id is another question's
        heard_on = output.job_filter(ask.job, run, rank)
        sub = await nc.subscribe(heard_on, cb=on_output) if ask.patience() else None
        cursor = ask.cursor
        lines: list[list[Any]] = []
        try:
            settling = False
            while True:
                heard.clear()
                # Looked at again each time: a job followed since before it was placed, or placed
                # again (another attempt, more workers), has more workers now.
                scope = output_scope(self.state, asker, ask, self.view.placed, self.view)
                if not isinstance(scope, OutputScope):
                    await self._send(reply, scope)
                    return
                if scope.run != run:  # let go, and its id the asker's next job's: it ended
                    more, ended = False, True
                    break
                async with self._reading.held(asker):
                    # whatever was past the cursor and not shown (not this job's) is not read again
                    if ask.tail >= 0:
                        lines, cursor, more = await self._tail_page(ask, rank, scope, cursor)
                    else:
                        lines, cursor, more = await self._output_page(ask, rank, scope, cursor)
                left = deadline - loop.time()
                # a job let go whose id a later job took prints no more, whatever that one does
                ended = scope.until < math.inf or output_ended(self.state, ask.job)
                if lines or more or left <= 0 or settling:
                    break
                if ended:
                    settling = True  # its last lines may still be on their way from the node
                    left = min(left, SETTLE)
                await self._output_or_end(heard, ask.job, ended, left)
        except (nats.errors.Error, js_errors.Error) as e:
            await self._send(reply, refusal(self.state, f"the output cannot be read now: {e}"))
            return
        finally:
            if sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        ended = ended and not lines and not more
        body = {"seq": self.state.seq, "lines": lines, "cursor": cursor, "more": more, "ended": ended}
        await self._send(reply, body)

    async def _output_or_end(self, heard: asyncio.Event, job_id: str, ended: bool, left: float) -> None:
        """Wait up to ``left`` for the job to print more, or, while it runs, for the fold to find
        it ended: its last lines are often shipped before its end is in the log, and a follower
        waiting for lines only would wait out its whole patience for the end."""

        async def end() -> None:
            async with self._folded:
                await self._folded.wait_for(lambda: output_ended(self.state, job_id))

        waiters: set[asyncio.Future[object]] = {asyncio.ensure_future(heard.wait())}
        if not ended:
            waiters.add(asyncio.ensure_future(end()))
        try:
            await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def _output_page(
        self, ask: Ask, rank: int | None, scope: OutputScope, cursor: int
    ) -> tuple[list[list[Any]], int, bool]:
        """``([node, attempt, rank, text] per line, cursor past them, whether more is there)``:
        the lines of the job's workers (``scope``) from ``cursor`` on, at most ``PAGE_BYTES`` of
        them as sent."""
        js = self.log.nc.jetstream()
        lines: list[list[Any]] = []
        size = skipped = 0
        while (chunk := await output.next_chunk(js, ask.job, scope.run, rank, cursor)) is not None:
            src = chunk.source
            if src is None or not scope.shows(src.node, src.attempt, src.rank, chunk.time):
                if src is not None and self._maybe_shown(scope, chunk):
                    return lines, cursor, False
                cursor = chunk.seq  # an agent wrote it where the job never ran: never shown
                skipped += 1
                if skipped >= MAX_SKIPPED:  # one answer does not walk an agent's flood whole
                    return lines, cursor, True
                continue
            texts, count = _first_lines(chunk.text, _rows_that_fit(src, 0))
            rows = _rows(src, texts)
            # lines left unsplit cost at least what fits in an answer: the message is over one
            cost = sum(c for _, c in rows) if count == len(texts) else PAGE_BYTES + 1
            if lines and size + cost > PAGE_BYTES:
                return lines, cursor, True  # this message starts the next page
            cursor = chunk.seq
            if cost > PAGE_BYTES:  # more than one answer carries, alone (lines of a byte each)
                fit = _fitting(rows, PAGE_BYTES - _MARK_COST)
                mark = f"[... {count - len(fit)} lines not shown: too many for one answer]"
                rows = fit
                rows.append(([src.node, src.attempt, src.rank, mark], _MARK_COST))
            lines += [row for row, _ in rows]
            size += cost
            if size >= PAGE_BYTES:
                return lines, cursor, True
        return lines, cursor, False

    async def _tail_page(
        self, ask: Ask, rank: int | None, scope: OutputScope, cursor: int
    ) -> tuple[list[list[Any]], int, bool]:
        """As ``_output_page``, for a ``tail``: the last ``ask.tail`` lines of each worker's
        output the stream keeps past ``cursor`` (as ``tail`` of each file), the newest that fit
        one answer. Read from the job's newest message back, a window of stream sequences at a
        time, only as far as those lines need: at most ``TAIL_READS`` messages and
        ``TAIL_BYTES`` of them, however much the job printed. What that leaves unread and the
        tail would have shown is said by a mark line, first."""
        nc = self.log.nc
        js = nc.jetstream()
        newest = await output.last_seq(nc, ask.job, scope.run, rank)
        if newest is None or newest <= cursor:
            return [], cursor, False
        tail = _Tail(min(ask.tail, MAX_TAIL))
        # a worker not folded yet may have printed too: then each worker's lines are not enough
        wanted = [w for w in scope.workers if rank is None or w[2] == rank] if self._folded_all() else None
        answered = newest  # what the answer has read up to: the follower goes on past it
        hi, span, reads, read = newest, TAIL_SPAN, 0, 0
        while hi > cursor and not tail.complete(wanted):
            span = min(span, TAIL_READS - reads - 1)
            if span <= 0:
                break
            lo = after = max(cursor, hi - span)  # the window: after lo, up to hi
            window: list[output.Chunk] = []
            while after < hi:
                if read > TAIL_BYTES:  # the window's older part is all read: not next to the rest
                    break
                chunk = await output.next_chunk(js, ask.job, scope.run, rank, after, hi)
                reads += 1
                if chunk is None:
                    after = hi
                else:
                    window.append(chunk)
                    after, read = chunk.seq, read + len(chunk.text)
            if after < hi:
                break
            for chunk in reversed(window):  # newest first
                src = chunk.source
                if src is None:
                    continue  # a subject no corral agent writes: never shown
                if scope.shows(src.node, src.attempt, src.rank, chunk.time):
                    tail.add(src, chunk.text)
                elif self._maybe_shown(scope, chunk):
                    tail.clear()  # the answer is what came before it, as if read to there
                    answered = chunk.seq - 1
            hi, span = lo, span * 2
        lines = tail.lines()
        if hi > cursor and not tail.complete(wanted):  # stopped for want of budget
            who = lines[0][:3] if lines else min(wanted or scope.workers, default=("", 0, 0))
            lines.insert(0, [*who, "[... older lines not read: more than one answer reads]"])
        return lines, answered, False

    def _maybe_shown(self, scope: OutputScope, chunk: output.Chunk) -> bool:
        """Whether a message of no worker placed for the job may be of one placed in a part of
        the log not folded yet: looked at again once it is (the agent starts a worker only once
        the log placed it)."""
        return scope.since <= chunk.time < scope.until and not self._folded_all()

    def _folded_all(self) -> bool:
        """Whether this service has folded all the log it has heard of."""
        tail = self.log.tail()
        return tail is None or self.state.seq >= tail

    async def _send(self, reply: str, body: dict[str, Any]) -> float:
        """Answer ``body`` on ``reply``; the seconds of this thread its encoding took."""
        nc = self.log.nc
        stall = self.log.stalled()
        began = time.thread_time()
        data = _encode(as_of(body, stall))
        if len(data) > nc.max_payload:
            too_big = refusal(self.state, f"the answer is {len(data)} bytes, more than NATS carries")
            data = _encode(as_of(too_big, stall))
        used = time.thread_time() - began
        try:
            await nc.publish(reply, data)
        except nats.errors.Error as e:
            log.warning("could not answer on %s: %s", reply, e)
        return used

    # -- running --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Fold the log, then answer questions and keep folding until ``stop`` is set."""
        logs.set_role(ROLE)
        telemetry = metrics.current()
        if telemetry is not None:
            # The read service is the one role that reports the cluster and counts what the fold
            # accepted: every corral runs one, and it folds the whole log.
            from corral.services.query.figures import cluster_figures

            telemetry.watch_cluster(lambda: self.state, cluster_figures)
            self._watch = metrics.FoldWatch(telemetry)
        async for batch in self.log.read(1):
            self.fold(batch)
        nc = self.log.nc
        # A queue group: replicas of the read service share the questions, each answered once.
        serving = asyncio.create_task(self._serve_queued(), name="query-answers")
        # Whether the stream has a leader, for answers to say when they may be stale (``_send``).
        leader = asyncio.create_task(self.log.watch_leader(), name="query-stream-leader")
        sub: Subscription = await nc.subscribe(f"{identities.READ}.*.*", queue=ROLE, cb=self._on_question)
        # Caught up once the server has the subscription, not once it is in the connection's
        # buffer: a question asked meanwhile from elsewhere found nobody to answer it.
        await heard(nc, ROLE)
        self.caught_up.set()
        batches = self.log.follow(self.state.seq + 1)
        stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        nxt: asyncio.Future[Any] = asyncio.ensure_future(anext(batches))
        try:
            while not stop.is_set():
                await asyncio.wait({nxt, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if nxt.done():
                    self.fold(nxt.result())
                    async with self._folded:
                        self._folded.notify_all()
                    nxt = asyncio.ensure_future(anext(batches))
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            serving.cancel()
            leader.cancel()
            for task in list(self._waiting):
                task.cancel()
            nxt.cancel()
            stopping.cancel()
            await asyncio.gather(nxt, stopping, serving, leader, *self._waiting, return_exceptions=True)
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


MAX_TAIL = 1 << 20  # lines of each worker a tail keeps at most (the answer holds PAGE_BYTES of them)
# messages not the job's that one answer walks past at most, of subjects no agent writes too
MAX_SKIPPED = 4096
_MARK_COST = 256  # what a mark line of the read service costs in an answer, at most


class ReadingSlots:
    """Pages of output read at once: at most ``in_all``, and ``per_asker`` of one asker's. An
    asker's questions past its share wait for its own slots, not in every other asker's way."""

    def __init__(self, in_all: int, per_asker: int) -> None:
        self._all = asyncio.Semaphore(in_all)
        self._per_asker = per_asker
        self._of: dict[str, tuple[asyncio.Semaphore, int]] = {}  # each asker's, and its users

    @contextlib.asynccontextmanager
    async def held(self, asker: str) -> AsyncIterator[None]:
        mine, users = self._of.get(asker, (None, 0))
        if mine is None:
            mine = asyncio.Semaphore(self._per_asker)
        self._of[asker] = (mine, users + 1)
        try:
            async with mine, self._all:
                yield
        finally:
            users = self._of[asker][1] - 1
            if users:
                self._of[asker] = (mine, users)
            else:
                del self._of[asker]


def _rows_that_fit(src: output.Source, size: int) -> int:
    """How many of ``src``'s lines could still fit in an answer holding ``size``, at most: one
    more than empty lines would (the one that does not fit ends it)."""
    return max(0, PAGE_BYTES - size) // (len(_encode([src.node, src.attempt, src.rank, ""])) + 1) + 1


def _first_lines(text: str, limit: int) -> tuple[list[str], int]:
    """A message's first ``limit`` lines, and how many it holds: a message of bare newlines is
    not split into more strings than one answer can show."""
    if not text:
        return [], 0
    body = text[:-1] if text.endswith("\n") else text  # the newline ending the last line
    parts = body.split("\n", limit)
    return parts[:limit], body.count("\n") + 1


def _last_lines(text: str, limit: int) -> list[str]:
    """A message's last ``limit`` lines (``limit`` 1 or more), split from its end only."""
    if not text:
        return []
    body = text[:-1] if text.endswith("\n") else text
    return body.rsplit("\n", limit)[-limit:]


def _rows(src: output.Source, texts: list[str]) -> list[tuple[list[Any], int]]:
    """Lines of a message as answer rows, each with what it costs in the answer (its JSON). Its
    text is shown as the agent made it, but for control characters, which an agent that is
    not corral's own could have left in: never sent on to a reader's terminal."""
    rows = [[src.node, src.attempt, src.rank, output.shown(t)] for t in texts]
    return [(row, len(_encode(row)) + 1) for row in rows]


class _Tail:
    """The lines of a tail, taken from the newest back: at most ``each`` of each worker's, until
    the next one would not fit in one answer (``full``)."""

    def __init__(self, each: int) -> None:
        self.each = each
        self.clear()

    def clear(self) -> None:
        self.newest_first: list[list[Any]] = []
        self.taken: Counter[tuple[str, int, int]] = Counter()
        self.size = 0
        self.full = False

    def add(self, src: output.Source, text: str) -> None:
        """Take a message's lines, older than every line taken so far."""
        worker = (src.node, src.attempt, src.rank)
        want = min(self.each - self.taken[worker], _rows_that_fit(src, self.size))
        if self.full or want <= 0:
            return
        for row, cost in reversed(_rows(src, _last_lines(text, want))):
            if self.size + cost > PAGE_BYTES:
                self.full = True
                return
            self.newest_first.append(row)
            self.taken[worker] += 1
            self.size += cost

    def complete(self, workers: list[tuple[str, int, int]] | None) -> bool:
        """Whether reading older messages could add nothing: the answer is full, or each of the
        ``workers`` (None: not known yet) has all the lines it may show."""
        return self.full or (workers is not None and all(self.taken[w] >= self.each for w in workers))

    def lines(self) -> list[list[Any]]:
        """The lines taken, in the order stored."""
        return self.newest_first[::-1]


def _fitting(rows: list[tuple[list[Any], int]], budget: int) -> list[tuple[list[Any], int]]:
    out, size = [], 0
    for row, cost in rows:
        if size + cost > budget:
            break
        out.append((row, cost))
        size += cost
    return out


def serve(url: str, **options: Any) -> Callable[[asyncio.Event], Any]:
    """``corral serve query``: connect, then run until ``stop``; the connection closes after."""

    async def run(stop: asyncio.Event) -> None:
        read_log = await connect(url, **options)
        reader = ReadService(read_log)
        try:
            await reader.run(stop)
        finally:
            reader.close()
            await read_log.close()

    return run
