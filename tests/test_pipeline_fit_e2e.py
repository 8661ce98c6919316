"""Pipeline documents whose result or error cannot be stored as it is, against a nats-server with
a small max_payload: each is answered exactly once, by an error result that fits, and the
worker goes on to serve the next document (before, such a document was computed, failed to
store, and was delivered again)."""

import json
import time

import msgpack
import nats
import nats.errors
import numpy as np
import pytest
from nats.js.api import StreamConfig

import poolwire.actors.engine
from poolwire.actors.durable import stream_name
from poolwire.actors.framing import ReplyStyle, header_bytes, one_reply, wire_item
from poolwire.actors.nats_server import NatsServer
from poolwire.actors.pipeline import Place
from poolwire.schemas.codec import WireFormat

pytestmark = [pytest.mark.timeout(60)]

ACK_WAIT_S = 1.0


def streams(prefix: str) -> tuple[str, str]:
    root = prefix.replace(".", "_")
    return root, f"{root}_DOCS"


async def results_of(sub, count: int, timeout: float = 15.0) -> tuple[list, float]:
    """`count` results and the seconds they took, then proof there is no further one: a
    redelivered document would be stored again within ack_wait (the results stream keeps one
    per Nats-Msg-Id, so the test reads the output subject itself, where every store shows)."""
    started = time.monotonic()
    got = [await sub.next_msg(timeout=timeout) for _ in range(count)]
    took = time.monotonic() - started
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=2 * ACK_WAIT_S)
    return got, took


async def pipeline(nc, root: str, docs: str):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=docs, subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=f"{root}_OUT", subjects=[f"{root}.out.>"]))
    return js, await nc.subscribe(f"{root}.out.>")


def num_errors(worker) -> int:
    return worker.discovery.response("STATS")["endpoints"][0]["num_errors"]


def fits(msg, max_payload: int) -> bool:
    return len(msg.data) + header_bytes(msg.headers) <= max_payload


@pytest.mark.parametrize("engine_sizes_it", [True, False], ids=["engine", "intake-backstop"])
async def test_a_result_just_under_max_payload_is_stored_as_payload_too_large_once(
        minilm, start_worker, prefix, report, monkeypatch, engine_sizes_it):
    """`engine`: refused before compute. `intake-backstop`: the engine's sizing is made to
    ignore what the pipeline adds (as a reply the estimate did not cover would), and the
    intake still stores payload_too_large rather than a result it cannot store."""
    if not engine_sizes_it:
        import poolwire.actors.reply_size as reply_size
        ignoring = lambda job, max_payload: (max_payload, job.headers)  # noqa: E731
        monkeypatch.setattr(reply_size, "reply_room", ignoring)
        monkeypatch.setattr(poolwire.actors.engine, "reply_room", ignoring)
    root, docs = streams(prefix)
    short_id, long_id = "a", "b" * 60
    # The engine's one-message reply to either document (MessagePack packs every float in 5
    # bytes, so its size does not depend on the values), and what storing the short one adds.
    style = ReplyStyle(WireFormat.MSGPACK, False, "float32")
    reply = one_reply(f"{docs}:1", minilm.name, "embed",
                      [wire_item(0, np.zeros(minilm.embedding_size, np.float32), style)], 5,
                      style, 2**40)
    added = len(msgpack.packb({"doc_id": short_id})) - 1 + header_bytes(
        Place(docs, 1, short_id, "").headers())
    # The short id's result fits with 16 bytes to spare (the engine's estimate allows 5 bytes
    # for each usage count); the long id's adds 59 bytes: its body still passes nats-py's
    # check, only the headers take it over, where the server would reset the connection.
    max_payload = len(reply) + added + 16
    assert len(reply) + 7 + len(msgpack.packb(long_id)) <= max_payload
    with NatsServer(max_payload=max_payload) as server:
        nc = await nats.connect(server.url)
        try:
            js, results = await pipeline(nc, root, docs)
            async with start_worker(minilm, url=server.url, pipeline_stream=docs,
                                    pipeline_input=f"{root}.in", pipeline_output=f"{root}.out",
                                    pipeline_id_field="id", durable_ack_wait_s=ACK_WAIT_S) as worker:
                before = num_errors(worker)  # the readiness check's request was an error
                await js.publish(f"{root}.in.1", msgpack.packb({"id": long_id, "text": "first"}))
                await js.publish(f"{root}.in.2", msgpack.packb({"id": short_id, "text": "second"}))
                got, took = await results_of(results, 2)
                stats = worker.discovery.response("STATS")["endpoints"][0]
                counted = num_errors(worker) - before
                consumer = await js.consumer_info(docs, f"poolwire_pipeline_{docs}_poolwire")
        finally:
            await nc.close()
    by_seq = {int(m.headers["Pooling-Source-Seq"]): msgpack.unpackb(m.data) for m in got}
    refused, served = by_seq[1], by_seq[2]
    assert refused["doc_id"] == long_id and refused["error"]["code"] == "payload_too_large"
    assert f"max_payload (now {max_payload} bytes)" in refused["error"]["message"] \
        if engine_sizes_it else "over max_payload" in refused["error"]["message"]
    assert served["doc_id"] == short_id and len(served["data"][0]["data"]) == minilm.embedding_size
    assert all(fits(m, max_payload) for m in got)
    assert consumer.num_redelivered == 0 and consumer.num_ack_pending == 0
    assert stats["last_error"].startswith("payload_too_large") and counted == 1
    report("a result just under max_payload", max_payload=max_payload,
           both_answered_s=round(took, 2), redelivered=consumer.num_redelivered)


async def test_a_long_doc_id_and_long_field_names_are_answered_once_within_max_payload(
        minilm, start_worker, prefix, report):
    """3 KiB: a MiniLM result and a little more. A doc_id of 300 characters, refused as
    invalid_request with the stream sequence as doc_id; a document without its text field whose
    ten field names of 200 characters are listed as previews; a JSON document whose doc_id is
    within the bound (256 emoji) but encodes to 3 KB (`\\ud83d\\ude00` each), too big for
    any result: it is refused as payload_too_large, stored with the stream sequence as doc_id."""
    root, docs = streams(prefix)
    long_id = "d" * 300  # over the 256 characters of MAX_DOC_ID_CHARS
    emoji_id = "\U0001F600" * 256
    no_text = {f"{i}" + "f" * 199: i for i in range(10)}
    with NatsServer(max_payload=3 * 1024) as server:
        nc = await nats.connect(server.url)
        try:
            js, results = await pipeline(nc, root, docs)
            async with start_worker(minilm, url=server.url, pipeline_stream=docs,
                                    pipeline_input=f"{root}.in", pipeline_output=f"{root}.out",
                                    pipeline_id_field="id", durable_ack_wait_s=ACK_WAIT_S) as worker:
                before = num_errors(worker)
                await js.publish(f"{root}.in.1", msgpack.packb({"id": long_id, "text": "first"}))
                await js.publish(f"{root}.in.2", msgpack.packb({"id": "two", **no_text}))
                await js.publish(f"{root}.in.3", msgpack.packb({"id": "three", "text": "third"}))
                await js.publish(f"{root}.in.4", json.dumps(
                    {"id": emoji_id, "text": "fourth"}, ensure_ascii=False).encode())
                got, took = await results_of(results, 4)
                counted = num_errors(worker) - before
                consumer = await js.consumer_info(docs, f"poolwire_pipeline_{docs}_poolwire")
            max_payload = nc.max_payload
        finally:
            await nc.close()
    by_seq = {int(m.headers["Pooling-Source-Seq"]): (m, (json.loads if m.data[:1] == b"{" else
                                                         msgpack.unpackb)(m.data)) for m in got}
    assert sorted(by_seq) == [1, 2, 3, 4]
    _, long = by_seq[1]
    assert long["doc_id"] == 1 and long["error"]["code"] == "invalid_request"
    assert long["error"]["field"] == "id" and "300 characters" in long["error"]["message"]
    _, fields = by_seq[2]
    assert fields["doc_id"] == "two" and fields["error"]["code"] == "invalid_request"
    message = fields["error"]["message"]
    assert message.count("...(200 chars)") == 10 and "shortened from" not in message
    _, served = by_seq[3]
    assert served["doc_id"] == "three" and len(served["data"][0]["data"]) == minilm.embedding_size
    _, emoji = by_seq[4]
    assert emoji["doc_id"] == 4 and emoji["error"]["code"] == "payload_too_large"
    assert all(fits(m, max_payload) for m, _ in by_seq.values())
    assert consumer.num_redelivered == 0 and consumer.num_ack_pending == 0
    assert counted == 3
    report("long doc_id and field names", answered_s=round(took, 2),
           field_error_bytes=len(by_seq[2][0].data), redelivered=consumer.num_redelivered)


@pytest.mark.chaos
async def test_a_poison_document_near_max_payload_is_dead_lettered_once(
        minilm, start_worker, prefix, monkeypatch, report):
    """A document of about 2.9 KB under a 3 KiB max_payload whose forward pass raises on every
    delivery (patched in this in-process worker, as a device fault on that input would): its
    dead letter, which carries the document, cannot hold all of it under max_payload."""
    root, docs = streams(prefix)
    poison_ids = minilm.tokenizer("poisonous xylophone")["input_ids"]
    real = poolwire.actors.engine.run_batch

    def failing_on_poison(backend, seqs, specs):
        if any(list(seq.ids) == poison_ids for seq in seqs):
            raise RuntimeError("simulated device fault on this input")
        return real(backend, seqs, specs)

    monkeypatch.setattr(poolwire.actors.engine, "run_batch", failing_on_poison)
    with NatsServer(max_payload=3 * 1024) as server:
        nc = await nats.connect(server.url)
        try:
            js, results = await pipeline(nc, root, docs)
            document = msgpack.packb({"id": "p", "text": "poisonous xylophone", "pad": "x" * 2900})
            assert 2900 < len(document) < nc.max_payload
            async with start_worker(minilm, url=server.url, pipeline_stream=docs,
                                    pipeline_input=f"{root}.in", pipeline_output=f"{root}.out",
                                    pipeline_id_field="id", durable_max_deliveries=2,
                                    durable_ack_wait_s=ACK_WAIT_S) as worker:
                before = num_errors(worker)
                await js.publish(f"{root}.in.1", document)
                await js.publish(f"{root}.in.2", msgpack.packb({"id": "next", "text": "fine"}))
                got, took = await results_of(results, 2)
                counted = num_errors(worker) - before
                intake = worker.intakes[0].counters()
                dead = await js.pull_subscribe(f"{prefix}.dead.embed",
                                               stream=stream_name("DEAD", prefix))
                letters = await dead.fetch(5, timeout=2)
            max_payload = nc.max_payload
        finally:
            await nc.close()
    by_seq = {int(m.headers["Pooling-Source-Seq"]): (m, msgpack.unpackb(m.data)) for m in got}
    assert by_seq[1][1]["doc_id"] == "p" and by_seq[1][1]["error"]["code"] == "internal"
    assert by_seq[2][1]["doc_id"] == "next" and "data" in by_seq[2][1]
    assert len(letters) == 1 and intake["dead_lettered"] == 1 and counted == 1
    record = msgpack.unpackb(letters[0].data)
    assert record["job"] is None and record["job_bytes"] == len(document)
    assert all(len(m.data) + header_bytes(m.headers) <= max_payload
               for m in [*got, *letters])
    report("poison document near max_payload", answered_s=round(took, 2),
           dead_letter_bytes=len(letters[0].data), deliveries=record["deliveries"])
