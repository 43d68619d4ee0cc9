"""``corral dashboard``: a live web page of the cluster, over the read service, as one identity.

The page (plain HTML, JS and CSS from this package's ``static/``, no build step, nothing fetched
from elsewhere) draws the board ``board.build`` makes and redraws it on every server-sent event.

``Feed`` follows the read service: it asks ``gpus`` with ``after`` one past the log position it
last showed, which the read service answers as soon as its state moves past it (or after its
freshness wait, unchanged); then it asks ``queues`` and ``jobs``, builds the board and wakes every
page listening on ``/events``. So the page moves when the log does, and a quiet log costs one
question per freshness wait. Refreshes are at least ``min_interval`` apart, so a busy log costs
the read service a bounded number of questions whatever its rate.

Tenancy is the read service's: the dashboard asks as its identity (a login's, or on a server
without logins the ``--tenant`` it is given, else ``admin``) and shows what the answers hold. One
dashboard is one identity: anyone who can open its page sees what that identity may, so it
listens on localhost unless told otherwise, and ``corral dashboard`` makes a key that every
request but the page's static files must carry (``?key=``, in the address it prints): a job's
workers share their node's network, and the page of a dashboard running there, the admin's by
default, named every tenant's jobs to any job that opened localhost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.resources
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from corral.services.dashboard import board
from corral.services.query.client import Refused, Session, every_page

log = logging.getLogger("corral.dashboard")

STATIC = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
KEEPALIVE_S = 15.0  # a comment line on a quiet stream, so proxies and browsers keep it open
RETRY_S = 1.0  # after the read service could not be reached or refused
JOB_PAGES = 16  # of a tenant's jobs, the board shows at most the newest pages (8 MiB of rows)


class Feed:
    """The newest board for one identity, and a wake-up for whoever waits for a newer one."""

    def __init__(self, url: str, asker: str, password: str | None, *, min_interval: float = 0.2) -> None:
        self.url = url
        self.asker = asker
        self.password = password
        self.min_interval = min_interval
        self.board: dict[str, Any] | None = None
        self.problem = ""  # why the board is stale, in a person's words; empty when live
        self.version = 0  # bumped each time the board or the problem changes
        self._moved = asyncio.Condition()
        self._watch: Session | None = None
        self._asks: Session | None = None
        self._asking = asyncio.Lock()  # a session answers one question at a time

    async def _session(self) -> Session:
        # Longer than the read service's freshness wait: a question about a later log position
        # is answered only when the log gets there or that wait ends.
        return await Session.open(self.url, self.asker, self.password, timeout=15.0)

    async def close(self) -> None:
        for s in (self._watch, self._asks):
            if s is not None:
                await s.close()

    async def _publish(self, new_board: dict[str, Any] | None, problem: str) -> None:
        async with self._moved:
            if new_board is not None:
                self.board = new_board
            self.problem = problem
            self.version += 1
            self._moved.notify_all()

    async def wait_newer(self, version: int, timeout: float) -> int:
        """Wait until the version is past ``version`` (or ``timeout``); the version now."""
        async with self._moved:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait_for(lambda: self.version > version), timeout)
            return self.version

    def current(self) -> dict[str, Any]:
        return {"board": self.board, "problem": self.problem, "version": self.version}

    async def run(self) -> None:
        """Follow the read service until cancelled."""
        seq = -1
        while True:
            try:
                if self._watch is None:
                    self._watch = await self._session()
                w = self._watch
                probe = await w.ask(self.asker, "gpus", after=seq + 1)
                if probe.get("seq", seq) != seq or self.problem:
                    probe = await every_page(w, self.asker, "gpus", probe)
                    queues = await w.ask(self.asker, "queues")
                    jobs = await self._every_job(w)
                    made = board.build(self.asker, probe, queues, jobs)
                    seq = int(probe["seq"])
                    await self._publish(made, "")
                await asyncio.sleep(self.min_interval)
            except board.Unanswered as e:
                log.warning("the read service: %s", e)
                if e.retry_s:  # busy: the session is sound, the asker asks again when told
                    await self._publish(None, str(e))
                    await asyncio.sleep(max(e.retry_s, RETRY_S))
                else:
                    await self._again(str(e))
            except Refused as e:
                log.warning("the read service: %s", e)
                await self._again(str(e))
            except Exception as e:  # noqa: BLE001 - a feed that ends shows its last board as live
                log.exception("the dashboard's feed")
                await self._again(f"the dashboard could not read the cluster: {type(e).__name__}")

    async def _again(self, problem: str) -> None:
        """Show ``problem``, drop the session, and wait a moment before asking again."""
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await self._watch.close()
            self._watch = None
        await self._publish(None, problem)
        await asyncio.sleep(RETRY_S)

    async def _every_job(self, w: Session) -> dict[str, Any]:
        """The asker's jobs, page after page: the first page alone left out a tenant's newest
        once its rows passed a page (512 KiB). Of more than ``JOB_PAGES``, the newest (waiting
        and running jobs are among them)."""
        return await every_page(w, self.asker, "jobs", most=JOB_PAGES)

    async def explain(self, job_id: str) -> dict[str, Any]:
        """A job's timeline, or raises ``board.Unanswered`` (no such job, for this identity)."""
        async with self._asking:
            if self._asks is None:
                self._asks = await self._session()
            try:
                answer = await self._asks.ask(self.asker, "explain", job=job_id)
            except Refused:
                await self._asks.close()
                self._asks = None
                raise
        return board.timeline(job_id, answer)


FEED = web.AppKey("feed", Feed)


async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info.get("name", "index.html")
    if name not in STATIC:
        raise web.HTTPNotFound()
    data = (importlib.resources.files("corral.services.dashboard") / "static" / name).read_bytes()
    return web.Response(body=data, content_type=STATIC[name], headers={"Cache-Control": "no-cache"})


async def _board(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[FEED].current())


async def _job(request: web.Request) -> web.StreamResponse:
    try:
        return web.json_response(await request.app[FEED].explain(request.match_info["job"]))
    except board.Unanswered as e:
        return web.json_response({"error": str(e)}, status=404)
    except Refused as e:
        return web.json_response({"error": str(e)}, status=503)


async def _events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the board now, then each newer one as it is made."""
    feed = request.app[FEED]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent = -1
    while True:
        version = await feed.wait_newer(sent, KEEPALIVE_S)
        if version == sent:
            await resp.write(b": still here\n\n")
            continue
        sent = version
        data = json.dumps(feed.current(), separators=(",", ":"))
        await resp.write(f"event: board\ndata: {data}\n\n".encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, as a listener or a Host header names it, with or
    without its port) is this machine's loopback."""
    name = host.strip().lower()
    if name.startswith("["):  # [::1] or [::1]:8080, nothing else
        end = name.find("]")
        rest = name[end + 1 :] if end > 0 else "x"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return False
        name = name[1:end]
    elif name.count(":") == 1:  # name:port; a bare IPv6 address has more colons
        name, port = name.split(":", 1)
        if not port.isdigit():
            return False
    if name in ("localhost", "localhost.", "::1"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@web.middleware
async def _loopback_hosts(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """On loopback, answer only requests that name loopback: a web page the operator visits
    could otherwise have its own name resolve to 127.0.0.1 (DNS rebinding) and read the board
    with the dashboard's identity."""
    if not is_loopback(request.host):
        raise web.HTTPMisdirectedRequest(text="this dashboard answers only on localhost")
    return await handler(request)


def _keyed(key: str) -> Any:
    """Answer only requests that carry ``key`` (the static files excepted: they hold no one's
    data). Listening on loopback keeps out other machines, not what runs on this one."""

    @web.middleware
    async def keyed(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        given = request.query.get("key", "")
        if not request.path.startswith("/static/") and not hmac.compare_digest(given.encode(), key.encode()):
            raise web.HTTPForbidden(text="open the address `corral dashboard` printed: it carries its key")
        return await handler(request)

    return keyed


def make_app(feed: Feed, loopback: bool = True, key: str | None = None) -> web.Application:
    """The dashboard's routes; ``loopback``: it listens on loopback only, and answers only
    requests whose Host names it so; ``key``: only requests that carry it (None: any)."""
    middlewares: list[Any] = [_loopback_hosts] if loopback else []
    if key is not None:
        middlewares.append(_keyed(key))
    app = web.Application(middlewares=middlewares)
    app[FEED] = feed

    async def follow(app: web.Application) -> Any:
        task = asyncio.create_task(feed.run(), name="dashboard-feed")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await feed.close()

    app.cleanup_ctx.append(follow)
    app.router.add_get("/", _static)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/api/board", _board)
    app.router.add_get("/api/jobs/{job}", _job)
    app.router.add_get("/events", _events)
    return app


# Connections held at once, and how long one may sit without a request: past them a connection
# is closed. Visitors that opened connections and sent nothing (or a header line now and then)
# were held for good, and some twenty thousand of them took every file descriptor the process
# had: the dashboard then accepted no one. (A page holds one or two: its events, a request.)
MAX_CONNECTIONS = 256
IDLE_S = 15.0


class _Full(asyncio.Protocol):
    """A connection past ``MAX_CONNECTIONS``: closed as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


async def serve(
    feed: Feed,
    host: str,
    port: int,
    stop: asyncio.Event,
    listening: asyncio.Future[tuple[str, int]] | None = None,
    key: str | None = None,
) -> None:
    """Serve the dashboard until ``stop``, to requests carrying ``key`` (None: any); prints
    where, with the key, once it listens (and gives the address to ``listening``)."""
    runner = web.AppRunner(
        make_app(feed, loopback=is_loopback(host), key=key), shutdown_timeout=1.0, keepalive_timeout=IDLE_S
    )
    await runner.setup()
    server = runner.server
    assert server is not None

    def accept() -> asyncio.Protocol:
        return _Full() if len(server.connections) >= MAX_CONNECTIONS else server()

    listener = await asyncio.get_running_loop().create_server(accept, host, port)
    try:
        bound = listener.sockets[0].getsockname()
        query = "" if key is None else f"?key={key}"
        print(
            f"dashboard at http://{bound[0]}:{bound[1]}/{query} as {feed.asker} (corral at {feed.url})",
            flush=True,
        )
        if listening is not None:
            listening.set_result((bound[0], bound[1]))
        await stop.wait()
    finally:
        listener.close()
        await runner.cleanup()
