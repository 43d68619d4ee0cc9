"""A read service folding a log written by the test, on a real nats-server: what the tests of its
answers to hostile and greedy askers set up alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from corral.events.jetstream import JetStreamLog
from corral.services.query.service import ReadService
from corral.services.runtime import output

WAIT = 60.0


@contextlib.asynccontextmanager
async def serving(
    nats_server: str, with_output: bool = False
) -> AsyncIterator[tuple[JetStreamLog, ReadService]]:
    """The log (its stream made) and a read service caught up with it, running until the block
    ends; ``with_output``: the workers' output stream made too."""
    log = await JetStreamLog.connect(nats_server, create=True)
    if with_output:
        await output.ensure_stream(log.nc)
    reader = ReadService(log)
    stop = asyncio.Event()
    running = asyncio.create_task(reader.run(stop))
    try:
        await asyncio.wait_for(reader.caught_up.wait(), WAIT)
        yield log, reader
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, WAIT)
        reader.close()
        await log.close()
