"""``corral dashboard`` in a real browser: headless Chromium (Debian's chromium and chromium-driver,
driven over WebDriver by selenium) against a live corral (real nats-server, every service, two
simulated 8-GPU nodes whose agents run real processes) and two ``corral dashboard`` processes,
one as the admin and one as tenant team-a.

What a person would see is checked in the page itself:

- the GPU grid shows a placed job's cells in its queue's colour (the queue table's swatch);
- the queue table's nominal and used GPUs;
- the page moves when a new job is placed, without reloading;
- a job preempted by an urgent one waits with the read service's reason, and its timeline shows
  its first attempt's placement, checkpoint and preemption, then its second attempt;
- tenant team-a's page names none of team-b's jobs or queues, and no timeline of them.

Waits are on the log (``Live.until``) or on the page (WebDriver's wait on a condition), each
with a timeout; screenshots go under the test's temporary directory, printed at the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from corral.events.queues import ApplyQueue, CordonNode, PriorityClassSpec, QueueSpec, Quota
from corral.services.query.queues import queue_rows
from tests.integration.test_cluster_failures import LONG, checkpointed, job_spec, live, phase
from tests.integration.test_dashboard_hostile import dashboard

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="headless Chromium is not installed (Debian: apt-get install chromium chromium-driver; "
        ".ci/run installs them)",
    ),
    pytest.mark.timeout(60),
]

WAIT = 30.0  # generous: two cores shared with other work start Chromium and Python slowly
CLASSES = (PriorityClassSpec("batch", 10), PriorityClassSpec("urgent", 1000, preemptible=False))
SLEEP = ("sleep", "600")  # runs until the corral stops
T = TypeVar("T")


class Browser:
    """One headless Chromium. Its calls block, so the test runs each in a thread (``call``),
    leaving the event loop to the corral running in the same process."""

    def __init__(self, profile: Path, shots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
            options.add_argument(arg)
        options.add_argument("--window-size=1400,1300")
        options.add_argument(f"--user-data-dir={profile}")
        self.driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
        self.shots = shots

    def quit(self) -> None:
        self.driver.quit()

    def open(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, what: str, condition: Callable[[], T]) -> T:
        """Wait until ``condition()`` is truthy (and return it), or fail saying ``what``."""
        from selenium.webdriver.support.wait import WebDriverWait

        return WebDriverWait(self.driver, WAIT, poll_frequency=0.1).until(
            lambda _: condition(), message=f"the page never showed {what}"
        )

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    # What a person sees, read from the page.

    def cells(self, job: str) -> list[tuple[str, str]]:
        """(GPU, background colour) of each grid cell segment of ``job``."""
        return [
            tuple(c)
            for c in self.js(
                "return [...document.querySelectorAll('#grid .seg')]"
                ".filter(s => s.dataset.job === arguments[0])"
                ".map(s => [s.closest('.gpu').dataset.gpu, getComputedStyle(s).backgroundColor]);",
                job,
            )
        ]

    def swatch(self, queue: str) -> str:
        return str(
            self.js(
                "const r = [...document.querySelectorAll('#queues tbody tr')]"
                ".find(r => r.dataset.queue === arguments[0]);"
                "return r ? getComputedStyle(r.querySelector('.swatch')).backgroundColor : '';",
                queue,
            )
        )

    def queue_row(self, queue: str) -> dict[str, str]:
        row = self.js(
            "const r = [...document.querySelectorAll('#queues tbody tr')]"
            ".find(r => r.dataset.queue === arguments[0]);"
            "return r ? Object.fromEntries([...r.cells]"
            ".map(c => [c.className.split(' ').pop(), c.innerText])) : {};",
            queue,
        )
        return dict(row)

    def rows(self, table: str) -> dict[str, dict[str, str]]:
        """Each job row of ``#waiting`` or ``#running`` by job id: its cells by class."""
        rows = self.js(
            "return [...document.querySelectorAll(arguments[0] + ' tbody tr')].map(r => [r.dataset.job,"
            " Object.fromEntries([...r.cells].map(c => [c.className.split(' ').pop(), c.innerText]))]);",
            table,
        )
        return {job: dict(cells) for job, cells in rows}

    def timeline(self) -> dict[int, list[str]]:
        """The kinds of the events of each attempt shown, by attempt."""
        got = self.js(
            "return [...document.querySelectorAll('#timeline .attempt')].map(a => [Number(a.dataset.attempt),"
            " [...a.querySelectorAll('.ev:not(.refused)')].map(e => e.dataset.kind)]);"
        )
        return {int(a): list(kinds) for a, kinds in got}


async def call(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


async def test_the_dashboard_shows_the_cluster_live_and_each_tenant_its_own(tmp_path: Path) -> None:
    shots = tmp_path / "shots"
    shots.mkdir()
    print(f"\nscreenshots: {shots}")
    async with contextlib.AsyncExitStack() as stack:
        it = await stack.enter_async_context(live(tmp_path, nodes=2, classes=CLASSES))
        team_b = QueueSpec("team-b", quotas={"*": Quota(nominal=8)}, tenants=("team-b",))
        await it.request("admin", "queue", ApplyQueue(queue=team_b), "queue:team-b")
        pages = [stack.enter_async_context(dashboard(it.cluster.url, who)) for who in ("admin", "team-a")]
        opening, starting = (
            asyncio.gather(*pages),
            asyncio.ensure_future(call(Browser, tmp_path / "chromium", shots)),
        )
        # Work for the page to show: team-b's 4 GPUs, and team-a's checkpointing 8-GPU job.
        b1 = msgspec.structs.replace(job_spec(SLEEP, gpus=4), queue="team-b")
        low = job_spec(LONG, gpus=8, priority_class="batch", checkpointable=True, grace_seconds=20.0)
        await it.submit("b1", b1)
        await it.submit("low", low)
        try:
            admin_url, tenant_url = await opening
        finally:
            browser = await starting  # quit whatever else failed
            stack.callback(browser.quit)
        await it.until(lambda s: checkpointed("low", 100)(s) and phase(s, "b1") == "running")

        # The admin's page: every job's cells in its queue's colour, and the quota.
        await call(browser.open, admin_url)
        await call(
            browser.wait,
            "low's 8 GPUs and b1's 4",
            lambda: len(browser.cells("low")) == 8 == 2 * len(browser.cells("b1")),
        )
        for job, queue in (("low", "team-a"), ("b1", "team-b")):
            colour = browser.swatch(queue)
            assert colour and {c for _, c in browser.cells(job)} == {colour}, (job, queue)
        assert browser.swatch("team-a") != browser.swatch("team-b")
        assert len({gpu.split("/")[0] for gpu, _ in browser.cells("low")}) == 1  # one whole node
        row = browser.queue_row("team-a")
        assert (row["nominal"], row["used"], row["borrowed"], row["lent"]) == ("16", "8", "0", "0")
        assert (browser.queue_row("team-b")["nominal"], browser.queue_row("team-b")["used"]) == ("8", "4")
        await call(browser.shot, "1-admin")

        # A new job appears as it is placed, on the same page, never reloaded.
        browser.js("window.stillTheSamePage = true;")
        await it.submit("a2", job_spec(SLEEP, gpus=1))
        await call(browser.wait, "a2 placed", lambda: len(browser.cells("a2")) == 1)
        await call(
            browser.wait, "team-a using 9 GPUs", lambda: browser.queue_row("team-a").get("used") == "9"
        )
        assert browser.js("return window.stillTheSamePage === true;")

        # An urgent job preempts low: low checkpoints, stops and waits for GPUs, and says why.
        await it.submit("urgent", job_spec(SLEEP, gpus=8, priority_class="urgent"))
        await it.until(lambda s: phase(s, "urgent") == "running" and s.jobs["low"].attempt == 1)

        def waits_as_read_service_says() -> bool:
            low_now = it.state.jobs["low"]
            shown = browser.rows("#waiting").get("low", {})
            why = "; ".join(r.message for r in low_now.reasons)
            return bool(why) and shown.get("reason") == why and shown.get("attempt") == "1"

        await call(browser.wait, "low waiting with its reason", waits_as_read_service_says)
        await call(browser.wait, "urgent on 8 GPUs", lambda: len(browser.cells("urgent")) == 8)
        assert browser.cells("low") == []
        browser.js("document.querySelector('#waiting tbody tr[data-job=\"low\"]').click();")

        def two_attempts() -> dict[int, list[str]] | None:
            shown = browser.timeline()
            return shown if 1 in shown else None

        attempts = await call(browser.wait, "low's timeline with its second attempt", two_attempts)
        first = attempts[0]
        assert (
            first.index("placed")
            < first.index("checkpoint")
            < first.index("preempted")
            < first.index("requeued")
        )
        assert browser.js("return document.querySelector('#job-counts').innerText;").startswith(
            "2 attempt(s), 1 placement(s), 1 preemption(s)"
        )
        await call(browser.shot, "2-admin-preempted")

        # A node cordoned takes no work: its idle GPUs are drawn not available, never free, as
        # ``corral nodes`` counts none of them free.
        [cordoned] = {gpu.split("/")[0] for gpu, _ in browser.cells("b1")}
        await it.request("admin", "cordon", CordonNode(node=cordoned, cordoned=True), f"cordon:{cordoned}")
        await it.until(lambda s: s.nodes[cordoned].cordoned)
        idle = sum(1 for g in it.state.nodes[cordoned].gpus if g.idle)

        def drawn_not_available() -> bool:
            shown = browser.js(
                "const n = document.querySelector(`#grid .node[data-node='${arguments[0]}']`);"
                "return n && [n.querySelectorAll('.seg.free').length,"
                " [...n.querySelectorAll('.seg.unavailable')].map(s => s.dataset.why)];",
                cordoned,
            )
            return bool(shown) and shown == [0, ["node cordoned"] * idle]

        assert idle > 0
        await call(browser.wait, f"{cordoned}'s {idle} idle GPUs not available", drawn_not_available)
        await call(browser.shot, "2-admin-cordoned")

        # Tenant team-a's page: its own jobs; team-b's GPUs only as taken, its queue and jobs unnamed.
        await call(browser.open, tenant_url)
        await call(browser.wait, "team-a's page", lambda: len(browser.cells("urgent")) == 8)
        taken = browser.js("return document.querySelectorAll('#grid .seg[data-job=\"\"]').length;")
        assert taken == 4  # b1's GPUs, as others' jobs
        assert browser.cells("b1") == [] and "b1" not in browser.rows("#running")
        assert browser.js("return document.querySelector('#asker').innerText;") == "team-a"
        assert browser.swatch("team-b") == ""

        def quota_as_read_service_says() -> bool:
            [want] = [r for r in queue_rows(it.state) if r["queue"] == "team-a"]
            shown = browser.queue_row("team-a")
            return all(shown.get(k) == str(want[k]) for k in ("nominal", "used", "borrowed", "lent"))

        await call(browser.wait, "team-a's quota as the read service counts it", quota_as_read_service_says)
        page_text = browser.js("return document.body.innerText;")
        assert "b1" not in page_text and "team-b" not in page_text
        await call(browser.shot, "3-tenant")
        await call(browser.open, tenant_url + "#job=b1")
        await call(
            browser.wait,
            "no timeline of another tenant's job",
            lambda: browser.js("return document.querySelector('#job-line').innerText;") == "no job b1",
        )
