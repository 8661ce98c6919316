"""The per-test cleanup of conftest's `prefix` fixture: a test's streams go, another's stay."""

import nats

from poolwire.actors.durable import ensure_dead_stream
from tests.helpers import drop_streams_under


async def test_only_the_streams_under_the_prefix_are_dropped(nats_server):
    conn = await nats.connect(nats_server.url)
    try:
        js = conn.jetstream()
        mine = await ensure_dead_stream(js, "cleanup-a.pooling", replicas=1)
        theirs = await ensure_dead_stream(js, "cleanup-ab.pooling", replicas=1)
        # "cleanup-a" is a string prefix of "cleanup-ab": only whole subject tokens count.
        assert drop_streams_under(nats_server.url, "cleanup-a.pooling") == [mine]
        names = [info.config.name for info in await js.streams_info()]
        assert mine not in names and theirs in names
        assert drop_streams_under(nats_server.url, "cleanup-ab.pooling") == [theirs]
    finally:
        await conn.close()
