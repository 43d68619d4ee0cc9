"""What a leased role's next holder makes of the traced position it finds (``runtime/traced.py``):
only a whole number within the log is a position. A value past the log would have every holder
after it emit none of the lease's spans, for good; one that is not a number (a node agent can
have JetStream write its acknowledgement over the key, naming it as a reply subject) is none.
A real nats-server and the leases' bucket; the acknowledgement is the server's own."""

from __future__ import annotations

import nats
import pytest

from corral.services.runtime import lease, output
from corral.services.runtime.traced import TracedPosition, key
from tests.integration.polling import until_answered

pytestmark = pytest.mark.integration

LAST = 100  # the log's last sequence, as the holder reads it


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (b"42", 42),
        (b"0", 0),
        (b"100", 100),
        (b"101", None),  # past the log
        (str(2**70).encode(), None),
        (b"9" * 5000, None),
        (b"-5", None),
        (b"+5", None),
        (b" 7 ", None),
        (b"1_0", None),
        (b"\xd9\xa1", None),  # an Arabic-Indic one
        (b"garbage", None),
        (b"", None),
    ],
)
async def test_only_a_position_in_the_log_is_read(nats_server: str, value: bytes, read: int | None) -> None:
    nc = await nats.connect(nats_server)
    try:
        await lease.ensure_bucket(nc)
        kv = await lease.bucket(nc)
        await kv.put(key("admission"), value)
        assert await TracedPosition(kv, "admission").read(LAST) == read
    finally:
        await nc.close()


async def test_an_acknowledgement_written_over_the_key_is_no_position(nats_server: str) -> None:
    nc = await nats.connect(nats_server)
    try:
        await lease.ensure_bucket(nc)
        await output.ensure_stream(nc)
        kv = await lease.bucket(nc)
        position = TracedPosition(kv, "admission")
        assert await position.post(LAST)
        # What an agent may publish, with the key's subject as its reply: the server acknowledges there.
        await nc.publish(
            output.subject("n0", "j", 1, 0, 0), b"x\n", reply=f"$KV.{lease.BUCKET}.{key('admission')}"
        )

        async def overwritten() -> bool:
            return bool((await kv.get(key("admission"))).value != str(LAST).encode())

        await until_answered(overwritten, 30.0, every=0.05)
        assert b"seq" in (await kv.get(key("admission"))).value
        assert await position.read(LAST) is None
    finally:
        await nc.close()
