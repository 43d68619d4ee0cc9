"""Node agents run from their node's view, on a real nats-server.

- The assignments service writes each node's view into the ``corral_assignments`` bucket; an
  agent that reads nothing but its own key starts a job's worker (a real process), and a cancel
  reaches the worker through the view; a job on another node is in that node's key only.
- With logins, a node's agent may read its own key and no other, and may not read the log.

Nothing sleeps: every wait is on the log (``Watcher.until``) or on a key, with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats import errors as nats_errors

from corral.events.jobs import CancelJob
from corral.events.nodes import WorkerExited
from corral.events.server import EmbeddedServer
from corral.projections.assignments import NodeView, decode, encode
from corral.services.runtime import identities
from corral.services.runtime import views as node_views
from tests.integration.test_cluster_failures import LONG, WAIT, events_of, job_spec, live, phase, train


async def refused_get(agent: Any, node: str) -> NodeView | None:
    """``node``'s view as ``agent`` reads it where the server refuses it: a refused request is
    never answered, so the read waits out its timeout, kept short here. (A read that is answered
    is given ``WAIT``: with a timeout of two seconds, a loaded machine's stall read as no view.)"""
    return await node_views.KvNodeViews(agent, timeout=2.0).get(node)


async def key_of(url: str, node: str, until: object, timeout: float = WAIT) -> NodeView:
    """The node's key once ``until(view)`` holds, read as the services read it."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(node_views.BUCKET)
        watcher = await kv.watch(node)

        async def first() -> NodeView:
            async for entry in watcher:
                if entry is not None and entry.value:
                    view = decode(entry.value)
                    if until(view):  # type: ignore[operator]
                        return view
            raise AssertionError("the watch ended")

        try:
            return await asyncio.wait_for(first(), timeout)
        finally:
            await watcher.stop()
    finally:
        await nc.close()


async def test_an_agent_that_reads_only_its_node_view_starts_and_stops_workers(tmp_path: Path) -> None:
    async with live(tmp_path, nodes=2) as it:
        agent = it.cluster.agents["node-00"]
        assert not hasattr(agent, "state")  # it folds no log
        await it.submit("long", job_spec(LONG))
        s = await it.until(lambda s: phase(s, "long") == "running")
        [slot] = s.jobs["long"].placement.workers  # type: ignore[union-attr]
        here, other = slot.node, next(n for n in it.cluster.nodes if n != slot.node)
        view = await key_of(it.cluster.url, here, lambda v: any(a.job_id == "long" for a in v.jobs))
        assert view.inventory is not None
        assert not (await key_of(it.cluster.url, other, lambda v: True)).jobs  # another node's key

        await it.request("team-a", "cancel", CancelJob(job_id="long"), "cancel:long")
        s = await it.until(lambda s: phase(s, "long") == "cancelled" and not s.jobs["long"].live)
        [(_, exited)] = events_of(it.watch.records, WorkerExited, "long")
        assert exited.stopped and exited.node == here  # the stop reached the worker
        await key_of(it.cluster.url, here, lambda v: not v.jobs)  # and the job left the view

        await it.submit("short", job_spec(train(50)))
        await it.until(lambda s: phase(s, "short") == "succeeded")


@contextlib.asynccontextmanager
async def logged_in(tmp_path: Path) -> AsyncIterator[tuple[node_views.KvViewStore, Any]]:
    """A server with logins and the bucket: the services' store, and node-00's agent's connection."""
    passwords = identities.ensure(tmp_path / identities.CREDENTIALS, [], ["node-00", "node-01"])
    server = EmbeddedServer(tmp_path / "nats", users=identities.users(passwords))
    await server.start()
    try:
        admin = await nats.connect(
            server.url,
            inbox_prefix=identities.inbox_prefix(identities.ADMIN),
            **identities.login(passwords, identities.ADMIN),
        )
        await node_views.ensure_bucket(admin)
        await admin.close()
        services = await nats.connect(server.url, **identities.login(passwords, identities.SERVICES))
        agent = await nats.connect(
            server.url,
            inbox_prefix=identities.agent_inbox("node-00"),
            **identities.login(passwords, identities.agent("node-00")),
        )
        try:
            yield await node_views.KvViewStore.open(services), agent
        finally:
            await agent.close()
            await services.close()
    finally:
        await server.stop()


async def test_an_agent_may_read_its_own_view_and_nothing_else(tmp_path: Path) -> None:
    async with logged_in(tmp_path) as (store, agent):
        for n in ("node-00", "node-01"):
            await store.put(n, encode(NodeView(n, seq=7)))
        mine = node_views.KvNodeViews(agent, timeout=WAIT)
        own = await mine.get("node-00")
        assert own is not None and own.node == "node-00"
        assert await refused_get(agent, "node-01") is None  # another node's key
        views = aiter(mine.watch("node-00"))
        assert (await asyncio.wait_for(anext(views), WAIT)).seq == 7
        await store.put("node-00", encode(NodeView("node-00", seq=9)))
        assert (await asyncio.wait_for(anext(views), WAIT)).seq == 9  # heard, not polled
        await views.aclose()  # type: ignore[attr-defined]
        with pytest.raises((nats_errors.Error, TimeoutError)):
            await agent.jetstream().subscribe("corral.ev.>", ordered_consumer=True)


def _large_view(node: str, seq: int, jobs: int) -> NodeView:
    """A view of ``jobs`` jobs with environments of 64 KiB each (admission's largest), random
    so that nothing compresses it: more than one NATS message carries."""
    import os

    from corral.projections.assignments import Assignment

    def env() -> dict[str, str]:
        return {f"V{i}": os.urandom(30).hex() for i in range(1000)}

    found = tuple(Assignment(job_id=f"j{i}", attempt=0, phase="placed", env=env()) for i in range(jobs))
    return NodeView(node, seq=seq, jobs=found)


async def test_a_view_larger_than_a_message_reaches_its_agent_in_parts(tmp_path: Path) -> None:
    # A tenant's few jobs of large environments on one node made its view more than NATS
    # carries: the view was never written again, and the node acted on nothing it was told.
    async with logged_in(tmp_path) as (store, agent):
        big = _large_view("node-00", 7, jobs=20)
        assert len(encode(big)) > agent.max_payload
        await store.put("node-00", encode(big))
        await store.put("node-01", encode(_large_view("node-01", 3, jobs=20)))
        mine = node_views.KvNodeViews(agent, timeout=WAIT)
        assert await mine.get("node-00") == big
        assert await refused_get(agent, "node-01") is None  # another node's view and its parts
        views = aiter(mine.watch("node-00"))
        assert (await asyncio.wait_for(anext(views), WAIT)) == big
        bigger = _large_view("node-00", 9, jobs=30)
        await store.put("node-00", encode(bigger))
        assert (await asyncio.wait_for(anext(views), WAIT)) == bigger  # heard, then read in parts
        await store.put("node-00", encode(NodeView("node-00", seq=11)))  # small again: whole
        assert (await asyncio.wait_for(anext(views), WAIT)).seq == 11
        await views.aclose()  # type: ignore[attr-defined]


async def test_parts_no_view_names_any_more_are_purged(tmp_path: Path) -> None:
    # A node whose view was once large kept its pieces (up to a megabyte each) in the bucket for
    # good, whatever its view became; a restarted store did not know of them either.
    from nats.js.errors import KeyDeletedError, KeyNotFoundError

    async def stored(kv: Any, key: str) -> bool:
        try:
            await kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return False
        return True

    async with logged_in(tmp_path) as (store, agent):
        kv = store.kv
        bigger, big = encode(_large_view("node-00", 3, jobs=30)), encode(_large_view("node-00", 5, jobs=20))
        await store.put("node-00", bigger)
        many = node_views.parts_of((await kv.get("node-00")).value)
        await store.put("node-00", big)
        fewer = node_views.parts_of((await kv.get("node-00")).value)
        assert many is not None and fewer is not None and many[0] > fewer[0]
        kept = [await stored(kv, node_views.part_key("node-00", i)) for i in range(many[0])]
        assert kept == [True] * fewer[0] + [False] * (many[0] - fewer[0])
        mine = node_views.KvNodeViews(agent, timeout=WAIT)
        assert await mine.get("node-00") == decode(big)
        restarted = node_views.KvViewStore(kv)  # knows nothing of what was written before
        await restarted.put("node-00", encode(NodeView("node-00", seq=7)))
        assert not [i for i in range(many[0]) if await stored(kv, node_views.part_key("node-00", i))]
        assert (await mine.get("node-00")).seq == 7  # type: ignore[union-attr]


async def test_a_deleted_nodes_key_and_parts_are_purged_and_a_restarted_writer_purges_the_rest(
    tmp_path: Path,
) -> None:
    # A node deleted from the cluster kept its key in the bucket for good, and so did every
    # node deleted while no assignments service wrote: over months, every node a cluster had.
    from corral.events.log import InMemoryLog
    from corral.events.queues import DeleteNode
    from corral.services.assignments import service as assignments_service
    from tests.builders import Cluster, LogBuilder

    async def keys(kv: Any) -> set[str]:
        return set(await kv.keys())

    async with logged_in(tmp_path) as (store, agent):
        kv = store.kv
        # Written before: node-05 (in parts) and node-06 are nodes the cluster no longer has.
        await store.put("node-05", encode(_large_view("node-05", 3, jobs=20)))
        await store.put("node-06", encode(NodeView("node-06", seq=2)))
        assert {"node-05", "node-05.part-0", "node-06"} <= await keys(kv)
        log = LogBuilder().nodes(Cluster(2))
        heard: asyncio.Queue[NodeView] = asyncio.Queue()
        mine = node_views.KvNodeViews(agent, timeout=WAIT)

        async def follow() -> None:
            async for view in mine.watch("node-00"):
                heard.put_nowait(view)

        following = asyncio.create_task(follow())
        try:
            writer = assignments_service.service(InMemoryLog(), node_views.KvViewStore(kv), clock=lambda: 1.0)
            await writer.restore()
            writer.fold(log.records)
            await writer.cycle()  # takes over: writes the nodes it has, purges the others
            assert await keys(kv) == {"node-00", "node-01"} and writer.purges == 2
            assert (await asyncio.wait_for(heard.get(), WAIT)).inventory is not None

            seen = len(log.records)
            log.admin("delete-node", DeleteNode(node="node-00"))
            writer.fold(log.records[seen:])
            assert writer.state.rejected_total == 0, writer.state.rejections
            await writer.cycle()
            assert await keys(kv) == {"node-01"} and writer.purges == 3
            left = await mine.get("node-00")  # its agent reads that nothing runs there
            assert left is not None and left.jobs == () and left.inventory is None

            restarted = assignments_service.service(
                InMemoryLog(), node_views.KvViewStore(kv), clock=lambda: 1.0
            )
            await restarted.restore()
            restarted.fold(log.records)
            await restarted.cycle()
            assert await keys(kv) == {"node-01"} and restarted.purges == 0
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following


async def test_an_agent_whose_node_was_deleted_while_it_was_cut_off_hears_that_nothing_runs_there(
    tmp_path: Path,
) -> None:
    # A node lost (its agent cut off, a VM paused), its jobs placed anew elsewhere, then deleted:
    # its key purged, the agent that came back read no view and kept the one it had, and so ran
    # its workers beside the ranks placed anew, for as long as it lived.
    from corral.projections.assignments import Assignment

    async with logged_in(tmp_path) as (store, agent):
        job = Assignment(job_id="j", attempt=0, phase="running")
        await store.put("node-00", encode(NodeView("node-00", seq=5, jobs=(job,))))
        mine = node_views.KvNodeViews(agent, timeout=WAIT)
        views = aiter(mine.watch("node-00"))
        assert (await asyncio.wait_for(anext(views), WAIT)).jobs == (job,)
        await store.remove("node-00")
        left = await asyncio.wait_for(anext(views), WAIT)
        assert left.jobs == () and left.inventory is None
        assert await mine.get("node-00") == left
        # It comes back into the cluster: its next view is heard as any newer one.
        await store.put("node-00", encode(NodeView("node-00", seq=9)))
        assert (await asyncio.wait_for(anext(views), WAIT)).seq == 9
        await views.aclose()  # type: ignore[attr-defined]


async def test_parts_no_note_names_are_purged_with_their_deleted_nodes_key(tmp_path: Path) -> None:
    # Parts whose note was gone (a writer stopped between them and its note, a note purged when
    # it could not be read) were listed as their node's at every take-over and never purged:
    # each a piece of up to 512 KiB, for good.
    async with logged_in(tmp_path) as (store, _):
        kv = store.kv
        await store.put("node-05", encode(_large_view("node-05", 3, jobs=20)))
        await kv.purge("node-05")  # the note gone, its parts left
        restarted = node_views.KvViewStore(kv)
        assert await restarted.nodes() == {"node-05"}
        await restarted.remove("node-05")
        with contextlib.suppress(nats_errors.Error):
            assert not await kv.keys()


async def test_a_late_write_of_a_writer_that_lost_the_lease_leaves_the_new_holders_view(
    tmp_path: Path,
) -> None:
    # An assignments replica cut off (a network stall, a VM paused) with a view's write in
    # flight loses its lease; the replica that takes it over writes every key; then the late
    # write arrives, as it was sent. Stored over the newer view, it told an agent starting then
    # that a job which had moved away still ran on its node, so the agent started it beside its
    # new ranks, and nothing corrected the key until the node's view changed again.
    from corral.projections.assignments import Assignment

    async with logged_in(tmp_path) as (old, agent):
        moved = Assignment(job_id="j", attempt=0, phase="running")
        await old.put("node-00", encode(NodeView("node-00", seq=5, jobs=(moved,))))
        new = node_views.KvViewStore(old.kv)  # the replica that took the lease over
        await new.put("node-00", encode(NodeView("node-00", seq=9)))
        # The late write carries what its writer knew when it sent it: the key as it had left it.
        with pytest.raises(node_views.Superseded):
            await old.put("node-00", encode(NodeView("node-00", seq=6, jobs=(moved,))))
        view = await node_views.KvNodeViews(agent, timeout=WAIT).get("node-00")
        assert view is not None and (view.seq, view.jobs) == (9, ())
        # The new holder goes on writing the key.
        await new.put("node-00", encode(NodeView("node-00", seq=12)))
        views = node_views.KvNodeViews(agent, timeout=WAIT)
        assert (await views.get("node-00")).seq == 12  # type: ignore[union-attr]
        # A write of its refused (another's landed between its read of the key and its write) is
        # made again at its next cycle, on the key's revision read anew.
        await node_views.KvViewStore(old.kv).put("node-00", encode(NodeView("node-00", seq=11)))
        with pytest.raises(node_views.Superseded):
            await new.put("node-00", encode(NodeView("node-00", seq=14)))
        await new.put("node-00", encode(NodeView("node-00", seq=14)))
        assert (await views.get("node-00")).seq == 14  # type: ignore[union-attr]
