"""W3C trace context (PROTOCOL.md "Trace context") with OpenTelemetry's own libraries.

A worker that exports traces (`--otlp-endpoint`, or the standard `OTEL_EXPORTER_OTLP_*`
variables) continues each request's, durable job's and pipeline document's trace with one
CONSUMER span, whose stages (decode, validate, cache lookup, tokenize, queue wait, publish)
are events at each stage's start carrying its duration, and makes one span per forward pass linked to the span of
every request in it (a batch serves many traces: the semantic conventions' batch processing).
Every frame the request's answer is made of carries the `traceparent` of its span.

A worker that exports nothing passes the request's own `traceparent` and `tracestate` on
unchanged and does nothing else: the SDK and the exporter are not even imported. Context is
extracted and injected with the global propagator (W3C trace context by default), never parsed
here: a malformed `traceparent` comes out of it as no context, so the request starts a trace.

The actors call only: `Tracing.begin` (at intake), `trace_of(job).stage/open/close/set/end`,
`Tracing.forward_started/forward_ended` (the engine's batch loop); all are no-ops when off.
"""

import logging
import os
import time
from contextlib import contextmanager, nullcontext

from opentelemetry import propagate
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

log = logging.getLogger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")
_NULL = nullcontext()


def _wall_ns(monotonic_s: float | None) -> int:
    """A monotonic stamp (what the actors keep) as the wall-clock nanoseconds spans want."""
    now = time.time_ns()
    if monotonic_s is None:
        return now
    return now - int((time.monotonic() - monotonic_s) * 1e9)


class PassThrough:
    """A request's trace on a worker that exports nothing: its own trace headers, passed on."""

    __slots__ = ("headers",)
    span_context = None

    def __init__(self, headers: dict[str, str] | None) -> None:
        self.headers = headers

    def stage(self, name: str):
        return _NULL

    def open(self, name: str) -> None:
        pass

    def close(self, name: str) -> None:
        pass

    def set(self, **attributes) -> None:
        pass

    def end(self, error_code=None) -> None:
        pass


NO_TRACE = PassThrough(None)


def trace_of(message) -> "PassThrough | RequestTrace":
    """The trace a job or incoming request carries; built without one (tests, other callers),
    it has none."""
    return getattr(message, "trace", None) or NO_TRACE


class RequestTrace:
    """One request's span. Its stages are recorded as (start, end) times and become events
    when the request ends, so the hot path only reads the clock."""

    __slots__ = ("_tracer", "span", "headers", "_stages", "_open", "_ended")

    def __init__(self, tracer, span) -> None:
        self._tracer = tracer
        self.span = span
        self.headers: dict[str, str] = {}
        propagate.inject(self.headers, context=set_span_in_context(span))
        self._stages: dict[str, list[int]] = {}  # name -> [first start, last end]
        self._open: dict[str, int] = {}
        self._ended = False

    @property
    def span_context(self):
        return self.span.get_span_context()

    def _record(self, name: str, start: int, end: int) -> None:
        # A stage met more than once (publish, for a streamed reply) is one span from its first
        # start to its last end.
        known = self._stages.get(name)
        if known is None:
            self._stages[name] = [start, end]
        else:
            known[1] = end

    @contextmanager
    def stage(self, name: str):
        start = time.time_ns()
        try:
            yield
        finally:
            self._record(name, start, time.time_ns())

    def open(self, name: str) -> None:
        self._open.setdefault(name, time.time_ns())

    def close(self, name: str) -> None:
        start = self._open.pop(name, None)
        if start is not None:
            self._record(name, start, time.time_ns())

    def set(self, **attributes) -> None:
        for key, value in attributes.items():
            if value is not None:
                self.span.set_attribute(f"poolwire.{key}", value)

    def end(self, error_code=None) -> None:
        if self._ended:
            return
        self._ended = True
        end = time.time_ns()
        for name in list(self._open):
            self.close(name)
        # Events, not child spans: five more spans a request cost as much again to make and
        # export, and an event at the stage's start with its duration says the same.
        for name, (start, stop) in self._stages.items():
            self.span.add_event(name, {"poolwire.duration_ms": (stop - start) / 1e6},
                                timestamp=start)
        if error_code is not None:
            code = getattr(error_code, "value", error_code)
            self.span.set_attribute("error.type", code)
            self.span.set_attribute("poolwire.error_code", code)
            self.span.set_status(Status(StatusCode.ERROR, code))
        self.span.end(end_time=end)


class Tracing:
    """A worker's tracer, or none (off). Each worker has its own provider, so workers in one
    process (the tests) can trace or not independently; the propagator is the global one."""

    def __init__(self, tracer=None, provider=None) -> None:
        self._tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @classmethod
    def configure(cls, endpoint: str | None, service_name: str = "poolwire") -> "Tracing":
        """On when an endpoint is given or the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variable is
        set (and OTEL_SDK_DISABLED is not true); off otherwise."""
        env = os.environ
        configured = endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") \
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not configured or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls()
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise RuntimeError(f"tracing needs the OpenTelemetry SDK and OTLP exporter ({exc}); "
                               f"install them with: pip install 'poolwire[tracing]'") from exc
        from poolwire import __version__

        # --otlp-endpoint is a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is; an explicit endpoint
        # argument is used by the exporter as given, so the signal's path is added here. Without
        # one the exporter reads the variables itself (and adds the path to the generic one).
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces") if endpoint \
            else OTLPSpanExporter()
        # OTEL_SERVICE_NAME (and OTEL_RESOURCE_ATTRIBUTES) are read by Resource.create; an
        # explicit service.name would override them, so it is given only when they say none.
        attributes = {} if env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
            "OTEL_RESOURCE_ATTRIBUTES", "") else {SERVICE_NAME: service_name}
        provider = TracerProvider(resource=Resource.create(attributes))
        # Schedule delay, queue size and batch size from the OTEL_BSP_* variables.
        provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info("exporting traces over OTLP/HTTP to %s", endpoint or configured)
        return cls(provider.get_tracer("poolwire", __version__), provider)

    def begin(self, headers: dict | None, subject: str, received_at: float | None = None,
              intake: str = "request") -> "PassThrough | RequestTrace":
        """The trace of a message that just arrived (`received_at`: its monotonic stamp)."""
        if self._tracer is None:
            if not headers or "traceparent" not in headers:
                return NO_TRACE
            return PassThrough({k: headers[k] for k in TRACE_HEADERS if k in headers})
        carrier = {k.lower(): v for k, v in headers.items()} if headers else {}
        span = self._tracer.start_span(
            f"process {subject}", context=propagate.extract(carrier), kind=SpanKind.CONSUMER,
            start_time=_wall_ns(received_at),
            attributes={"messaging.system": "nats", "messaging.destination.name": subject,
                        "messaging.operation.type": "process", "messaging.operation.name":
                        "process", "poolwire.intake": intake})
        return RequestTrace(self._tracer, span)

    def forward_started(self, traces, sequences: int, padded_tokens: int):
        """The span of one forward pass, linked to every request it computes for; None when
        off. Ends each request's queue wait."""
        if self._tracer is None:
            return None
        links, seen = [], set()
        for t in traces:
            t.close("queue wait")
            ctx = t.span_context
            if ctx is not None and id(t) not in seen:
                seen.add(id(t))
                links.append(Link(ctx))
        return self._tracer.start_span("forward", links=links, attributes={
            "poolwire.batch.size": sequences, "poolwire.batch.padded_tokens": padded_tokens,
            "poolwire.batch.requests": len(links), "messaging.batch.message_count": len(links)})

    @staticmethod
    def forward_ended(span, error: BaseException | None = None) -> None:
        if span is None:
            return
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, repr(error)))
        span.end()

    def shutdown(self) -> None:
        """Export what is left (the worker's drain)."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = None


OFF = Tracing()
