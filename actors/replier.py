"""Publishing reply frames, the one place that writes replies to NATS."""

import logging

from poolwire.actors.framing import error_frame
from poolwire.actors.metrics import WorkerMetrics
from poolwire.schemas.codec import WireFormat
from poolwire.schemas.errors import PoolingError

log = logging.getLogger(__name__)


class Replier:
    def __init__(self, nc, metrics: WorkerMetrics | None = None) -> None:
        self._nc = nc
        self._metrics = metrics
        self.errors_sent = 0
        self.unanswerable = 0  # error replies dropped for want of a reply subject
        self.last_error = ""  # "<code>: <message>" of the latest error reply, for $SRV.STATS
        # Reply subjects answered inside the process (durable jobs, pipeline documents): their
        # intake learns each frame, and when the last one went out, to ack the JetStream message
        # only then. Request/reply traffic never matches, so the actors need not know.
        self._local: dict[str, object] = {}

    def route(self, subject: str, sink) -> None:
        """Frames to `subject` go to `sink.frame(subject, body, headers)` and `sink.error(subject,
        request_id, error, fmt, headers)` instead of NATS, until `unroute`."""
        self._local[subject] = sink

    def unroute(self, subject: str) -> None:
        self._local.pop(subject, None)

    @property
    def max_payload(self) -> int:
        return self._nc.max_payload

    async def send(self, subject: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        sink = self._local.get(subject)
        if sink is not None:
            await sink.frame(subject, body, headers)
            return
        await self._nc.publish(subject, body, headers=headers or None)

    async def send_error(self, subject: str, request_id: str, error: PoolingError,
                         fmt: WireFormat, headers: dict[str, str] | None = None) -> None:
        """The final error frame, with the NATS service headers (and any request headers,
        such as Pooling-Deprecation, that every frame of the request carries)."""
        if not subject:
            # Warned once: a publisher flooding bad bodies without a reply subject must not
            # flood the log too.
            self.unanswerable += 1
            log.log(logging.WARNING if self.unanswerable == 1 else logging.DEBUG,
                    "request %s has no reply subject; dropping its %s error (%d so far; later "
                    "ones are logged at debug level)", request_id, error.code.value,
                    self.unanswerable)
            return
        sink = self._local.get(subject)
        if sink is not None:
            await sink.error(subject, request_id, error, fmt, headers)
            return
        body, service_headers = error_frame(request_id, error, fmt, self.max_payload, headers)
        await self.send(subject, body, {**(headers or {}), **service_headers})
        self.count_error(error, service_headers)

    def count_error(self, error: PoolingError, service_headers: dict[str, str]) -> None:
        """The one place errors are counted ($SRV.STATS `num_errors`/`last_error`, the metric
        of errors by code), whichever path answered them: request/reply here, durable jobs and
        pipeline documents in their intakes. "Once" means once per error frame published (a
        request's or job's reply subject) or stored (a pipeline's results stream): called after
        the publish or the store succeeded, never for an error whose job is delivered again
        instead of answered, and not for a pipeline result the results stream refused as a
        duplicate (a redelivery whose first answer was stored)."""
        self.errors_sent += 1
        self.last_error = f"{error.code.value}: {service_headers['Nats-Service-Error']}"
        if self._metrics is not None:
            self._metrics.errors.labels(error.code.value).inc()
