"""The dashboard's routes against a page visitor sending garbage, over a live corral.

Every route the page uses is a way in: a job id from the address bar goes to the read service,
a file name to the package's static files. Whatever is asked, the answer is a clear 4xx with a
reason (never a traceback, a file outside ``static/``, another tenant's job or a 5xx), and the
dashboard's feed and the read service behind it carry on answering afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from corral.services.dashboard.app import Feed, is_loopback, make_app
from tests.integration.test_cluster_failures import Live, job_spec, live, phase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAIT = 30.0
ROOT = Path(__file__).resolve().parents[2]

# Ids a visitor can put in the address bar: subject wildcards and separators, control bytes,
# a path climbing out, quotes, one long enough to be a denial of service, and unicode.
HOSTILE_IDS = (
    "a*b",
    "a>b",
    ">",
    "a.b",
    "%00",
    "..%2F..%2Fetc%2Fpasswd",
    "job%0Aforged-line",
    "%22%3E%3Cscript%3E",
    "x" * 4000,
    "j%C3%B8b",
    "%FF%FE",
)


@contextlib.asynccontextmanager
async def page(url: str, asker: str) -> AsyncIterator[TestClient]:
    """The dashboard app as ``asker``, served on a free loopback port, with its board made once."""
    feed = Feed(url, asker, None, min_interval=0.05)
    client = TestClient(TestServer(make_app(feed), host="127.0.0.1"))
    await client.start_server()
    try:
        await feed.wait_newer(0, WAIT)
        assert feed.current()["board"] is not None, feed.current()["problem"]
        yield client
    finally:
        await client.close()


async def still_answers(client: TestClient, job_id: str, status: int) -> None:
    board = await (await client.get("/api/board")).json()
    assert board["board"] is not None and board["problem"] == ""
    assert (await client.get(f"/api/jobs/{job_id}")).status == status


async def test_job_route_refuses_garbage_ids_and_keeps_answering(tmp_path: Path) -> None:
    async with live(tmp_path) as it:
        await submitted(it)
        async with page(it.cluster.url, "admin") as client:
            for bad in HOSTILE_IDS:
                r = await client.get(f"/api/jobs/{bad}")
                assert r.status in (400, 404), (bad, r.status, await r.text())
                if r.status == 404 and r.content_type == "application/json":
                    body = await r.json()
                    assert body["error"].startswith(("no job", "no such job")), (bad, body)
                    assert "Traceback" not in body["error"]
            # Past aiohttp's line limit the request is refused before any handler runs.
            r = await client.get("/api/jobs/" + "y" * 20_000)
            assert 400 <= r.status < 500, r.status
            await still_answers(client, "j1", 200)


async def test_static_route_serves_only_its_files(tmp_path: Path) -> None:
    async with live(tmp_path) as it:
        await submitted(it)  # the cluster's own check wants a worker to have run
        async with page(it.cluster.url, "admin") as client:
            outside = ("app.py", "..%2Fapp.py", "..%2F..%2Fboard.py", "%2Fetc%2Fpasswd", "index.html%00.py")
            for name in outside:
                r = await client.get(f"/static/{name}")
                assert r.status == 404, (name, r.status)
                assert "import" not in await r.text()
            assert (await client.post("/api/board")).status == 405
            assert (await client.get("/static/dashboard.js")).status == 200
            await still_answers(client, "nope", 404)


async def test_a_tenants_page_does_not_show_anothers_job(tmp_path: Path) -> None:
    async with live(tmp_path) as it:
        await submitted(it)
        async with page(it.cluster.url, "team-b") as client:
            r = await client.get("/api/jobs/j1")
            assert r.status == 404
            body = await r.json()
            assert body == {"error": body["error"]} and "team-a" not in body["error"]
            board = (await (await client.get("/api/board")).json())["board"]
            assert "j1" not in str(board)


async def submitted(it: Live) -> None:
    await it.submit("j1", job_spec(("sleep", "600")))
    await it.until(lambda s: phase(s, "j1") == "running")


async def test_on_loopback_it_answers_only_requests_that_name_loopback(tmp_path: Path) -> None:
    # A web page the operator visits could have its own name resolve to 127.0.0.1 (DNS
    # rebinding) and read the admin's board; the Host it sends names that page, not loopback.
    async with live(tmp_path) as it:
        await submitted(it)
        async with page(it.cluster.url, "admin") as client:
            for host in ("attacker.example", "attacker.example:8080", "10.0.0.7", "127.0.0.1.nip.io"):
                r = await client.get("/api/board", headers={"Host": host})
                assert r.status == 421, (host, r.status)
                assert "j1" not in await r.text()
            for host in ("localhost", f"localhost:{client.port}", "127.0.0.1", "[::1]:80"):
                r = await client.get("/api/board", headers={"Host": host})
                assert r.status == 200, (host, r.status)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST:8080", True),
        ("127.0.0.1", True),
        ("127.8.9.10:80", True),
        ("[::1]:8080", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("example.com", False),
        ("localhost.example.com", False),
        ("", False),
        ("[::1]x.evil", False),
        ("[::1", False),
        ("localhost:evil", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_connections_that_send_nothing_are_closed_and_bounded(
    monkeypatch: pytest.MonkeyPatch, unused_tcp_port: int
) -> None:
    # Connections that sent nothing were held for good: some twenty thousand of them took every
    # file descriptor the dashboard had, and it accepted no one. Past the bound a connection is
    # closed as it is made, and one that sits without a request is closed after a while.
    import asyncio

    from corral.services.dashboard import app

    monkeypatch.setattr(app, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(app, "IDLE_S", 0.5)
    feed = Feed(f"nats://127.0.0.1:{unused_tcp_port}", "admin", None)  # no corral: the page still is
    stop = asyncio.Event()
    listening: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    served = asyncio.create_task(app.serve(feed, "127.0.0.1", 0, stop, listening))
    try:
        async with asyncio.timeout(WAIT):
            host, port = await listening
            silent = [await asyncio.open_connection(host, port) for _ in range(4)]
            reader, _ = await asyncio.open_connection(host, port)
            assert await reader.read() == b""  # the fifth: closed as it was made
            for reader, _ in silent:  # the four: closed once idle
                assert await reader.read() == b""
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    finally:
        stop.set()
        await served


@contextlib.asynccontextmanager
async def dashboard(url: str, tenant: str) -> AsyncIterator[str]:
    """``corral dashboard`` as ``tenant`` on a free port; yields the page's address, with its key."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CORRAL_PASSWORD", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral", "dashboard", "--server", url, "--tenant", tenant, "--port", "0",
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
        assert line.startswith("dashboard at http://"), line
        yield line.split()[2]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_only_requests_carrying_the_printed_key_are_answered(unused_tcp_port: int) -> None:
    # A job's workers share their node's network: a job on the node a dashboard ran on opened
    # localhost and read its page, the admin's by default, every tenant's jobs and timelines.
    # `corral dashboard` prints its address with a key; a request without it learns nothing.
    async with dashboard(f"nats://127.0.0.1:{unused_tcp_port}", "admin") as page:
        address = urlsplit(page)
        key = parse_qs(address.query).get("key", [""])[0]
        assert len(key) >= 16, page
        base = f"http://{address.netloc}"
        async with aiohttp.ClientSession() as http:
            keyless = ("/", "/api/board", "/api/jobs/j-1", "/events", "/api/board?key=", "/api/board?key=x")
            for path in keyless:
                async with http.get(base + path) as r:
                    assert r.status == 403, path
            async with http.get(f"{base}/static/dashboard.js") as r:
                assert r.status == 200  # the page's code, no one's data
            for path in ("/", "/api/board"):
                async with http.get(f"{base}{path}?key={key}") as r:
                    assert r.status == 200, path
