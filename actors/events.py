"""Publishing deprecation events, and the JetStream stream that keeps them for audit consumers
that were not listening (PROTOCOL.md "Deprecation event")."""

import logging

import msgpack

from poolwire.actors.durable import jetstream_busy, through_elections
from poolwire.actors.metrics import WorkerMetrics
from poolwire.schemas.events import DeprecationEvent

log = logging.getLogger(__name__)

EVENTS_MAX_AGE_S = 7 * 24 * 3600
EVENTS_MAX_BYTES = 64 * 1024 * 1024


def events_subject(prefix: str) -> str:
    return f"{prefix}.events.deprecation"


def events_stream_name(prefix: str) -> str:
    return "POOLWIRE_EVENTS_" + prefix.upper().replace(".", "_")


async def ensure_events_stream(nc, prefix: str) -> str | None:
    """Reuse any stream that already captures `P.events.>`, else create ours. Returns the
    stream's name, or None when the server has no JetStream or no room (events are then
    core-NATS only). Raises what `jetstream_busy` takes for an election: see
    `events_stream_when_elected`."""
    from nats.js.api import StreamConfig
    from nats.js.errors import NotFoundError

    js = nc.jetstream()
    try:
        await js.account_info()
    except Exception as exc:  # no JetStream on this server (or no permission to use it)
        if jetstream_busy(exc):
            raise
        log.warning("JetStream is not available (%s): deprecation events are not stored", exc)
        return None
    try:
        existing = await js.find_stream_name_by_subject(events_subject(prefix))
    except NotFoundError:
        existing = None
    if existing:  # an operator's stream (or an earlier worker's): left as it is
        log.info("deprecation events are kept by the existing stream %s", existing)
        return existing
    name = events_stream_name(prefix)
    try:
        await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.events.>"],
                                         max_age=EVENTS_MAX_AGE_S, max_bytes=EVENTS_MAX_BYTES))
    except Exception as exc:  # e.g. the server's JetStream storage is exhausted
        if jetstream_busy(exc):
            raise
        log.error("could not create stream %s for %s.events.> (%s): deprecation events are "
                  "published but not stored", name, prefix, exc)
        return None
    log.info("created stream %s for %s.events.>", name, prefix)
    return name


async def events_stream_when_elected(nc, prefix: str) -> None:
    """`ensure_events_stream` for a worker that found JetStream electing a leader at start: it
    serves meanwhile (the events it publishes until then are not stored), and this makes the
    stream once JetStream answers, or says for how long it did not."""
    try:
        await through_elections("the events stream", lambda: ensure_events_stream(nc, prefix))
    except Exception as exc:
        log.error("%s: deprecation events are published but not stored", exc)


class EventPublisher:
    """Publishes each event as MessagePack, whatever the request's encoding."""

    def __init__(self, nc, prefix: str, metrics: WorkerMetrics | None = None) -> None:
        self._nc = nc
        self._metrics = metrics
        self.subject = events_subject(prefix)
        self.published = 0

    async def __call__(self, event: DeprecationEvent, headers: dict[str, str] | None = None) -> None:
        # headers: the request's trace context (PROTOCOL.md "Trace context"), when it has one.
        await self._nc.publish(self.subject, msgpack.packb(event.model_dump(), use_bin_type=True),
                               headers=headers or None)
        self.published += 1
        if self._metrics is not None:
            self._metrics.deprecations.labels(event.requested_task).inc()
