"""Prometheus metrics of one worker (prometheus-client), served on `--metrics-port`.

Counters and histograms are observed where the event happens (a batch computed, a request
answered, an error or a deprecation event sent). Values the worker already keeps — queue depth,
seconds per stage — are read at scrape time by a collector instead of being counted twice.
Each worker has its own registry, so several workers in one process (the tests) never share
series.
"""

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Sequences per forward pass (max_batch_size defaults to 64) and padded tokens per forward pass
# (max_batch_tokens defaults to 8192): powers of two cover both ends.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PADDED_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)
# From a one-text request on a GPU (a millisecond) to a large batch on a busy CPU worker.
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class QueueGauges:
    """Read at scrape time: what the engine holds now, and the seconds each stage has taken."""

    queued_items: Callable[[], int]
    queued_tokens: Callable[[], int]
    stage_seconds: Callable[[], dict[str, float]]


class _ScrapeTimeCollector(Collector):
    def __init__(self, gauges: QueueGauges) -> None:
        self._gauges = gauges

    def collect(self):
        items = GaugeMetricFamily("poolwire_queued_items",
                                  "sequences waiting for a forward pass")
        items.add_metric([], self._gauges.queued_items())
        tokens = GaugeMetricFamily("poolwire_queued_tokens",
                                   "tokens of the sequences waiting for a forward pass")
        tokens.add_metric([], self._gauges.queued_tokens())
        stages = CounterMetricFamily("poolwire_stage_seconds",
                                     "seconds spent per stage of the worker", labels=["stage"])
        for stage, seconds in self._gauges.stage_seconds().items():
            stages.add_metric([stage], seconds)
        yield from (items, tokens, stages)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("poolwire_requests", "requests received, by subject task name",
                                ["task"], registry=r)
        self.batch_size = Histogram("poolwire_batch_size", "sequences per forward pass",
                                    buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_padded_tokens = Histogram(
            "poolwire_batch_padded_tokens", "padded tokens (batch x longest) per forward pass",
            buckets=PADDED_TOKEN_BUCKETS, registry=r)
        self.request_seconds = Histogram(
            "poolwire_request_seconds", "from receipt to the last reply frame of a served request",
            ["task"], buckets=LATENCY_BUCKETS, registry=r)
        self.errors = Counter("poolwire_errors", "error replies sent, by error code", ["code"],
                              registry=r)
        self.deprecations = Counter(
            "poolwire_deprecation_events",
            "deprecation events published, by the requested (non-configured) task",
            ["requested_task"], registry=r)
        # The result cache (actors/result_cache.py; zero where none is configured).
        self.cache_hits = Counter("poolwire_cache_hits", "items served from the result cache",
                                  registry=r)
        self.cache_misses = Counter("poolwire_cache_misses",
                                    "items looked up in the result cache and computed", registry=r)
        self.cache_bytes_written = Counter("poolwire_cache_bytes_written",
                                           "bytes stored in the result cache", registry=r)
        self.cache_lookup_seconds = Histogram(
            "poolwire_cache_lookup_seconds", "seconds per request's result cache lookup",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25), registry=r)
        self.cache_errors = Counter(
            "poolwire_cache_errors", "result cache lookups or stores that failed (unreachable, "
            "full, slow or deleted bucket); the items were computed", registry=r)
        self.info = Info("poolwire_worker", "what this worker serves and how", registry=r)
        self._server = None

    def describe(self, **labels: str) -> None:
        """The info metric's labels: model, configured task, dtype, device, ..."""
        self.info.info({k: str(v) for k, v in labels.items()})

    def watch(self, gauges: QueueGauges) -> None:
        self.registry.register(_ScrapeTimeCollector(gauges))

    def observe_batch(self, sequences: int, padded_tokens: int) -> None:
        self.batch_size.observe(sequences)
        self.batch_padded_tokens.observe(padded_tokens)

    def serve(self, port: int, host: str) -> int:
        """Serve /metrics over HTTP in a daemon thread; returns the bound port (port 0: any)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
