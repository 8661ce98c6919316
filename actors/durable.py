"""Durable intake (PROTOCOL.md "Durable mode"): one more ingest actor. It pulls messages from a
JetStream durable consumer, only as many as admission allows, and hands them to the same
validator and engine as request/reply traffic, under a reply subject the Replier routes back
here. So it learns each reply frame, forwards it, and acks the message only once the final frame
went out; a worker that dies before that leaves the message to be delivered again.

`JetStreamIntake` is what durable jobs (`DurableJobs`, `P.jobs.<task>`) and pipelines
(actors/pipeline.py) share: pulling, in-progress acks, retries, dead letters, drain. The
engine never learns where a request came from."""

import asyncio
import datetime
import itertools
import logging
import re
import secrets
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

from nats.js.api import (AckPolicy, ConsumerConfig, KeyValueConfig, RetentionPolicy, StorageType,
                         StreamConfig)
from nats.js.client import JetStreamContext
from nats.js.errors import (BucketNotFoundError, KeyNotFoundError, NotFoundError,
                            ServiceUnavailableError)

from poolwire.actors.durable_policy import (POISON_SPAN_S, Outcome, compute_alone, publishable,
                                            counts_as_failure, dead_letter, exhausted, on_error,
                                            pull_size, retry_delay, store_retry_delay)
from poolwire.actors.ingest import new_request_id
from poolwire.actors.messages import Incoming
from poolwire.actors.runtime import Actor, MailboxFull
from poolwire.actors.tracing import OFF, Tracing
from poolwire.schemas.codec import WireFormat, decode, sniff_format
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.requests import request_id_of
from poolwire.schemas.sanity import MAX_REQUEST_ID_CHARS

log = logging.getLogger(__name__)
T = TypeVar("T")

REPLY_TO_HEADER = "Pooling-Reply-To"
MSG_ID_HEADER = "Nats-Msg-Id"
DEAD_MSG_ID_HEADER = "Pooling-Job-Msg-Id"  # a dead letter's copy of its job's Nats-Msg-Id
JOBS_DUPLICATE_WINDOW_S = 120.0          # the server's default, stated so it is not a surprise
DEAD_MAX_AGE_S = 30 * 24 * 3600          # dead letters are kept a month for inspection
DEAD_MAX_BYTES = 256 * 1024 * 1024
PUBLISH_TIMEOUT_S = 5.0                  # a PubAck through a leader election (NATS.md 7: ~4.3 s)
FAILURES_MAX_AGE_S = 7 * 24 * 3600       # a document's failure count is forgotten after a week
LATE_DELIVERY_MARGIN_S = 0.5             # a pull request's expiry, as the server's clock may see it


def stream_name(kind: str, prefix: str) -> str:
    return f"POOLWIRE_{kind}_" + re.sub(r"[^A-Za-z0-9_-]", "_", prefix.upper())


def consumer_name(*parts: str) -> str:
    """A durable name from free text: JetStream refuses `.`, `*`, `>` and white space in it."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", "_".join(("poolwire",) + parts))


class DurableNames(NamedTuple):
    stream: str
    consumer: str


def durable_names(prefix: str, queue: str, pipeline_stream: str | None = None) -> DurableNames:
    """The stream and durable consumer a worker of `prefix` and queue group `queue` pulls from:
    what an autoscaler (KEDA's nats-jetstream trigger, deploy/k8s) and `poolwire lag` watch.
    Durable jobs: the work-queue stream poolwire creates for P.jobs.> (an operator's stream
    that already captures P.jobs.> is used instead, under its own name), one consumer per
    queue group. A pipeline: the operator's stream, with a consumer per stream and queue."""
    if pipeline_stream is not None:
        return DurableNames(pipeline_stream, consumer_name("pipeline", pipeline_stream, queue))
    return DurableNames(stream_name("JOBS", prefix), consumer_name(queue))


JS_CLUSTER_NOT_AVAILABLE = 10008        # nats-server's "JetStream system temporarily unavailable"


def jetstream_busy(exc: BaseException) -> bool:
    """Whether a JetStream API call failed because JetStream is electing a leader (a node
    restarted, a cluster forming or short of quorum): the request times out, or the server
    answers 503 with error 10008. It answers once a leader is elected, seconds later. Other
    503s are not: nats-py raises a bare ServiceUnavailableError for no responders (a server
    without JetStream), and an account without JetStream is 503 with error 10039. Those, and
    limits or a conflicting consumer, stay until an operator acts."""
    return isinstance(exc, asyncio.TimeoutError) or (
        isinstance(exc, ServiceUnavailableError) and exc.err_code == JS_CLUSTER_NOT_AVAILABLE)


# How long a starting worker waits for JetStream to elect the leaders its set-up needs. An
# election after a node restart took 8 to 17 s here (RELIABILITY.md); a cluster started
# together, or short of a majority until a node comes back, takes longer.
ELECTION_WAIT_S = 120.0


async def through_elections(what: str, call: Callable[[], Awaitable[T]],
                            limit_s: float = ELECTION_WAIT_S) -> T:
    """`await call()`, run again while JetStream is electing a leader (`jetstream_busy`), for
    up to `limit_s`: a worker started beside a restarting node, or with its cluster, waits for
    it instead of failing. Each wait is logged; other failures are raised at once. `call` must
    be safe to run again after it failed part way."""
    began, attempt = time.monotonic(), 0
    while True:
        attempt += 1
        try:
            result = await call()
            if attempt > 1:
                log.info("%s: done after %d attempts in %.1f s", what, attempt,
                         time.monotonic() - began)
            return result
        except Exception as exc:
            delay = store_retry_delay(attempt, time.monotonic() - began, limit_s)
            if not jetstream_busy(exc):
                raise
            if delay is None:
                raise RuntimeError(
                    f"{what}: JetStream elected no leader for {limit_s:.0f} s ({exc!r}); "
                    f"check that a majority of the cluster's nodes is up and routed") from exc
            log.warning("%s: JetStream did not answer (%r), as happens while it elects a "
                        "leader; attempt %d, trying again in %.1f s (giving up after %.0f s)",
                        what, exc, attempt, delay, limit_s)
            await asyncio.sleep(delay)


def dead_subject(prefix: str, task: str) -> str:
    return f"{prefix}.dead.{task}"


async def ensure_stream(js, captures: str, config: StreamConfig) -> str:
    """The stream that captures `captures`: an existing one (an operator's, or another
    worker's) is used as it is; else ours is created. Two workers starting at once may both
    create it: the loser finds the winner's."""
    try:
        existing = await js.find_stream_name_by_subject(captures)
    except NotFoundError:
        existing = None
    if existing:
        return existing
    try:
        await js.add_stream(config)
    except Exception as exc:
        if jetstream_busy(exc):
            raise  # the caller waits for the election (through_elections)
        try:
            return await js.find_stream_name_by_subject(captures)
        except NotFoundError:
            raise RuntimeError(f"could not create stream {config.name} for {captures} ({exc}); "
                               f"check the server's JetStream limits, or create a stream that "
                               f"captures {captures} yourself") from exc
    log.info("created stream %s for %s", config.name, captures)
    return config.name


async def ensure_failures_bucket(js, prefix: str, replicas: int):
    """The KV bucket of failure counts (durable_policy.on_error), one key per message
    (`<stream>.<sequence>`), shared by every worker of the prefix so that a document failing
    on several workers is counted once per failure."""
    bucket = stream_name("FAILURES", prefix)
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        pass  # none yet: created below
    try:
        return await js.create_key_value(KeyValueConfig(
            bucket=bucket, history=1, ttl=FAILURES_MAX_AGE_S, storage=StorageType.FILE,
            replicas=replicas))
    except Exception as exc:
        if jetstream_busy(exc):
            raise  # the caller waits for the election (through_elections)
        return await js.key_value(bucket)  # another worker created it meanwhile


async def ensure_dead_stream(js, prefix: str, replicas: int) -> str:
    return await ensure_stream(js, f"{prefix}.dead.>", StreamConfig(
        name=stream_name("DEAD", prefix), subjects=[f"{prefix}.dead.>"],
        storage=StorageType.FILE, max_age=DEAD_MAX_AGE_S, max_bytes=DEAD_MAX_BYTES,
        num_replicas=replicas))


@dataclass(frozen=True)
class IntakeLimits:
    max_deliveries: int = 5          # deliveries of a failing job before it is dead-lettered
    ack_wait_s: float = 30.0         # redelivery after a worker went silent on a message
    capacity: int = 256              # messages this worker holds unacked at once
    batch: int = 64                  # messages per pull
    retry_base_s: float = 0.5        # nak delay of a failed job, times its delivery count
    poison_span_s: float = POISON_SPAN_S  # durable_policy.exhausted
    max_queued_tokens: int = 262144  # the engine's admission bound


@dataclass(eq=False)
class Tracked:
    """A message taken from JetStream and not yet settled (acked, naked or terminated)."""

    msg: Any
    local: str            # the in-process reply subject the Replier routes to this intake
    request_id: str
    task_name: str
    fmt: WireFormat
    streamed: bool
    deliveries: int
    context: Any = None   # the subclass's own: a reply subject, a pipeline document's place


def _is_done(body: bytes, fmt: WireFormat) -> bool:
    frame, _ = decode(body)
    return bool(frame.get("done"))


class JetStreamIntake(Actor):
    """The mailbox takes the frames the Replier routes here (from the validator's and the
    engine's tasks), so publishing results and acking never hold up the engine."""

    name = "jetstream-intake"

    def __init__(self, nc, prefix: str, validator: Actor, replier, engine,
                 limits: IntakeLimits, replicas: int = 1, mailbox_size: int = 1 << 16,
                 tracing: Tracing = OFF) -> None:
        super().__init__(mailbox_size)
        self._tracing = tracing
        self._nc = nc
        self._js = nc.jetstream()
        self.prefix = prefix
        self._validator = validator
        self._replier = replier
        self._engine = engine
        self.limits = limits
        self.replicas = replicas
        self._psub = None
        self._flights: dict[str, Tracked] = {}
        # Flights whose answer is computed but not yet stored (a stream without a leader):
        # still held, with in-progress acks, while a task retries the store.
        self._holding: dict[int, Tracked] = {}
        self._tasks: set[asyncio.Task] = set()
        self._failures = None          # the KV bucket of failure counts
        self._by_seq: dict[int, str] = {}  # stream sequence -> its flight's local subject
        self._ids = itertools.count()
        self._room = asyncio.Event()   # set when a flight settles: there may be room to pull
        self._stopping = False
        self._pulling_done = asyncio.Event()
        self._fetch_timeout_s = max(0.05, min(1.0, limits.ack_wait_s / 2))
        self._pull_expires = 0.0       # when the server drops the last pull request (monotonic)
        self.pending = 0               # messages left for the consumer, as JetStream last said
        self.redelivered = 0
        self.dead_lettered = 0
        self.retried = 0
        self.completed = 0
        self.released = 0              # naked unstarted while draining (tests count them)

    # ---- set-up (subclasses create their stream and consumer) ----

    @abstractmethod
    async def bind(self) -> None:
        """Make sure the stream and the durable consumer exist, and pull-subscribe to it."""

    async def _bind_consumer(self, stream: str, durable: str, filter_subject: str) -> None:
        # max_deliver unbounded: the worker enforces the bound itself (durable_policy), so that
        # a job past it is dead-lettered and terminated rather than left in the stream unseen.
        # Every step before the subscription is idempotent, so a bind that JetStream's election
        # interrupted is simply run again (through_elections).
        await self._js.add_consumer(stream, ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=self.limits.ack_wait_s,
            max_deliver=-1, filter_subject=filter_subject, max_ack_pending=10000))
        self._failures = await ensure_failures_bucket(self._js, self.prefix, self.replicas)
        self._psub = await self._js.pull_subscribe_bind(durable=durable, stream=stream)
        self.stream, self.durable = stream, durable

    # ---- what subclasses define ----

    @abstractmethod
    def parse(self, msg, local: str, deliveries: int) -> tuple[Tracked, Incoming | PoolingError]:
        """The message as a request for the validator, or the error that answers it."""

    async def forward(self, t: Tracked, body: bytes, headers: dict | None) -> None:
        """A streamed item frame."""

    @abstractmethod
    async def deliver(self, t: Tracked, body: bytes, headers: dict | None) -> bool:
        """The final frame; False when it could not be stored (the message is retried)."""

    @abstractmethod
    async def deliver_error(self, t: Tracked, error: PoolingError, headers: dict | None) -> bool:
        """The error that answers the message; False when it could not be stored."""

    # ---- figures for $SRV.STATS ----

    def counters(self) -> dict[str, int]:
        return {"pending": self.pending, "in_progress": self.held,
                "redelivered": self.redelivered, "dead_lettered": self.dead_lettered,
                "retried": self.retried, "completed": self.completed}

    @property
    def backlog(self) -> int:
        return super().backlog + len(self._flights) + len(self._holding)

    @property
    def held(self) -> int:
        return len(self._flights) + len(self._holding)

    # ---- pulling ----

    async def pull_loop(self) -> None:
        fetch_timeout = self._fetch_timeout_s
        failures = 0
        while not self._stopping:
            n = pull_size(self.held, self.limits.capacity, self._engine.queued_tokens,
                          self.limits.max_queued_tokens, self.limits.batch)
            if n == 0:
                # Flights settling set the event; the engine's queue shrinks without one, so
                # look again after a short while as well.
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                self._pull_expires = time.monotonic() + fetch_timeout
                msgs = await self._psub.fetch(n, timeout=fetch_timeout)
                failures = 0
            except asyncio.TimeoutError:  # nats.errors.TimeoutError is one: nothing to do
                continue
            except Exception as exc:  # the server is away (node lost, leader election)
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    log.warning("%s: pulling from %s failed (%r); retrying", self.name,
                                self.durable, exc)
                await asyncio.sleep(min(1.0, 0.05 * failures))  # back off while it is away
                continue
            for msg in msgs:
                await self._take_one(msg)
        self._pulling_done.set()

    async def _take_one(self, msg) -> None:
        """`_take`, where a message whose handling fails is delivered again, and the loop
        goes on to the rest of its batch instead of ending with it."""
        try:
            await self._take(msg)
        except Exception:
            log.exception("%s: taking a message failed; it is delivered again", self.name)
            await self._settle(msg.nak(delay=self.limits.retry_base_s))

    async def progress_loop(self) -> None:
        """In-progress acks for work that takes longer than ack_wait (a long queue, a slow
        model), so JetStream does not hand it to another worker meanwhile."""
        while True:
            await asyncio.sleep(self.limits.ack_wait_s / 3)
            for t in [*self._flights.values(), *self._holding.values()]:
                await self._settle(t.msg.in_progress())

    async def _take(self, msg) -> None:
        meta = msg.metadata
        deliveries = meta.num_delivered
        self.pending = meta.num_pending
        if deliveries > 1:
            self.redelivered += 1
        if self._stopping:  # not started: left to another worker at once
            self.released += 1
            await self._settle(msg.nak())
            return
        running = self._flights.get(self._by_seq.get(meta.sequence.stream, ""))
        if running is not None:
            # Delivered again while this worker still computes it (its in-progress acks came
            # late, e.g. a stalled event loop): settle the newest delivery, compute it once.
            running.msg, running.deliveries = msg, deliveries
            return
        for held in self._holding.values():
            if held.msg.metadata.sequence.stream == meta.sequence.stream:
                held.msg, held.deliveries = msg, deliveries  # its answer is being stored
                return
        # Unguessable: the Replier hands frames for this subject to this intake, whoever asked
        # for them, so a request from outside that named the subject of a job in flight as its
        # reply would take that job's answer (an audit did, with a counter in its place).
        local = f"_POOLWIRE.{self.name}.{secrets.token_hex(16)}"
        trace = self._tracing.begin(msg.headers, msg.subject, time.monotonic(), self.name)
        with trace.stage("decode"):
            tracked, request = self.parse(msg, local, deliveries)
        if isinstance(request, PoolingError):
            await self._reject(tracked, request, trace.headers)
            trace.end(request.code)
            return
        request = replace(request, trace=trace)
        age_s = (datetime.datetime.now(datetime.timezone.utc) - meta.timestamp).total_seconds()
        if exhausted(deliveries, age_s, self.limits.max_deliveries, self.limits.poison_span_s):
            await self._dead_letter(tracked, PoolingError(
                ErrorCode.INTERNAL,
                f"job {tracked.request_id} was delivered {deliveries} times over {age_s:.0f} s "
                f"without an answer (the workers that took it stopped before answering); it is "
                f"kept in {dead_subject(self.prefix, tracked.task_name)}"), trace.headers)
            trace.end(ErrorCode.INTERNAL)
            return
        self._flights[local] = tracked
        self._by_seq[meta.sequence.stream] = local
        self._replier.route(local, self)
        try:
            self._validator.tell(request)
        except MailboxFull:
            self._finish(tracked)
            trace.end(ErrorCode.OVERLOADED)
            await self._settle(msg.nak(delay=self.limits.retry_base_s))

    # ---- frames routed here by the Replier (called from other actors' tasks) ----

    async def frame(self, subject: str, body: bytes, headers: dict | None) -> None:
        self.tell(("frame", subject, body, headers))

    async def error(self, subject: str, request_id: str, error: PoolingError,
                    fmt: WireFormat, headers: dict | None) -> None:
        self.tell(("error", subject, error, headers))

    async def receive(self, message) -> None:
        kind, local, payload, headers = message
        t = self._flights.get(local)
        if t is None:
            return  # settled already
        if kind == "frame":
            if t.streamed and not _is_done(payload, t.fmt):
                await self.forward(t, payload, headers)
                return
            self._finish(t)

            async def acked() -> None:
                self.completed += 1
                await self._settle(t.msg.ack())
            await self._until_stored(t, lambda: self.deliver(t, payload, headers), acked)
            return
        error: PoolingError = payload
        self._finish(t)
        failures = await self._count_failure(t) if counts_as_failure(error.code) else None
        outcome = on_error(error.code, failures, self.limits.max_deliveries)
        if outcome is Outcome.RETRY:
            self.retried += 1
            log.warning("%s: job %s failed on delivery %d (%s failures of %d: %s); it is "
                        "delivered again", self.name, t.request_id, t.deliveries,
                        "uncounted" if failures is None else failures,
                        self.limits.max_deliveries, error.message)
            await self._settle(t.msg.nak(delay=retry_delay(t.deliveries, self.limits.retry_base_s)))
        elif outcome is Outcome.REJECT:
            await self._reject(t, error, headers)
        else:
            await self._dead_letter(t, error, headers)

    async def on_failure(self, message, exc: BaseException) -> None:
        t = self._flights.get(message[1])
        if t is not None:  # nothing settled it: let JetStream deliver it again
            self._finish(t)
            await self._settle(t.msg.nak(delay=self.limits.retry_base_s))

    async def _count_failure(self, t: Tracked) -> int | None:
        """Records one more failed computation of t's message, where every worker sees it;
        the count with it, or None when the bucket cannot be reached (then it is not counted:
        the document is delivered again, and the bucket is back after the election)."""
        meta = t.msg.metadata
        key = f"{meta.stream}.{meta.sequence.stream}"
        try:
            try:
                count = int((await self._failures.get(key)).value or b"0") + 1
            except KeyNotFoundError:
                count = 1
            await self._failures.put(key, str(count).encode())
            return count
        except Exception as exc:
            log.warning("%s: could not record a failure of %s in %s (%r); not counted",
                        self.name, t.request_id, stream_name("FAILURES", self.prefix), exc)
            return None

    # ---- settling ----

    async def _until_stored(self, t: Tracked, store, stored) -> None:
        """`await store()` until it returns True, then `await stored()` (the ack or term). A
        store that fails is the infrastructure's fault (a stream without a leader, a lost
        connection): retried here, the message held with in-progress acks, for longer than a
        leader election (durable_policy.store_retry_delay), not naked at once, so it costs the
        document no delivery. Past that, or when draining, it is naked: delivered again later."""
        if await store():
            await stored()
            return
        key = next(self._ids)
        self._holding[key] = t
        task = asyncio.create_task(self._keep_storing(key, t, store, stored))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep_storing(self, key: int, t: Tracked, store, stored) -> None:
        began = time.monotonic()
        try:
            for attempt in itertools.count(1):
                delay = store_retry_delay(attempt, time.monotonic() - began)
                if delay is None or self._stopping:
                    log.warning("%s: could not store the answer to %s for %.0f s; it is "
                                "delivered again", self.name, t.request_id,
                                time.monotonic() - began)
                    self.retried += 1
                    await self._settle(t.msg.nak(delay=self.limits.retry_base_s))
                    return
                await asyncio.sleep(delay)
                if await store():
                    await stored()
                    return
        finally:
            self._holding.pop(key, None)
            self._room.set()

    def _finish(self, t: Tracked) -> None:
        self._flights.pop(t.local, None)
        seq = t.msg.metadata.sequence.stream
        if self._by_seq.get(seq) == t.local:
            del self._by_seq[seq]
        self._replier.unroute(t.local)
        self._room.set()

    async def _settle(self, ack) -> None:
        """An ack, nak or term that cannot be sent is not an error: JetStream delivers the
        message again after ack_wait, and clients drop the repeated frames."""
        try:
            await ack
        except Exception as exc:
            log.info("%s: could not settle a message (%r); it will be delivered again",
                     self.name, exc)

    async def _reject(self, t: Tracked, error: PoolingError, headers: dict | None) -> None:
        await self._until_stored(t, lambda: self.deliver_error(t, error, headers),
                                 lambda: self._settle(t.msg.term()))

    async def _dead_letter(self, t: Tracked, error: PoolingError, headers: dict | None) -> None:
        record = {"request_id": t.request_id, "task": t.task_name, "deliveries": t.deliveries,
                  "error": error.to_wire()}
        # The job's own headers go along; expectations of the original publish would refuse
        # the dead letter, and its Nats-Msg-Id would have the dead-letter stream drop a second
        # message that reused an id (a client's request_id, outside the jobs stream's window)
        # as a duplicate: the dead letter is deduplicated by the message's own place instead,
        # and the job's id kept under DEAD_MSG_ID_HEADER (an audit lost one that way).
        meta = t.msg.metadata
        kept = {k: v for k, v in (t.msg.headers or {}).items()
                if not k.startswith("Nats-Expected") and k != MSG_ID_HEADER}
        if MSG_ID_HEADER in (t.msg.headers or {}):
            kept[DEAD_MSG_ID_HEADER] = t.msg.headers[MSG_ID_HEADER]
        kept[MSG_ID_HEADER] = f"dead:{meta.stream}:{meta.sequence.stream}"
        subject = dead_subject(self.prefix, t.task_name)
        body, kept = dead_letter(record, bytes(t.msg.data), kept or None, self._nc.max_payload,
                                 meta.stream, meta.sequence.stream)

        async def store() -> bool:
            try:
                await self._js.publish(subject, body, headers=kept, timeout=PUBLISH_TIMEOUT_S)
                return True
            except Exception as exc:  # not stored: retried, never lost
                log.error("%s: could not dead-letter job %s to %s (%r); retrying", self.name,
                          t.request_id, subject, exc)
                return False

        async def stored() -> None:
            self.dead_lettered += 1
            log.error("%s: job %s failed on %d deliveries (%s); dead-lettered to %s", self.name,
                      t.request_id, t.deliveries, error.message, subject)
            await self._reject(t, error, headers)

        await self._until_stored(t, store, stored)

    # ---- drain ----

    async def stop_intake(self) -> None:
        """Pull no more; what was pulled but not started is naked (by the pull loop, and by
        `_release_late` for what the server delivered after the last fetch returned), what was
        started is answered (the worker waits for `backlog`)."""
        self._stopping = True
        if self._psub is None:
            return
        try:  # the loop ends within one fetch (at most a second) and the takes of its batch
            await asyncio.wait_for(self._pulling_done.wait(), self._fetch_timeout_s + 10.0)
        except asyncio.TimeoutError:
            log.warning("%s: the pull loop did not stop in time", self.name)
        await self._release_late()
        try:
            await self._psub.unsubscribe()
        except Exception as exc:
            log.info("%s: could not unsubscribe (%r)", self.name, exc)

    async def _release_late(self) -> None:
        """A pull request stays on the server until it expires, and a fetch that returned early
        (enough messages, or its deadline passed on a stalled event loop) leaves the rest of
        its batch to arrive in the subscription's queue, where the next fetch takes them.
        Draining, there is no next fetch: unsubscribing would drop them, and they would wait
        out ack_wait unseen (a drain in CI once left 32 jobs unanswered for over 90 s, and this
        is how a drain can). So read the queue until the last request has expired, and hand
        each message back (`_take` naks it while stopping). nats-py has no public way to read
        that queue without sending a new pull request (fetch always sends one), hence its
        subscription's own `next_msg`."""
        sub = self._psub._sub
        while True:
            left = self._pull_expires + LATE_DELIVERY_MARGIN_S - time.monotonic()
            if left <= 0 and self._psub.pending_msgs == 0:
                return
            try:
                msg = await sub.next_msg(timeout=max(left, 0.01))
            except asyncio.TimeoutError:  # nats.errors.TimeoutError is one
                continue
            except Exception as exc:  # the connection is closing: they come back after ack_wait
                log.info("%s: could not read late deliveries (%r)", self.name, exc)
                return
            if JetStreamContext.is_status_msg(msg):
                continue  # the end of a pull request (404, 408), not a message
            await self._take_one(msg)


class DurableJobs(JetStreamIntake):
    """`P.jobs.<task>` through a work-queue stream and one durable consumer per queue group."""

    name = "durable"

    def __init__(self, *args, queue: str = "poolwire", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queue = queue
        self._root = f"{self.prefix}.jobs."

    async def bind(self) -> None:
        captures = f"{self.prefix}.jobs.>"
        names = durable_names(self.prefix, self.queue)
        stream = await ensure_stream(self._js, captures, StreamConfig(
            name=names.stream, subjects=[captures],
            retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
            duplicate_window=JOBS_DUPLICATE_WINDOW_S, num_replicas=self.replicas))
        await ensure_dead_stream(self._js, self.prefix, self.replicas)
        try:
            await self._bind_consumer(stream, names.consumer, captures)
        except Exception as exc:
            if jetstream_busy(exc):
                raise  # not a conflict: the caller waits for the election (through_elections)
            raise RuntimeError(
                f"could not create the durable consumer {names.consumer!r} on stream "
                f"{stream!r} ({exc}); a work-queue stream allows one consumer per subject, so "
                f"every durable worker of prefix {self.prefix!r} must use the same --queue") from exc
        log.info("durable jobs: pulling %s from stream %s, consumer %s", captures, stream,
                 self.durable)

    def parse(self, msg, local: str, deliveries: int):
        headers = msg.headers or {}
        meta = msg.metadata
        task_name = msg.subject[len(self._root):]
        # Stable across deliveries even when the client sent no id: the stream position.
        msg_id = headers.get(MSG_ID_HEADER, "")
        fallback = (msg_id if 0 < len(msg_id) <= MAX_REQUEST_ID_CHARS
                    else f"{meta.stream}:{meta.sequence.stream}")
        reply_to = headers.get(REPLY_TO_HEADER, "")
        if reply_to and not publishable(reply_to):
            # Refused before any work, and terminated: no reply can reach it (counted as
            # unanswerable, with the job's id in the log).
            return Tracked(msg, local, fallback, task_name, sniff_format(msg.data), False,
                           deliveries, ""), PoolingError(
                ErrorCode.INVALID_REQUEST, f"{REPLY_TO_HEADER} {reply_to[:256]!r} is not a "
                f"subject a reply can be published to")
        try:
            body, fmt = decode(msg.data)
        except PoolingError as err:
            return Tracked(msg, local, fallback, task_name, sniff_format(msg.data), False,
                           deliveries, reply_to), err
        request_id = request_id_of(body) or fallback or new_request_id()
        t = Tracked(msg, local, request_id, task_name, fmt, body.get("stream") is True,
                    deliveries, reply_to)
        return t, Incoming(reply=local, task_name=task_name, body=body, fmt=fmt,
                           request_id=request_id, received_at=time.monotonic(),
                           solo=compute_alone(deliveries, self.limits.max_deliveries))

    async def forward(self, t: Tracked, body: bytes, headers: dict | None) -> None:
        if t.context:
            await self._nc.publish(t.context, body, headers=headers or None)

    async def deliver(self, t: Tracked, body: bytes, headers: dict | None) -> bool:
        await self.forward(t, body, headers)
        return True

    async def deliver_error(self, t: Tracked, error: PoolingError, headers: dict | None) -> bool:
        # Through the Replier, as request/reply errors: the frame fits max_payload with every
        # header, is counted once it is published (a job without Pooling-Reply-To counts as
        # unanswerable), and a transient error that is retried never got here. A job whose
        # term was lost is delivered again and its error published (and counted) again: its
        # client receives that frame twice and drops one by request_id.
        await self._replier.send_error(t.context, t.request_id, error, t.fmt, headers)
        return True
