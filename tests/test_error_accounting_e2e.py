"""Errors answered outside request/reply: durable jobs and pipeline documents count in $SRV.STATS
(`num_errors`, `last_error`) and in the errors-by-code metric exactly as request/reply errors
do, once per error frame published or stored; a pipeline's error result fits max_payload with
its headers like every other error frame."""


import msgpack
import nats.errors
import pytest
from nats.js.api import StreamConfig

from poolwire.actors.durable import stream_name
from poolwire.actors.framing import header_bytes
from poolwire.actors.nats_server import NatsServer
from poolwire.client import PoolingClient, PoolingServiceError
from tests.helpers import poll_until

pytestmark = [pytest.mark.timeout(120)]

DURABLE = dict(durable=True, durable_ack_wait_s=1.0)




def settled(js, stream: str, consumer: str):
    async def check() -> bool:
        info = await js.consumer_info(stream, consumer)
        return info.num_ack_pending == 0 and info.num_pending == 0
    return check


def errors_counted(worker) -> tuple[int, str, float]:
    """STATS' num_errors and last_error, and the metric's invalid_request count."""
    endpoint = worker.discovery.response("STATS")["endpoints"][0]
    metric = worker.metrics.registry.get_sample_value("poolwire_errors_total",
                                                      {"code": "invalid_request"}) or 0.0
    return endpoint["num_errors"], endpoint["last_error"], metric


def counted_since(worker, before: tuple[int, str, float]) -> tuple[int, float]:
    now = errors_counted(worker)
    return now[0] - before[0], now[2] - before[2]


def pipeline_streams(prefix: str) -> tuple[str, str, str]:
    root = prefix.replace(".", "_")
    return root, f"{root}_DOCS", f"{root}_OUT"


async def test_durable_and_pipeline_errors_are_counted_once(minilm, start_worker, nc, prefix):
    js = nc.jetstream()
    root, docs, out = pipeline_streams(prefix)
    await js.add_stream(StreamConfig(name=docs, subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=out, subjects=[f"{root}.out.>"]))
    async with start_worker(minilm, pipeline_stream=docs, pipeline_input=f"{root}.in",
                            pipeline_output=f"{root}.out", **DURABLE) as worker:
        before = errors_counted(worker)  # the readiness check's request was an error
        # Durable jobs: one that cannot be parsed (answered by the intake itself), one that the
        # validator refuses (answered through the engine's path), one malformed without a
        # Pooling-Reply-To (nobody to answer: not counted as sent).
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await js.publish(f"{prefix}.jobs.embed", b"\xc1 not msgpack",
                         headers={"Pooling-Reply-To": inbox, "Nats-Msg-Id": "bad-1"})
        assert msgpack.unpackb((await sub.next_msg(timeout=10)).data)["error"]["code"] == "invalid_request"
        with pytest.raises(PoolingServiceError):
            await PoolingClient(nc, prefix=prefix).submit("embed", {"input": "x", "dimensions": 0})
        await js.publish(f"{prefix}.jobs.embed", b"\xc1 nobody asks",
                         headers={"Nats-Msg-Id": "bad-2"})
        await poll_until(settled(js, stream_name("JOBS", prefix), "poolwire_poolwire"))
        assert counted_since(worker, before) == (2, 2.0)
        last = errors_counted(worker)[1]
        assert last.startswith("invalid_request: dimensions"), last

        # Pipeline documents without their text field. The second one's result is in the results
        # stream already (stored by an earlier delivery whose ack was lost): it is stored once and
        # counted once, by that earlier delivery, not again.
        await js.publish(f"{root}.out.b", b"stored earlier", headers={"Nats-Msg-Id": f"{docs}:2"})
        await js.publish(f"{root}.in.a", msgpack.packb({"body": "no text field"}))
        await js.publish(f"{root}.in.b", msgpack.packb({"body": "no text field either"}))
        await poll_until(settled(js, docs, f"poolwire_pipeline_{docs}_poolwire"))
        assert (await js.stream_info(out)).state.messages == 2
        assert counted_since(worker, before) == (3, 3.0)
        last = errors_counted(worker)[1]
        assert last.startswith(f"invalid_request: document {docs}:1 has no field 'text'"), last


async def test_a_pipeline_error_too_big_for_max_payload_is_shortened_and_stored(minilm, start_worker, prefix):
    """The document fits the server's 1 KiB max_payload; the error naming its fields (each a
    preview) would not with its headers, so it is shortened to fit them."""
    with NatsServer(max_payload=1024) as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            root, docs, out = pipeline_streams(prefix)
            await js.add_stream(StreamConfig(name=docs, subjects=[f"{root}.in.>"]))
            await js.add_stream(StreamConfig(name=out, subjects=[f"{root}.out.>"]))
            results = await nc.subscribe(f"{root}.out.>")
            document = msgpack.packb({f"field_{i}_" + "x" * 90: i for i in range(10)})
            assert 950 < len(document) < nc.max_payload
            async with start_worker(minilm, url=server.url, pipeline_stream=docs,
                                    pipeline_input=f"{root}.in", pipeline_output=f"{root}.out",
                                    **DURABLE) as worker:
                before = errors_counted(worker)
                await js.publish(f"{root}.in.big", document)
                msg = await results.next_msg(timeout=20)
                await poll_until(settled(js, docs, f"poolwire_pipeline_{docs}_poolwire"))
                counted = counted_since(worker, before)
            result = msgpack.unpackb(msg.data)
            assert len(msg.data) + header_bytes(msg.headers) <= nc.max_payload
            assert result["doc_id"] == 1 and result["request_id"] == f"{docs}:1"
            assert result["error"]["code"] == "invalid_request"
            assert "has no field 'text'" in result["error"]["message"]
            assert "(shortened from" in result["error"]["message"]
            assert msg.headers["Nats-Service-Error-Code"] == "400"
            assert msg.headers["Nats-Msg-Id"] == f"{docs}:1"
            assert counted == (1, 1.0)
            with pytest.raises(nats.errors.TimeoutError):  # stored once, not delivered again
                await results.next_msg(timeout=2 * DURABLE["durable_ack_wait_s"])
        finally:
            await nc.close()
