"""Trace context end to end (PROTOCOL.md "Trace context"): a worker exporting to a real
OTLP/HTTP receiver inside the test (the exporter's protobuf, decoded with opentelemetry-proto),
against the session's nats-server."""

import asyncio
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import pytest
from nats.js.api import StreamConfig
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

from poolwire.actors.events import events_subject

pytestmark = [pytest.mark.timeout(120)]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it was sent, decoded."""

    def __init__(self) -> None:
        self.spans: list = []
        self.paths: list[str] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._changed:
                    receiver.paths.append(self.path)
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                    receiver._changed.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _find(self, predicate):
        return [s for s in self.spans if predicate(s)]

    async def wait_for(self, predicate, count: int = 1, timeout: float = 15.0) -> list:
        """Spans matching `predicate`, once at least `count` arrived (the exporter sends them
        in batches after its schedule delay)."""
        def wait():
            with self._changed:
                self._changed.wait_for(lambda: len(self._find(predicate)) >= count, timeout)
                return self._find(predicate)
        found = await asyncio.to_thread(wait)
        assert len(found) >= count, f"{len(found)} of {count} spans arrived: {self.spans}"
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch):
    # A short export interval, so each test waits milliseconds, not the default 5 s.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def hexid(raw: bytes) -> str:
    return raw.hex()


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def named_by(headers) -> tuple[str, str]:
    m = TRACEPARENT_RE.match(headers["traceparent"])
    assert m, headers
    return m.group(1), m.group(2)


async def test_a_request_continues_the_callers_trace_and_its_frames_name_its_span(
        minilm, start_worker, nc, prefix, receiver):
    async with start_worker(minilm, otlp_endpoint=receiver.url, max_wait_ms=50):
        body = msgpack.packb({"input": ["hello", "world"], "request_id": "r1"})
        msg = await nc.request(f"{prefix}.embed", body, timeout=20,
                               headers={"traceparent": TRACEPARENT, "tracestate": "k=v"})
        assert msgpack.unpackb(msg.data)["request_id"] == "r1"
        trace_id, span_id = named_by(msg.headers)
        assert trace_id == TRACE_ID and span_id != CALLER_SPAN
        assert msg.headers.get("tracestate") == "k=v"  # carried along by the propagator

        # A streamed request: every frame names the request's span.
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"{prefix}.embed", msgpack.packb({"input": ["a", "b"], "stream": True}),
                         reply=inbox, headers={"traceparent": TRACEPARENT})
        frames = [await sub.next_msg(timeout=20) for _ in range(3)]
        assert msgpack.unpackb(frames[-1].data)["done"] is True
        streamed = {named_by(f.headers) for f in frames}
        assert len(streamed) == 1 and next(iter(streamed))[0] == TRACE_ID

        spans = await receiver.wait_for(lambda s: hexid(s.span_id) == span_id)
        span = spans[0]
        assert hexid(span.trace_id) == TRACE_ID and hexid(span.parent_span_id) == CALLER_SPAN
        assert span.kind == span.SPAN_KIND_CONSUMER
        a = attrs(span)
        assert a["messaging.system"] == "nats"
        assert a["messaging.destination.name"] == f"{prefix}.embed"
        assert a["poolwire.task"] == "embed" and a["poolwire.configured_task"] == "embed"
        assert a["poolwire.items"] == 2 and a["poolwire.tokens"] > 0
        assert a["poolwire.deprecated"] is False and "error.type" not in a
        stages = {e.name: e for e in span.events}
        assert {"decode", "validate", "tokenize", "queue wait", "publish"} <= set(stages)
        for event in stages.values():  # each at its stage's start, inside the request's span
            assert span.start_time_unix_nano <= event.time_unix_nano <= span.end_time_unix_nano
            assert attrs(event)["poolwire.duration_ms"] >= 0
        # The forward pass that computed it is linked to it.
        forward = await receiver.wait_for(lambda s: s.name == "forward" and any(
            link.span_id == span.span_id for link in s.links))
        assert attrs(forward[0])["poolwire.batch.size"] >= 2
        assert receiver.paths[0] == "/v1/traces"


async def test_one_forward_pass_span_is_linked_to_every_request_of_its_batch(
        minilm, start_worker, nc, prefix, receiver):
    # A long batching wait: the three requests below, sent together, share one forward pass.
    async with start_worker(minilm, otlp_endpoint=receiver.url, max_wait_ms=1000):
        parents = [f"00-{i:032x}-{i + 100:016x}-01" for i in range(1, 4)]
        # Dense arrivals first, so the engine waits for more work rather than running at once.
        await asyncio.gather(*(nc.request(f"{prefix}.embed", msgpack.packb({"input": "warm"}),
                                          timeout=20) for _ in range(4)))
        replies = await asyncio.gather(*(
            nc.request(f"{prefix}.embed", msgpack.packb({"input": f"text {i}"}), timeout=20,
                       headers={"traceparent": p}) for i, p in enumerate(parents)))
        request_spans = {named_by(r.headers)[1] for r in replies}
        assert {named_by(r.headers)[0] for r in replies} == {p[3:35] for p in parents}

        def linked_to_all(s):
            return s.name == "forward" and {hexid(link.span_id) for link in s.links} >= request_spans
        forward = (await receiver.wait_for(linked_to_all))[0]
        a = attrs(forward)
        assert a["poolwire.batch.size"] >= 3 and a["poolwire.batch.padded_tokens"] >= 3
        links = {hexid(link.trace_id) for link in forward.links}
        assert {p[3:35] for p in parents} <= links


async def test_a_malformed_traceparent_starts_a_new_trace_and_is_served(
        minilm, start_worker, nc, prefix, receiver):
    async with start_worker(minilm, otlp_endpoint=receiver.url):
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "x"}), timeout=20,
                               headers={"traceparent": "00-not-a-trace-01"})
        reply = msgpack.unpackb(msg.data)
        assert "error" not in reply and len(reply["data"]) == 1
        trace_id, span_id = named_by(msg.headers)
        span = (await receiver.wait_for(lambda s: hexid(s.span_id) == span_id))[0]
        assert span.parent_span_id == b"" and hexid(span.trace_id) == trace_id

        # An error reply names its span too, and the span carries the error code.
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "x", "dimensions": 0}),
                               timeout=20, headers={"traceparent": TRACEPARENT})
        assert msgpack.unpackb(msg.data)["error"]["code"] == "invalid_request"
        _, span_id = named_by(msg.headers)
        span = (await receiver.wait_for(lambda s: hexid(s.span_id) == span_id))[0]
        assert attrs(span)["error.type"] == "invalid_request"


async def test_a_durable_job_and_a_deprecation_event_name_the_jobs_span(
        minilm, start_worker, nc, prefix, receiver):
    # Configured for embed: a token_embed job is served with a deprecation event.
    async with start_worker(minilm, otlp_endpoint=receiver.url, task="embed",
                            durable=True, durable_ack_wait_s=5.0):
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        events = await nc.subscribe(events_subject(prefix))
        await nc.jetstream().publish(
            f"{prefix}.jobs.token_embed", msgpack.packb({"input": "a job"}),
            headers={"Pooling-Reply-To": inbox, "Nats-Msg-Id": "job-t1",
                     "traceparent": TRACEPARENT})
        frame = await sub.next_msg(timeout=20)
        assert msgpack.unpackb(frame.data)["request_id"] == "job-t1"
        trace_id, span_id = named_by(frame.headers)
        assert trace_id == TRACE_ID
        event = await events.next_msg(timeout=20)
        assert named_by(event.headers) == (trace_id, span_id)
        span = (await receiver.wait_for(lambda s: hexid(s.span_id) == span_id))[0]
        assert hexid(span.parent_span_id) == CALLER_SPAN
        a = attrs(span)
        assert a["poolwire.intake"] == "durable" and a["poolwire.deprecated"] is True
        assert a["messaging.destination.name"] == f"{prefix}.jobs.token_embed"


async def test_a_pipeline_result_names_the_documents_span(minilm, start_worker, nc, prefix,
                                                          receiver):
    root = prefix.replace(".", "_") + "_tr"
    docs = f"{root}_DOCS"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=docs, subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=f"{root}_OUT", subjects=[f"{root}.out.>"]))
    results = await nc.subscribe(f"{root}.out.>")
    try:
        async with start_worker(minilm, otlp_endpoint=receiver.url, pipeline_stream=docs,
                                pipeline_input=f"{root}.in", pipeline_output=f"{root}.out"):
            await js.publish(f"{root}.in.doc1", msgpack.packb({"text": "a document"}),
                             headers={"traceparent": TRACEPARENT})
            result = await results.next_msg(timeout=20)
            assert "data" in msgpack.unpackb(result.data)
            trace_id, span_id = named_by(result.headers)
            assert trace_id == TRACE_ID
            span = (await receiver.wait_for(lambda s: hexid(s.span_id) == span_id))[0]
            assert hexid(span.parent_span_id) == CALLER_SPAN
            assert attrs(span)["poolwire.intake"] == "pipeline"
    finally:
        for name in (docs, f"{root}_OUT"):
            await js.delete_stream(name)


async def test_without_tracing_the_incoming_trace_headers_are_passed_on(
        minilm, start_worker, nc, prefix, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    async with start_worker(minilm) as worker:
        assert not worker.tracing.enabled
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "x"}), timeout=20,
                               headers={"traceparent": TRACEPARENT, "tracestate": "k=v"})
        assert msg.headers["traceparent"] == TRACEPARENT and msg.headers["tracestate"] == "k=v"
        # Malformed or not, it is the caller's: passed on as it came.
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "x"}), timeout=20,
                               headers={"traceparent": "garbage"})
        assert msg.headers["traceparent"] == "garbage"
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": "x"}), timeout=20)
        assert not (msg.headers or {}).get("traceparent")


async def test_the_client_sends_the_callers_span_context(minilm, start_worker, nc, prefix,
                                                         receiver):
    # The caller's own SDK (a provider of the test's, not the global one): PoolingClient only
    # uses the API's global propagator on the current context.
    from opentelemetry.sdk.trace import TracerProvider

    from poolwire.client import PoolingClient

    caller = TracerProvider().get_tracer("caller")
    async with start_worker(minilm, otlp_endpoint=receiver.url, durable=True):
        client = PoolingClient(nc, prefix=prefix)
        with caller.start_as_current_span("caller request") as mine:
            ctx = mine.get_span_context()
            await client.embed(["from a traced caller"], request_id="c1")
            await client.submit("embed", {"input": "a traced job", "request_id": "c2"})
        await client.embed(["without a span"], request_id="c3")
        spans = await receiver.wait_for(
            lambda s: s.trace_id == ctx.trace_id.to_bytes(16, "big")
            and s.parent_span_id == ctx.span_id.to_bytes(8, "big"), count=2)
        assert {attrs(s)["poolwire.intake"] for s in spans} == {"request", "durable"}
