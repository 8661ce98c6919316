"""The EngineActor: the only owner of the model. It tokenizes validated jobs, admits them
under a queued-token bound, micro-batches their sequences with the BatchPlanner, runs each
forward pass in its own thread (torch releases the GIL, so the event loop keeps taking and
tokenizing requests meanwhile; only a batch the backend knows to take well under a millisecond,
while nothing else waits, is computed on the loop itself) and publishes the reply frames."""

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from poolwire.actors.batch_planner import BatchPlanner, QueuedItem, computes_on_loop
from poolwire.models.backend import Backend, TorchBackend
from poolwire.models.forward import run_batch
from poolwire.actors.framing import (ReplyStyle, done_frame, item_frames, one_reply, rows_from,
                                     wire_item)
from poolwire.actors.messages import Job
from poolwire.actors.metrics import WorkerMetrics
from poolwire.models.model import LoadedModel
from poolwire.actors.replier import Replier
from poolwire.actors.reply_size import check_reply_fits, reply_room
from poolwire.actors.runtime import Actor, MailboxFull
from poolwire.actors.stats import StageStats
from poolwire.actors.tracing import OFF, Tracing, trace_of
from poolwire.models.assembly import assemble_items, sequence_values
from poolwire.models.sparse_vector import SparseVector
from poolwire.models.task_heads import TaskPlan, plan_task, texts_for_ids
from poolwire.models.tokenizing import Tokenizing
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.media import has_images
from poolwire.schemas.tasks import TOKEN_LEVEL_TASKS, Task

log = logging.getLogger(__name__)


def name_os_thread(name: str) -> None:
    """Give the calling thread its name in the OS too (/proc/<pid>/task/<tid>/comm), where
    top, py-spy and bench/service_cost.py's CPU split by thread see it; Python names only its
    own Thread object. Best effort: not every system has /proc."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


TOKENIZE_THREAD = "poolwire-tokenize"


def start_tokenizer_pool() -> None:
    """Have the Rust tokenizers' thread pool made now, from a thread named as the tokenize
    thread, before anything else in the process makes a batch call. That pool (rayon's, made by
    the process's first batch call) does the work of every batch call the tokenize thread
    makes, and a new thread takes the OS name of the thread that made it. Made by the main
    thread (the backend's start-up check), its threads were named after the process and read
    as the backend's threads in bench/service_cost.py's CPU split, where perf found them doing
    all of that column's work at both load shapes (2026-12-04). Made here, their CPU shows as
    tokenizing in top -H, py-spy and that split. Nothing is made where TOKENIZERS_PARALLELISM
    turns the pool off, nor where the pool exists already."""
    from tokenizers import Tokenizer, models

    def make() -> None:
        name_os_thread(TOKENIZE_THREAD)
        Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).encode_batch(["", ""])

    thread = threading.Thread(target=make, name=TOKENIZE_THREAD)
    thread.start()
    thread.join()


def _item(value):
    """An item's value for framing: an array, or as it is a sparse model's SparseVector and a
    BGE-M3 item's map of outputs."""
    return value if isinstance(value, (SparseVector, dict)) else np.asarray(value)


@dataclass(frozen=True)
class EngineLimits:
    max_batch_tokens: int = 8192     # padded tokens (batch x longest) per forward pass
    max_batch_size: int = 64
    max_wait_ms: float = 2.0         # wait this long for more work when a batch is not full
    max_added_padding: int = 16      # padding tokens an item may add to join a batch
    max_queued_tokens: int = 262144  # admission bound; past it requests get `overloaded`
    max_embed_len: int | None = None  # chunked processing of embed inputs up to this many tokens


@dataclass(frozen=True)
class _Looked:
    """A job back from its result cache lookup, which ran beside the mailbox."""

    job: Job
    cached: object  # the cache's Lookup, or None: compute it all


@dataclass(frozen=True)
class _Prepared:
    """A job back from its images' preparation (actors/image_intake.py), which ran beside the
    mailbox: its decoded, preprocessed images by (field, index)."""

    job: Job
    images: dict


def _engine_full() -> PoolingError:
    """The answer to a job that comes back from work beside the mailbox to a full mailbox."""
    return PoolingError(ErrorCode.OVERLOADED, "the worker's engine queue is full; retry later or "
                                              "add workers", retry_after_ms=100)


@dataclass(frozen=True)
class _Tokenized:
    """Jobs back from the tokenize thread (EngineActor._tokenize_beside), in the order they
    came, with their texts' ids by (text, limit, side)."""

    jobs: list
    ahead: dict


@dataclass
class _Shape:
    """A planned batch's size: sequences, their real tokens, and padded (rows x longest)."""

    sequences: int
    real: int
    padded: int


@dataclass(eq=False)
class InFlight:
    """One admitted request: its plan, the outputs kept for its reply, and what is left."""

    job: Job
    plan: TaskPlan
    style: ReplyStyle
    remaining: int
    outputs: dict[int, np.ndarray] = field(default_factory=dict)
    queued: list[QueuedItem] = field(default_factory=list)  # its sequences in the planner
    failed: bool = False    # its error frame went out
    answered: bool = False  # its final frame went out
    # Result cache (actors/result_cache.py): the item each queued sequence computes (None:
    # sequence i is item i) and every item's key, for storing what is computed.
    item_of: list[int] | None = None
    cache_keys: list[str] | None = None

    @property
    def keeps_outputs(self) -> bool:
        # A one-message reply needs every item; a bi-encoder score needs both sides of a pair;
        # a rerank needs every score before the first item is known; a chunked input all its
        # chunks.
        return (not self.job.request.stream or self.plan.pairs is not None
                or self.plan.rerank is not None or self.plan.chunks is not None)


class EngineActor(Actor):
    name = "engine"

    def __init__(self, model: LoadedModel, replier: Replier, limits: EngineLimits,
                 publish_event=None, stats: StageStats | None = None,
                 mailbox_size: int = 4096, metrics: WorkerMetrics | None = None,
                 backend: Backend | None = None, score_method: str | None = None,
                 tracing: Tracing = OFF, cache=None,
                 hybrid_weights: tuple[float, float, float] | None = None,
                 images=None) -> None:
        super().__init__(mailbox_size)
        self._images = images  # an ImageIntake on a multimodal model, else None
        self.score_method = score_method  # None: the model's own (task_heads.default_score_method)
        self.hybrid_weights = hybrid_weights  # BGE-M3's hybrid score (None: the model card's)
        self._tracing = tracing
        self._cache = cache  # a ResultCache, or None
        # How the model is computed is the backend's business (models/backend.py); the engine
        # only plans batches and hands them over.
        self.backend = backend or TorchBackend(model)
        self.stats = stats or StageStats()
        self._metrics = metrics
        self._request_seconds: dict[Task, object] = {}  # the histogram's child per task
        self._publish_event = publish_event  # async callable(DeprecationEvent), or None
        self.model = model
        self.limits = limits
        self._replier = replier
        self._tokenizing = Tokenizing(model.tokenizer, model.max_length)
        self._planner = BatchPlanner(limits.max_batch_tokens, limits.max_batch_size,
                                     limits.max_added_padding)
        self._wake = asyncio.Event()       # set on arrivals and when a forward pass ends
        self._in_forward = 0                # batches handed to the forward thread, not yet done
        self._last_delivery: asyncio.Task | None = None
        self._last_arrival = 0.0
        self._arrival_gap_s = float("inf")  # moving average of the gap between arrivals
        self._inflight: set[InFlight] = set()
        self._looking = 0                   # jobs whose work beside the mailbox is under way
        self._lookups: set[asyncio.Task] = set()
        # One thread computes at a time: the model is never used from two threads at once (the
        # loop computes a quick batch only while this thread has nothing: _forward).
        self._forward_thread = ThreadPoolExecutor(1, thread_name_prefix="poolwire-forward",
                                                  initializer=name_os_thread,
                                                  initargs=("poolwire-forward",))
        self._tokens_per_s = 0.0  # drain rate, for `retry_after_ms`
        self._tokenize_queue: list[tuple[Job, list[str]]] = []  # jobs for the next batch call
        self._tokenize_jobs = 0             # jobs queued or in the tokenize thread
        self._tokenize_task: asyncio.Task | None = None
        # Requests received upstream (the ingest's and validator's backlogs) and not yet here;
        # the worker wires it once those actors exist (_wait_for_batch).
        self.upstream: Callable[[], int] = lambda: 0
        # Encodes the texts of jobs taken together (Tokenizing.encode_ahead): the Rust
        # tokenizer's batch call releases the GIL, so on another core.
        self._tokenize_thread = ThreadPoolExecutor(1, thread_name_prefix=TOKENIZE_THREAD,
                                                   initializer=name_os_thread,
                                                   initargs=(TOKENIZE_THREAD,))

    @property
    def backlog(self) -> int:
        return super().backlog + len(self._inflight) + self._looking + self._tokenize_jobs

    @property
    def queued_items(self) -> int:
        """Sequences waiting for a forward pass."""
        return len(self._planner)

    @property
    def queued_tokens(self) -> int:
        return self._planner.queued_tokens

    def _to_tokenize(self, job: Job) -> bool:
        """Queue a job whose texts are tokenized beside the mailbox (True), or leave it to be
        planned at once (False): a one-text job on an idle engine (one request at a time)
        costs less encoded here than handed to a thread and back. Idle means nothing behind it
        either: the first job of a burst joins the rest of the burst, whose batch call and
        forward pass it would otherwise run ahead of, in a pass of its own."""
        if not self._tokenizing.encodes_ahead:
            return False
        texts = texts_for_ids(job.task, job.request, self.model)
        # _on_its_way counts this job too: it is the mailbox's message being handled.
        idle = not (self._in_forward or len(self._planner)) and self._on_its_way() <= 1
        if not texts or (len(texts) == 1 and idle):
            return False
        self._tokenize_queue.append((job, texts))
        self._tokenize_jobs += 1
        if self._tokenize_task is None or self._tokenize_task.done():
            self._tokenize_task = asyncio.create_task(self._tokenize_beside(),
                                                      name="poolwire-tokenize")
        return True

    async def _tokenize_beside(self) -> None:
        """Encode the texts of every queued job in one batch call in the tokenize thread (the
        Rust tokenizer's batch call releases the GIL, its one-text call does not), and hand
        the jobs back to the mailbox with their ids (_Tokenized); jobs queued meanwhile are
        the next batch. The mailbox goes on meanwhile, as TEI's router does beside its
        tokenizers."""
        loop = asyncio.get_running_loop()
        while self._tokenize_queue:
            taken, self._tokenize_queue = self._tokenize_queue, []
            triples = [(text, job.request.truncate_prompt_tokens, job.request.truncation_side)
                       for job, texts in taken for text in texts]
            started = time.perf_counter()
            try:
                ahead = await loop.run_in_executor(self._tokenize_thread,
                                                   self._tokenizing.encode_ahead, triples)
            except Exception:  # the plans encode them instead, and answer what fails
                log.exception("encoding %d texts ahead failed; they are encoded one job at "
                              "a time", len(triples))
                ahead = {}
            self.stats.add("tokenize", time.perf_counter() - started)
            try:
                self.tell(_Tokenized([job for job, _ in taken], ahead))
            except MailboxFull:
                for job, _ in taken:
                    await self._refuse(job, _engine_full())
            finally:
                self._tokenize_jobs -= len(taken)  # after the tell: the backlog never reads 0

    async def receive(self, message: "Job | _Looked | _Prepared | _Tokenized") -> None:
        if isinstance(message, _Tokenized):
            self._tokenizing.use_ahead(message.ahead)
            try:
                for job in message.jobs:
                    try:
                        await self._take(job, None)
                    except Exception as exc:  # one job's failure is that job's answer
                        await self.answer_failure(job, exc)
            finally:
                self._tokenizing.use_ahead({})
            return
        if isinstance(message, _Looked):
            await self._take(message.job, message.cached)
            return
        if isinstance(message, _Prepared):
            await self._take(message.job, None, message.images)
            return
        job = message
        try:
            # payload_too_large before any work (sequence-level items: from the request alone;
            # token-level ones: once tokenized, their size being their token count).
            check_reply_fits(job, None, self.model, self._replier.max_payload)
        except PoolingError as err:
            await self._refuse(job, err)
            return
        if self._images is not None and has_images(job.request):
            self._beside_mailbox(job, self._prepared, "poolwire-images")
        elif self._cache is None or self.model.towers is not None:
            # The cache keys texts; a multimodal model's requests are computed without it.
            if not self._to_tokenize(job):
                await self._take(job, None)
        else:
            self._beside_mailbox(job, self._looked_up, "poolwire-cache-lookup")

    def _beside_mailbox(self, job: Job, work, name: str) -> None:
        """Work a job needs before it is planned, which awaited in receive would hold up every
        request behind it: a result cache lookup is a round trip to the bucket (up to the
        cache's LOOKUP_TIMEOUT_S when its server is busy), images are read from the object
        store and decoded and preprocessed in a thread pool. It runs as a task beside the
        mailbox, and the job comes back to the mailbox as the message `work(job)` returns
        (`_Looked`, `_Prepared`), or None where `work` answered the job itself."""
        self._looking += 1
        task = asyncio.create_task(self._then_return(job, work), name=name)
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _then_return(self, job: Job, work) -> None:
        try:
            message = await work(job)
            if message is None:
                return
            try:
                self.tell(message)
            except MailboxFull:
                await self._refuse(job, _engine_full())
        finally:
            self._looking -= 1  # after the tell: the backlog never reads 0 in between

    async def _prepared(self, job: Job) -> "_Prepared | None":
        """The job's images fetched, decoded and preprocessed, or the job refused with the
        error naming its element, before it costs any model time."""
        try:
            with trace_of(job).stage("images"):
                return _Prepared(job, await self._images.prepare(job.request))
        except PoolingError as err:
            await self._refuse(job, err)
        except Exception as exc:  # nothing a client sent is lost without an answer
            log.exception("preparing the images of %s failed", job.request_id)
            await self._refuse(job, PoolingError(ErrorCode.INTERNAL,
                                                 f"preparing its images failed: {exc!r}"))
        return None

    async def _looked_up(self, job: Job) -> _Looked:
        try:
            with trace_of(job).stage("cache lookup"):
                cached = await self._cache.lookup(job.task, job.request)
        except Exception:  # the cache never fails a request: computed as if missed
            log.exception("the result cache lookup of %s failed; computing it", job.request_id)
            cached = None
        return _Looked(job, cached)

    async def _refuse(self, job: Job, err: PoolingError) -> None:
        await self._replier.send_error(job.reply, job.request_id, err, job.fmt, job.headers)
        trace_of(job).end(err.code)

    async def _take(self, job: Job, cached, images: dict | None = None) -> None:
        """Plan, admit and queue a job, `cached` being its result cache lookup (or None),
        `images` its prepared images (multimodal models)."""
        trace = trace_of(job)
        try:
            if cached is not None and cached.request is None:
                plan = cached.plan(None)  # every item hit: nothing to tokenize or compute
            else:
                with self.stats.timed("tokenize"), trace.stage("tokenize"):
                    plan = self._plan(job, cached.request if cached else job.request, images)
                    if cached is not None and plan.chunks is not None:
                        # The cache maps one sequence to one item; a chunked input is several
                        # sequences, so a request with one is computed whole, without it.
                        cached, plan = None, self._plan(job, job.request)
                if cached is not None:
                    plan = cached.plan(plan)
            check_reply_fits(job, plan, self.model, self._replier.max_payload)
            self._admit(plan)
        except PoolingError as err:
            await self._refuse(job, err)
            return
        trace.set(items=len(cached.keys) if cached else plan.n_items, tokens=plan.prompt_tokens)
        if plan.sequences:
            trace.open("queue wait")
        request = job.request
        style = ReplyStyle(job.fmt, request.encoding_format == "binary", request.embed_dtype)
        flight = InFlight(job, plan, style, remaining=len(plan.sequences))
        self._inflight.add(flight)
        if cached is not None:
            await self._cached_items(flight, cached)  # before any computed item can finish it
        # The group keeps batches to one forward kind and one adapter (PROTOCOL 1.3: requests
        # with different adapters never share a forward pass), so one modality on a multimodal
        # model (the only plans whose sequences differ in it).
        solo = f"#{job.request_id}" if job.solo else ""
        group = plan.spec.group + solo
        priority, deadline = request.priority, job.deadline
        for i, seq in enumerate(plan.sequences):
            if plan.forwards is not None:
                group = plan.spec_for(i).group + solo
            item = QueuedItem(tokens=len(seq), priority=priority, deadline=deadline,
                              group=group, payload=(flight, i))
            flight.queued.append(item)
            self._planner.add(item)
        self._note_arrival()
        self._wake.set()
        if job.deprecation is not None and self._publish_event is not None:
            if trace.headers:  # the event names the request's span too (PROTOCOL "Trace context")
                await self._publish_event(job.deprecation, trace.headers)
            else:
                await self._publish_event(job.deprecation)
        if flight.remaining == 0 and not flight.failed:  # every item came from the cache
            try:
                await self._finish(flight)
            except PoolingError as err:
                await self._fail(flight, err)

    async def _cached_items(self, flight: InFlight, cached) -> None:
        """The items the result cache had: kept for the one-message reply, or sent as item
        frames of a stream; what is computed is stored under `cache_keys`."""
        flight.item_of, flight.cache_keys = cached.misses, cached.keys
        hits = sorted((i, value) for i, (value, _) in cached.hits.items())
        try:
            if flight.keeps_outputs:
                flight.outputs.update(hits)
            elif flight.job.reply and hits:
                await self._send_items(flight, hits)
        except PoolingError as err:
            await self._fail(flight, err)

    def _plan(self, job: Job, request, images: dict | None = None) -> TaskPlan:
        return plan_task(job.task, request, self.model, self._tokenizing,
                         score_method=self.score_method, max_embed_len=self.limits.max_embed_len,
                         hybrid_weights=self.hybrid_weights, images=images)

    def _admit(self, plan: TaskPlan) -> None:
        tokens = sum(len(s) for s in plan.sequences)
        queued = self._planner.queued_tokens
        if queued and queued + tokens > self.limits.max_queued_tokens:
            rate = self._tokens_per_s or 1000.0
            raise PoolingError(ErrorCode.OVERLOADED,
                               f"the worker has {queued} tokens queued (limit "
                               f"{self.limits.max_queued_tokens}); retry later or add workers",
                               retry_after_ms=max(1, int(1000 * queued / rate)))

    async def on_failure(self, message: "Job | _Looked | _Prepared | _Tokenized",
                         exc: BaseException) -> None:
        if isinstance(message, _Tokenized):  # each job's failure was answered where it raised
            return
        job = message.job if isinstance(message, (_Looked, _Prepared)) else message
        await self._replier.send_error(job.reply, job.request_id,
                                       PoolingError(ErrorCode.INTERNAL, f"internal error: {exc!r}"),
                                       job.fmt, job.headers)
        trace_of(job).end(ErrorCode.INTERNAL)

    def _note_arrival(self) -> None:
        now = time.monotonic()
        if self._last_arrival:
            gap = now - self._last_arrival
            self._arrival_gap_s = gap if self._arrival_gap_s == float("inf") else \
                0.8 * self._arrival_gap_s + 0.2 * gap
        self._last_arrival = now

    def on_restart(self) -> None:
        self._wake.set()  # wake the batch loop in case work was queued before the crash

    # ---- the batch loop (supervised separately from the mailbox loop) ----

    async def batch_loop(self) -> None:
        """Plan batches and hand them to the forward thread, keeping at most one batch ready
        while another computes (TEI's channel of size one): the model never waits for the event
        loop to plan, pad or deliver, and results of batch N go out while N+1 computes."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_batch()
            await self._drop_expired()
            with self.stats.timed("plan"):
                batch = self._planner.next_batch()
            delivery = self._dispatch(loop, batch) if batch else None
            # Not kept while the loop waits: the last batch's requests are freed with their
            # replies (_complete holds the batch until then).
            del batch
            if delivery is not None:
                await delivery

    def _dispatch(self, loop, batch: list[QueuedItem]) -> "Coroutine | None":
        """Hand a planned batch to be computed (`_forward`), and deliver its results in a task
        of its own, after the batch before it; or, for a batch computed on the loop with no
        delivery before it still under way, hand back the delivery for the batch loop to
        await itself: one turn of the event loop less for a request that is alone."""
        seqs, specs = [], []
        real = longest = 0  # the items' token counts, which are their sequences' lengths
        for item in batch:
            flight, i = item.payload
            seqs.append(flight.plan.sequences[i])
            specs.append(flight.plan.spec_for(i))
            real += item.tokens
            longest = max(longest, item.tokens)
        shape = _Shape(len(seqs), real, len(seqs) * longest)
        self._in_forward += 1
        span = self._tracing.forward_started(
            [trace_of(item.payload[0].job) for item in batch], shape.sequences,
            shape.padded) if self._tracing.enabled else None
        future = self._forward(loop, seqs, specs, shape.padded)
        previous = self._last_delivery
        delivery = self._complete(batch, shape, future, previous, span)
        if future.done() and (previous is None or previous.done()):
            return delivery
        self._last_delivery = asyncio.create_task(delivery, name="poolwire-deliver")
        return None

    def _forward(self, loop, seqs, specs, padded: int) -> asyncio.Future:
        """The batch's result, as a future: computed in the forward thread, or at once on the
        loop where the engine is otherwise idle and the backend knows the batch to be quick
        (batch_planner.computes_on_loop). Either way one thread computes at a time: the forward
        thread has finished every batch it was handed when `_in_forward` reads 1 (this one)."""
        idle = self._in_forward == 1 and not len(self._planner) and not self._on_its_way()
        if not computes_on_loop(self.backend.seconds_alone(specs[0].forward, padded), idle):
            return loop.run_in_executor(self._forward_thread, run_batch, self.backend, seqs,
                                        specs)
        future = loop.create_future()
        try:
            future.set_result(run_batch(self.backend, seqs, specs))
        except Exception as exc:  # answered as a batch the forward thread failed
            future.set_exception(exc)
        return future

    async def _complete(self, batch, shape: "_Shape", future, previous: asyncio.Task | None,
                        span=None) -> None:
        try:
            result = await future
        except Exception as exc:
            result = exc
        finally:
            self._in_forward -= 1
            self._wake.set()
            if span is not None:
                self._tracing.forward_ended(span, result if isinstance(result, Exception) else None)
        if previous is not None and not previous.done():
            # Deliver in batch order: a request's frames stay ordered. (Only on a task not done
            # yet: a wait on a done one still costs a turn of the event loop.)
            await asyncio.wait([previous])
        try:
            if isinstance(result, Exception):
                raise result
            self._record(shape, result)
            # Each request's outputs of this batch together (in batch order): one hand-over a
            # request, not one a sequence (32 texts a request: bench/service_cost.py).
            per_flight: dict[InFlight, list] = {}
            for item, value in zip(batch, result.outputs):
                flight, i = item.payload
                per_flight.setdefault(flight, []).append((i, value))
            for flight, outputs in per_flight.items():
                await self._deliver(flight, outputs)
        except Exception as exc:  # nothing a client sent is lost without an answer
            log.exception("a batch of %d sequences failed", len(batch))
            for flight in {item.payload[0] for item in batch}:
                await self._fail(flight, PoolingError(ErrorCode.INTERNAL,
                                                      f"the batch failed: {exc!r}"))

    def _record(self, shape: "_Shape", result) -> None:
        st = self.stats
        st.add("forward", result.forward_s)
        st.add("pool", result.pool_s)
        st.batches += 1
        st.sequences += shape.sequences
        st.real_tokens += shape.real
        st.padded_tokens += shape.padded
        if self._metrics is not None:
            self._metrics.observe_batch(shape.sequences, shape.padded)
        rate = shape.real / max(result.forward_s + result.pool_s, 1e-6)
        self._tokens_per_s = rate if not self._tokens_per_s else 0.8 * self._tokens_per_s + 0.2 * rate

    def _full_batch_queued(self) -> bool:
        return (len(self._planner) >= self.limits.max_batch_size
                or self._planner.queued_tokens >= self.limits.max_batch_tokens)

    async def _wait_for_batch(self) -> None:
        """Return when the next batch should be planned:
        - a full batch's worth is queued (planned even while another batch computes, so it is
          ready the moment the model is free);
        - or the model is idle and work is queued: then wait at most max_wait_ms for more, but
          only while arrivals are dense enough that another is expected within that time (a
          lone request at low load runs at once instead of paying the wait), and only while
          more is on its way (in this actor's mailbox or upstream of it): once the requests
          a burst brought are all queued, waiting longer only idles the model (at 64 requests
          in flight it cost each batch the whole wait: bench/service_cost.py)."""
        while True:
            if self._full_batch_queued() and self._in_forward < 2:
                return
            if len(self._planner) and not self._in_forward:
                break
            self._wake.clear()
            await self._wake.wait()
        wait_s = self.limits.max_wait_ms / 1000.0
        if self._arrival_gap_s > wait_s:
            return
        until = time.monotonic() + wait_s
        while not self._full_batch_queued():
            if not self._on_its_way():
                return
            left = until - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except asyncio.TimeoutError:
                return

    def _on_its_way(self) -> int:
        """Requests received and not yet queued for a forward pass."""
        return super().backlog + self._looking + self._tokenize_jobs + self.upstream()

    async def _drop_expired(self) -> None:
        for item in self._planner.expired(time.monotonic()):
            flight = item.payload[0]
            if not flight.failed:
                await self._fail(flight, PoolingError(
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"deadline_ms {flight.job.request.deadline_ms} passed before the work was computed"))

    async def _fail(self, flight: InFlight, error: PoolingError) -> None:
        if flight.failed or flight.answered:
            return  # its error or its final frame already went out
        flight.failed = True
        for item in flight.queued:
            self._planner.discard(item)
        self._retire(flight)
        job = flight.job
        await self._replier.send_error(job.reply, job.request_id, error, job.fmt, job.headers)
        trace_of(job).end(error.code)

    def _retire(self, flight: InFlight) -> None:
        """A flight answered or failed leaves the engine, and lets go of its queued items: each
        points back at it (QueuedItem.payload), a cycle that only the garbage collector frees,
        so each request's job, plan and sequences (about a dozen objects) outlived its reply
        until a collection, and the collector's passes took 0.06 to 0.07 ms a text at 64
        requests in flight, 0.003 after (bench/service_cost.py's GC column, 2026-12-04)."""
        self._inflight.discard(flight)
        flight.queued = []

    async def _deliver(self, flight: InFlight, outputs: list[tuple[int, np.ndarray]]) -> None:
        """A request's outputs of one batch, as (sequence index, pooled value)."""
        if flight.failed:
            return
        job, plan = flight.job, flight.plan
        values = sequence_values(job.task, plan, outputs)
        flight.remaining -= len(values)
        if flight.cache_keys is not None:  # computed for the result cache's misses
            values = [(flight.item_of[i], value) for i, value in values]
            for i, value in values:
                self._cache.store(flight.cache_keys[i], value, plan.item_tokens[i])
        try:
            if flight.keeps_outputs:
                flight.outputs.update(values)
            elif job.reply:
                await self._send_items(flight, values)
            if flight.remaining == 0:
                await self._finish(flight)
        except PoolingError as err:
            await self._fail(flight, err)

    async def _send_items(self, flight: InFlight, items) -> None:
        job = flight.job
        token_level = job.task in TOKEN_LEVEL_TASKS
        for index, value in items:
            with self.stats.timed("encode"):
                bodies = item_frames(job.request_id, index, _item(value), flight.style,
                                     token_level, self._replier.max_payload, job.headers,
                                     flight.plan.extras(index, value))
            for body in bodies:
                await self._publish(job, body)

    async def _finish(self, flight: InFlight) -> None:
        job, plan = flight.job, flight.plan
        if not job.reply:
            flight.answered = True
            self._retire(flight)
            trace_of(job).end()
            return
        items = assemble_items(plan, flight.outputs, self.model)
        labels = self.model.labels if job.task in (Task.CLASSIFY, Task.TOKEN_CLASSIFY) else None
        warnings = list(job.warnings) or None
        if job.request.stream:
            await self._send_items(flight, items if flight.keeps_outputs else [])
            with self.stats.timed("encode"):
                body = done_frame(job.request_id, self.model.name, job.task.value,
                                  plan.prompt_tokens, flight.style, warnings, labels,
                                  images=plan.images)
        else:
            with self.stats.timed("encode"):
                rows = rows_from(len(items))
                if plan.has_extras:
                    wire = [wire_item(i, v, flight.style, extras=plan.extras(i, v),
                                      rows_from=rows) for i, v in items]
                else:  # the common case: no extras, so no call per item to find none
                    wire = [wire_item(i, v, flight.style, rows_from=rows) for i, v in items]
                room, room_headers = reply_room(job, self._replier.max_payload)
                body = one_reply(job.request_id, self.model.name, job.task.value, wire,
                                 plan.prompt_tokens, flight.style, room, room_headers,
                                 warnings, labels, images=plan.images)
        flight.answered = True
        self._retire(flight)
        await self._publish(job, body)
        trace_of(job).end()
        if self._metrics is not None:
            # The child per task is kept: labels() locks and validates on every call.
            child = self._request_seconds.get(job.task)
            if child is None:
                child = self._request_seconds[job.task] = \
                    self._metrics.request_seconds.labels(job.task.value)
            child.observe(time.monotonic() - job.received_at)

    async def _publish(self, job: Job, body: bytes) -> None:
        with self.stats.timed("publish"), trace_of(job).stage("publish"):
            await self._replier.send(job.reply, body, job.headers)

    async def close(self) -> None:
        if self._tokenize_task is not None:
            self._tokenize_task.cancel()
            await asyncio.gather(self._tokenize_task, return_exceptions=True)
        for task in list(self._lookups):
            task.cancel()
        await asyncio.gather(*self._lookups, return_exceptions=True)
        if self._last_delivery is not None:
            self._last_delivery.cancel()
            await asyncio.gather(self._last_delivery, return_exceptions=True)
        self._forward_thread.shutdown(wait=True, cancel_futures=True)
        self._tokenize_thread.shutdown(wait=True, cancel_futures=True)
        if self._images is not None:
            self._images.close()
