"""`deadline_ms` through a real worker: work still queued past its deadline is answered
`deadline_exceeded` and never computed."""

import msgpack
import pytest

from poolwire.client import PoolingClient, PoolingServiceError
from bench.workload import mixed_texts

pytestmark = pytest.mark.timeout(120)


async def test_work_queued_past_its_deadline_is_dropped_not_computed(minilm, start_worker, nc, prefix):
    busy = mixed_texts(48, seed=3, short_share=0.0)  # passages: a forward pass of a few hundred ms
    async with start_worker(minilm, max_batch_size=48, max_added_padding=10_000) as worker:
        client = PoolingClient(nc, prefix=prefix)
        # The long job goes out (and reaches the server) before the one with a deadline.
        inbox = nc.new_inbox()
        long_reply = await nc.subscribe(inbox, max_msgs=1)
        await nc.publish(f"{prefix}.embed", msgpack.packb({"input": busy}), reply=inbox)
        await nc.flush()
        with pytest.raises(PoolingServiceError) as info:
            await client.embed("too late", deadline_ms=1)
        long_job = msgpack.unpackb((await long_reply.next_msg(timeout=60)).data)
        assert len(long_job["data"]) == 48
        sequences = worker.stats.sequences
        assert len((await client.embed("on time", deadline_ms=60_000))["data"]) == 1
    assert info.value.code == "deadline_exceeded" and "deadline_ms 1" in info.value.error["message"]
    # The dropped text was never computed: only the 48 passages ran before "on time".
    assert sequences == 48
