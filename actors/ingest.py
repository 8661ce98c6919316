"""The IngestActor: takes requests off `P.*` in the queue group, decodes them and hands them to
the validator. Its NATS callback only puts the message in the mailbox and returns: nats-py runs
one callback at a time per subscription, so a callback that awaited its result would serialise
every request and no batch would ever form."""

import logging
import os
import random
import time

from poolwire.actors.messages import Incoming
from poolwire.actors.metrics import WorkerMetrics
from poolwire.actors.replier import Replier
from poolwire.actors.runtime import Actor, MailboxFull
from poolwire.actors.stats import StageStats
from poolwire.actors.tracing import OFF, Tracing
from poolwire.schemas.codec import decode, sniff_format
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.requests import request_id_of
from poolwire.schemas.tasks import parse_task

log = logging.getLogger(__name__)


# Request ids name requests, they guard nothing: a generator seeded once from the OS, instead of
# os.urandom per request, which releases the GIL for its system call and so, beside a forward
# thread running Python, waited up to a switch interval to get it back (55 us a call against
# 1 us measured beside a busy thread, 2026-12-03).
_ids = random.Random(os.urandom(32))


def new_request_id() -> str:
    """32 random hex digits, as uuid4().hex gives."""
    return f"{_ids.getrandbits(128):032x}"


class IngestActor(Actor):
    name = "ingest"

    def __init__(self, nc, prefix: str, queue: str, validator: Actor, replier: Replier,
                 stats: StageStats | None = None, mailbox_size: int = 65536,
                 metrics: WorkerMetrics | None = None, tracing: Tracing = OFF) -> None:
        super().__init__(mailbox_size)
        self.stats = stats or StageStats()
        self._tracing = tracing
        self._metrics = metrics
        self._nc = nc
        self.prefix = prefix
        self.queue = queue
        self._validator = validator
        self._replier = replier
        self._sub = None
        self.received = 0
        # The counter's child per subject task name: prometheus_client's labels() locks and
        # validates on every call, a visible part of a request's cost at tens of microseconds.
        self._counted: dict[str, object] = {}

    async def subscribe(self) -> None:
        self._sub = await self._nc.subscribe(f"{self.prefix}.*", queue=self.queue, cb=self._on_message)

    async def _on_message(self, msg) -> None:
        self.received += 1
        try:
            # Stamped here: deadline_ms counts from when the worker received the request, not
            # from when the ingest got round to it.
            self.tell((msg, time.monotonic()))
        except MailboxFull:
            await self._overloaded(msg.reply, new_request_id(), sniff_format(msg.data))

    async def _overloaded(self, reply, request_id, fmt, retry_after_ms: int = 100) -> None:
        await self._replier.send_error(reply, request_id, PoolingError(
            ErrorCode.OVERLOADED, "the worker's intake queue is full; retry later",
            retry_after_ms=retry_after_ms), fmt)

    async def stop_intake(self) -> None:
        """Unsubscribe after the client library has handed over what it already holds."""
        if self._sub is not None:
            await self._sub.drain()
            self._sub = None

    async def receive(self, message) -> None:
        msg, received_at = message
        task_name = msg.subject[len(self.prefix) + 1:]
        if self._metrics is not None:
            counter = self._counted.get(task_name)
            if counter is None:
                # Any name may arrive on P.*: only task names become label values (and keys
                # here, so that the cache stays as small as the set of tasks).
                label = task_name if parse_task(task_name) else "unknown"
                counter = self._metrics.requests.labels(label)
                if label != "unknown":
                    self._counted[task_name] = counter
            counter.inc()
        trace = self._tracing.begin(msg.headers, msg.subject, received_at)
        try:
            with self.stats.timed("decode"), trace.stage("decode"):
                body, fmt = decode(msg.data)
        except PoolingError as err:
            await self._replier.send_error(msg.reply, new_request_id(), err, sniff_format(msg.data),
                                           trace.headers)
            trace.end(err.code)
            return
        incoming = Incoming(reply=msg.reply, task_name=task_name, body=body, fmt=fmt,
                            request_id=request_id_of(body) or new_request_id(),
                            received_at=received_at, trace=trace)
        try:
            self._validator.tell(incoming)
        except MailboxFull:
            await self._overloaded(msg.reply, incoming.request_id, fmt)
            trace.end(ErrorCode.OVERLOADED)

    async def on_failure(self, message, exc: BaseException) -> None:
        msg, _ = message
        await self._replier.send_error(msg.reply, new_request_id(),
                                       PoolingError(ErrorCode.INTERNAL, f"internal error: {exc!r}"),
                                       sniff_format(msg.data))
