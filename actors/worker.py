"""One worker process: a NATS connection and the actor graph of DESIGN.md, with an orderly
start and drain."""

import asyncio
import logging
import socket
import sys
import time
import uuid

import nats.errors

from poolwire import __version__
from poolwire.nats_connect import close_quietly, connect, nats_options
from poolwire.actors.batch_cost import AUTO, CPU_BUDGET, BatchCost, batch_cost_of, budget_rule
from poolwire.actors.image_intake import ImageIntake
from poolwire.actors.engine import EngineActor, EngineLimits
from poolwire.actors.selfcheck import SelfCheck
from poolwire.actors.watchdog import Watchdog
from poolwire.actors.discovery import Discovery
from poolwire.actors.durable import jetstream_busy
from poolwire.actors.durable_intakes import pipeline_spec, start_intakes
from poolwire.actors.events import (EventPublisher, ensure_events_stream,
                                    events_stream_when_elected)
from poolwire.actors.ingest import IngestActor
from poolwire.actors.metrics import QueueGauges, WorkerMetrics
from poolwire.models.m3 import DEFAULT_HYBRID_WEIGHTS, SCORE_METHODS as M3_SCORE_METHODS
from poolwire.models.model import LoadedModel
from poolwire.models.backend_choice import build_backend
from poolwire.models.model_fields import ModelFacts
from poolwire.actors.queue_guard import Member, QueueConflictError, ensure_alone_or_alike
from poolwire.actors.replier import Replier
from poolwire.actors.runtime import Supervisor
from poolwire.actors.stats import CollectorTime, StageStats
from poolwire.actors.result_cache import Identity, ResultCache, fingerprint
from poolwire.actors.tracing import Tracing
from poolwire.actors.task_policy import (TaskPolicy, configured_task, embedding_kind,
                                         score_method, score_task,
                                         score_uses_configured_task, supported_tasks)
from poolwire.actors.validator import ModelLimits, ValidatorActor
from poolwire.schemas.tasks import Task
from poolwire.settings import WorkerSettings

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0002  # see Worker.start


def task_policy_for(model: LoadedModel, settings: WorkerSettings) -> TaskPolicy:
    """Settle the configured task at start; raises TaskConfigError listing supported tasks,
    ValueError for a `--score-method` the model has no outputs for."""
    supported = supported_tasks(model.kind, model.num_labels, model.per_token_classifier)
    configured = configured_task(model.architecture, supported, settings.task)
    method = score_method(model.kind, model.num_labels, configured,
                          model.prompt_template is not None)
    asked = getattr(settings, "score_method", None)
    if model.m3 is not None and Task.SCORE in supported:
        # PROTOCOL 1.3: BGE-M3 scores with the output --score-method names; a token_embed
        # deployment's default is its multi-vector rows, as for any late-interaction model.
        method = M3_SCORE_METHODS[asked or ("multi_vector" if configured is Task.TOKEN_EMBED
                                            else "dense")]
    elif asked is not None:
        raise ValueError(f"--score-method {asked} picks one of the outputs of a model with "
                         f"several (BGE-M3); {model.name} has one ({', '.join(model.outputs)}): "
                         f"leave --score-method out")
    return TaskPolicy(configured=configured, supported=tuple(supported),
                      multitask=settings.multitask,
                      score_with_configured=score_uses_configured_task(
                          model.kind, model.num_labels, configured),
                      score_computed_with=score_task(model.kind) if Task.SCORE in supported else None,
                      score_method=method)


def _retrieval_metadata(model: LoadedModel, policy: TaskPolicy) -> dict[str, str]:
    """PROTOCOL.md 1.2: `embedding_kind` where the model embeds, `score_method` where it scores."""
    out = {}
    kind = embedding_kind(model.kind)
    if kind is not None and Task.EMBED in policy.supported:
        out["embedding_kind"] = kind
    if policy.score_method is not None and Task.SCORE in policy.supported:
        out["score_method"] = policy.score_method
    return out


def model_metadata(model: LoadedModel, policy: TaskPolicy,
                   hybrid_weights: tuple[float, float, float] | None) -> dict[str, str]:
    """PROTOCOL.md 1.3: `outputs` on a multi-output model, `hybrid_weights` when it scores
    hybrid, `adapters` where the deployment has any."""
    out = _retrieval_metadata(model, policy)
    if model.m3 is not None:
        out["outputs"] = ",".join(model.outputs)
        if policy.score_method == "hybrid":
            out["hybrid_weights"] = ",".join(f"{w:g}" for w in hybrid_weights or DEFAULT_HYBRID_WEIGHTS)
    if model.adapter_names:
        out["adapters"] = ",".join(model.adapter_names)
    return out


class Worker:
    def __init__(self, settings: WorkerSettings, model: LoadedModel) -> None:
        self.settings = settings
        self.model = model
        self.policy = task_policy_for(model, settings)  # fails fast, before connecting
        self.max_embed_len = settings.pooler_config.embed_limit(model.max_length)
        # --backend: OpenVINO's compiled model lives in the state dir (models/backend_choice.py).
        self.backend = build_backend(settings.backend, model, settings.precision, settings.dtype,
                                     settings.state_dir / "openvino", settings.openvino_threads)
        self.precision = self.backend.precision
        # The planner's padding budget: a number, or from this device's and precision's measured
        # forward-pass cost (actors/batch_cost.py; measuring also warms the model up).
        self.batch_cost: BatchCost | None = None
        budget = budget_rule(settings.max_added_padding, model.device.type, self.backend.name,
                             self.precision.ov_hint)
        if budget == AUTO and model.towers is not None:
            # The measurement runs the text encoder's forward pass; images all have one length
            # and CLIP texts are short, so the CPU's default serves.
            budget = CPU_BUDGET
        if budget == AUTO:
            self.batch_cost = batch_cost_of(self.backend)
            budget = self.batch_cost.padding_budget(settings.max_batch_tokens)
        self.max_added_padding: int = budget
        self.pipeline = pipeline_spec(settings, self.policy) if settings.pipeline_stream else None
        self.worker_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.stats = StageStats()
        self.collector = CollectorTime()  # installed while the worker runs
        self.tracing = Tracing.configure(settings.otlp_endpoint)
        self.metrics = WorkerMetrics()
        self.cache = self._result_cache() if settings.cache_bucket else None
        self.metrics_port: int | None = None  # bound port of the metrics server, when serving
        self.discovery: Discovery | None = None
        self.nc = None
        self.supervisor = Supervisor()
        self.ingest: IngestActor | None = None
        self.validator: ValidatorActor | None = None
        self.engine: EngineActor | None = None
        self.events: EventPublisher | None = None
        self.intakes = []  # durable jobs and pipeline intakes (actors/durable.py), when asked for
        self.watchdog: Watchdog | None = None
        # Set with a one-line reason when the worker is deaf beyond repair or its connection was
        # closed for good: the process should then exit non-zero (poolwire serve exits 4).
        self.failed: asyncio.Future[str] | None = None

    def _result_cache(self) -> ResultCache:
        s, model = self.settings, self.model
        identity = Identity(model_files=fingerprint(model.path, model.revision),
                            backend=self.backend.name, precision=self.precision.served,
                            dtype=str(model.dtype).removeprefix("torch."),
                            device=model.device.type)
        return ResultCache(s.cache_bucket, identity, s.cache_ttl, s.cache_max_bytes, self.metrics)

    async def start(self, url: str, health_file=None) -> None:
        """Connect (NatsConnectError, one line, within nats_connect_timeout_s) and serve."""
        s = self.settings
        self.failed = asyncio.get_running_loop().create_future()
        # The event loop and the forward thread share the GIL: each time the loop releases it
        # (a socket write, the Rust tokenizer, epoll) the forward thread's Python parts (padding,
        # the backend's input handling, pooling) may keep it for a whole switch interval, 5 ms
        # by default, before the loop gets it back. With the path at tens of microseconds a
        # request that wait was most of a request's time (bench/service_cost.py's profile).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.collector.install()

        async def link_changed() -> None:
            if self.watchdog is not None:
                self.watchdog.link_changed()

        async def closed() -> None:
            if self.watchdog is not None:
                self.watchdog.closed()
            elif not self.failed.done():
                self.failed.set_result("the NATS connection was closed for good")

        def refused(reason: str) -> None:
            if self.watchdog is not None:
                self.watchdog.give_up(reason)

        self.nc = await connect(nats_options(s, url), name=f"poolwire-{self.worker_id}",
                                closed_cb=closed, disconnected_cb=link_changed,
                                reconnected_cb=link_changed, refused_cb=refused)
        if not s.allow_mixed_queue:
            await self._refuse_mixed_queue()
        replier = Replier(self.nc, self.metrics)
        if self.cache is not None:
            await self.cache.start(self.nc)  # never fails: an absent bucket is warned about
        self.build_graph(replier)
        # Subscribe before creating the events stream, and start the actors only once it exists:
        # requests that arrive meanwhile wait in the ingest mailbox, so every deprecation event
        # is kept. The other order (stream first) made nats-server 2.15 answer no-responders to
        # the first request from another connection in about 1 start in 50 here.
        await self.ingest.subscribe()
        await self.nc.flush()
        try:
            await ensure_events_stream(self.nc, s.prefix)
        except Exception as exc:
            if not jetstream_busy(exc):
                raise
            log.warning("JetStream did not answer (%r), as happens while it elects a leader: "
                        "serving now, and making the events stream once it answers", exc)
            self.supervisor.start_loop("events-stream",
                                       lambda: events_stream_when_elected(self.nc, s.prefix))
        self.start_actors()
        self.intakes = await start_intakes(self.nc, s, self.pipeline, self.validator, replier,
                                           self.engine, self.supervisor, self.tracing)
        self.discovery = self._discovery(replier)
        await self.discovery.start()
        self.watchdog = Watchdog(self.nc, s.prefix, SelfCheck(
            interval_s=s.probe_interval_s, timeout_s=s.probe_timeout_s), self._fail,
            health_file, {"worker": self.worker_id, "service_id": self.discovery.id})
        await self.watchdog.start()
        self.supervisor.start_loop("selfcheck", self.watchdog.run)
        self._start_metrics()
        await self.nc.flush()  # subscriptions reach the server before we say we are ready
        log.info("serving %s (revision %s, task %s, supported %s, multitask %s, %s; %s) on %s.* "
                 "queue %s", self.model.name, self.model.revision, self.policy.configured,
                 ", ".join(t.value for t in self.policy.supported), s.multitask,
                 self.backend.describe(), self._describe_batching(), s.prefix, s.queue)

    def build_graph(self, replier: Replier) -> None:
        """DESIGN.md's actor graph on this worker's connection (`self.nc`): the ingest, the
        validator and the engine, wired, neither subscribed nor started. `start` calls it on
        its NATS connection; bench/loop_cost.py on a stand-in, to time the path alone."""
        s = self.settings
        self.events = EventPublisher(self.nc, s.prefix, self.metrics)
        self.engine = EngineActor(self.model, replier, EngineLimits(
            max_batch_tokens=s.max_batch_tokens, max_batch_size=s.max_batch_size,
            max_wait_ms=s.max_wait_ms, max_added_padding=self.max_added_padding,
            max_queued_tokens=s.max_queued_tokens, max_embed_len=self.max_embed_len), self.events,
            self.stats, metrics=self.metrics, backend=self.backend,
            score_method=self.policy.score_method, tracing=self.tracing, cache=self.cache,
            hybrid_weights=s.hybrid,
            images=(ImageIntake(self.model.towers, s.max_image_pixels, self.nc)
                    if self.model.towers is not None else None))
        self.validator = ValidatorActor(
            self.policy, ModelLimits(self.model.name, self.model.max_length,
                                     self.model.embedding_size, ModelFacts.of(self.model)),
            self.engine, replier, self.worker_id, self.stats)
        self.ingest = IngestActor(self.nc, s.prefix, s.queue, self.validator, replier, self.stats,
                                  metrics=self.metrics, tracing=self.tracing)
        ingest, validator = self.ingest, self.validator
        self.engine.upstream = lambda: ingest.backlog + validator.backlog

    def start_actors(self) -> None:
        """The graph's actors and the engine's batch loop, under the supervisor."""
        for actor in (self.engine, self.validator, self.ingest):
            self.supervisor.start_actor(actor)
        self.supervisor.start_loop("engine-batches", self.engine.batch_loop,
                                   on_restart=self.engine.on_restart)

    async def _refuse_mixed_queue(self) -> None:
        """Before taking any request: one model and task per prefix and queue group."""
        me = Member(worker=self.worker_id, model=self.model.name,
                    configured_task=self.policy.configured.value,
                    prefix=self.settings.prefix, queue=self.settings.queue)
        try:
            await ensure_alone_or_alike(self.nc, me)
        except QueueConflictError:
            await self.nc.close()
            self.nc = None
            raise

    def _describe_batching(self) -> str:
        if self.batch_cost is None:
            given = self.settings.max_added_padding is not None
            return (f"padding budget {self.max_added_padding} tokens ("
                    + ("--max-added-padding)" if given else
                       "a CPU's default; --max-added-padding auto measures it)"))
        return self.batch_cost.describe(self.max_added_padding)

    def batching_stats(self) -> dict:
        """The planner's padding budget and, when measured, the cost it came from."""
        out: dict = {"max_added_padding": self.max_added_padding}
        if self.batch_cost is not None:
            out["batch_fixed_ms"] = round(self.batch_cost.fixed_s * 1e3, 3)
            out["padded_token_ms"] = round(self.batch_cost.per_token_s * 1e3, 5)
        return out

    def _fail(self, reason: str) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_result(reason)

    def describe(self) -> dict[str, str]:
        """What this worker serves and how: discovery metadata and the metrics' info labels.
        Every value is a string (micro v1), and none is a credential."""
        s, policy, model = self.settings, self.policy, self.model
        return {"model": model.name, "configured_task": policy.configured.value,
                "supported_tasks": ",".join(t.value for t in policy.supported),
                "multitask": policy.multitask, "worker": self.worker_id,
                "prefix": s.prefix, "queue": s.queue,
                "embedding_size": str(model.embedding_size), "max_length": str(model.max_length),
                "model_revision": model.revision,
                "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device),
                "precision": self.precision.served,  # "exact" or "fast", as served
                "backend": self.backend.name,
                "modalities": "text,image" if model.towers is not None else "text",
                **model_metadata(model, policy, s.hybrid)}

    def _start_metrics(self) -> None:
        engine = self.engine
        self.metrics.describe(**self.describe(), version=__version__)
        self.metrics.watch(QueueGauges(queued_items=lambda: engine.queued_items,
                                       queued_tokens=lambda: engine.queued_tokens,
                                       stage_seconds=lambda: dict(self.stats.seconds)))
        if self.settings.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.settings.metrics_port,
                                                   self.settings.metrics_host)
            log.info("metrics at http://%s:%d/metrics", self.settings.metrics_host,
                     self.metrics_port)

    def _discovery(self, replier: Replier) -> Discovery:
        s = self.settings
        metadata = self.describe()

        def endpoint_stats() -> dict:
            busy_ns = int(sum(self.stats.seconds.values()) * 1e9)
            requests = self.ingest.received if self.ingest else 0
            return {"num_requests": requests, "num_errors": replier.errors_sent,
                    "last_error": replier.last_error, "processing_time": busy_ns,
                    "average_processing_time": busy_ns // requests if requests else 0,
                    "data": {**self.stats.snapshot(), "gc": self.collector.snapshot(),
                             "batching": self.batching_stats(),
                             "backend": self.backend.describe(),
                             **{i.name: i.counters() for i in self.intakes},
                             **({"cache": self.cache.counters()} if self.cache else {})}}

        return Discovery(self.nc, version=__version__, metadata=metadata,
                         description="poolwire: pooling models over NATS (PROTOCOL.md 1.3)",
                         endpoint={"name": "pooling", "subject": f"{s.prefix}.*",
                                   "queue_group": s.queue},
                         stats=endpoint_stats)

    @property
    def backlog(self) -> int:
        return sum(a.backlog for a in (self.ingest, self.validator, self.engine, *self.intakes)
                   if a is not None)

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Drain: stop intake, answer everything in flight (up to drain_timeout_s), then close.
        Each step is bounded, so a lost server connection cannot hang the shutdown."""
        self.collector.remove()
        if self.nc is None:
            return
        if self.watchdog is not None:
            await self.watchdog.stop()  # our own close is not a fault
        timeout = drain_timeout_s or self.settings.drain_timeout_s
        deadline = time.monotonic() + timeout
        # Unsubscribing waits on the server; with the server gone it would take the whole
        # drain timeout for nothing. What is in flight is still computed, and its replies go
        # out if the connection comes back before the deadline.
        try:
            for intake in self.intakes:  # jobs not started go back to JetStream at once
                await asyncio.wait_for(intake.stop_intake(), timeout)
            if self.nc.is_connected and self.ingest is not None:
                await asyncio.wait_for(self.ingest.stop_intake(), timeout)
            if self.nc.is_connected and self.discovery is not None:
                await asyncio.wait_for(self.discovery.stop(), timeout)
        except (asyncio.TimeoutError, nats.errors.Error, OSError) as exc:
            log.warning("could not unsubscribe cleanly (%r); closing", exc)
        while self.backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.backlog:
            log.warning("drain timed out with %d messages still in flight", self.backlog)
        await self.supervisor.stop()
        self.metrics.close()
        await asyncio.to_thread(self.tracing.shutdown)  # exports what is left; blocking I/O
        if self.engine is not None:
            await self.engine.close()
        if self.cache is not None:
            await self.cache.close()
        try:
            if self.nc.is_connected:
                await asyncio.wait_for(self.nc.drain(), max(1.0, deadline - time.monotonic()))
        except (asyncio.TimeoutError, nats.errors.Error, OSError) as exc:
            log.warning("could not drain the NATS connection (%r)", exc)
        finally:
            await close_quietly(self.nc)
            self.nc = None

    async def __aenter__(self) -> "Worker":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
