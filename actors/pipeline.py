"""Pipelines (PROTOCOL.md "Durable mode", Pipelines): a worker consumes a stream poolwire does
not own, one document per message, and publishes each result to an output subject made from
the input subject, so a results stream keeps them and de-duplicates redeliveries."""

import logging
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nats.js.errors import NotFoundError

from poolwire.actors.durable import (PUBLISH_TIMEOUT_S, JetStreamIntake, Tracked, consumer_name,
                                     ensure_dead_stream)
from poolwire.actors.durable_policy import compute_alone
from poolwire.actors.framing import error_frame
from poolwire.actors.messages import Incoming
from poolwire.schemas.codec import decode, encode, sniff_format
from poolwire.schemas.errors import PoolingError, invalid

log = logging.getLogger(__name__)

SOURCE_STREAM_HEADER = "Pooling-Source-Stream"
SOURCE_SEQ_HEADER = "Pooling-Source-Seq"


class Stored(Enum):
    NEW = "new"          # published, or stored for the first time
    REPEAT = "repeat"    # the results stream already held it (same Nats-Msg-Id): a redelivery
    FAILED = "failed"    # not stored: the document is delivered again


@dataclass(frozen=True)
class PipelineSpec:
    stream: str
    input: str                  # subjects `<input>.>` are consumed, e.g. docs.in
    output: str                 # ... and answered on `<output>.<rest>`, e.g. docs.embedded
    task: str
    text_field: str = "text"
    id_field: str | None = None  # None: the document's id is its stream sequence
    truncate: bool = True


def output_subject(subject: str, input_root: str, output_root: str) -> str:
    """`docs.in.42` -> `docs.embedded.42` for input `docs.in` and output `docs.embedded`."""
    if subject != input_root and not subject.startswith(input_root + "."):
        raise ValueError(f"subject {subject!r} is not under the pipeline input {input_root!r}")
    return output_root + subject[len(input_root):]


@dataclass(frozen=True)
class Place:
    """Where a document came from and where its result goes."""

    stream: str
    seq: int
    doc_id: Any
    subject: str

    def headers(self) -> dict[str, str]:
        return {SOURCE_STREAM_HEADER: self.stream, SOURCE_SEQ_HEADER: str(self.seq),
                "Nats-Msg-Id": f"{self.stream}:{self.seq}"}


def request_for(doc: Any, spec: PipelineSpec, request_id: str) -> dict:
    """The pooling request of one document; raises invalid_request naming what is missing."""
    if not isinstance(doc, dict):
        raise invalid(f"document {request_id} is a {type(doc).__name__}, not a map")
    if spec.text_field not in doc:
        fields = ", ".join(sorted(map(str, doc))[:10])
        raise invalid(f"document {request_id} has no field {spec.text_field!r} (it has: "
                      f"{fields}); set --pipeline-text-field to the field holding the text",
                      field=spec.text_field)
    body = {"input": doc[spec.text_field], "request_id": request_id}
    if spec.truncate:
        body["truncate_prompt_tokens"] = -1
    return body


class PipelineIntake(JetStreamIntake):
    name = "pipeline"

    def __init__(self, *args, spec: PipelineSpec, queue: str = "poolwire", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spec = spec
        self.queue = queue
        self._store: str | None = None

    async def bind(self) -> None:
        s = self.spec
        try:
            await self._js.stream_info(s.stream)
        except NotFoundError:
            raise RuntimeError(f"pipeline stream {s.stream!r} does not exist: create it (e.g. "
                               f"`nats stream add {s.stream} --subjects '{s.input}.>'`) or fix "
                               f"--pipeline-stream") from None
        await self._bind_consumer(s.stream, consumer_name("pipeline", s.stream, self.queue),
                                  f"{s.input}.>")
        try:
            self._store = await self._js.find_stream_name_by_subject(f"{s.output}.>")
        except NotFoundError:
            self._store = None
        await ensure_dead_stream(self._js, self.prefix, self.replicas)
        log.info("pipeline: %s.> from stream %s -> %s.> (%s), task %s", s.input, s.stream,
                 s.output, f"kept by stream {self._store}" if self._store else "not stored",
                 s.task)

    def parse(self, msg, local: str, deliveries: int):
        meta = msg.metadata
        request_id = f"{meta.stream}:{meta.sequence.stream}"
        place = Place(meta.stream, meta.sequence.stream, meta.sequence.stream,
                      output_subject(msg.subject, self.spec.input, self.spec.output))
        fmt = sniff_format(msg.data)
        try:
            doc, fmt = decode(msg.data)
            if self.spec.id_field is not None:
                if not isinstance(doc, dict) or self.spec.id_field not in doc:
                    raise invalid(f"document {request_id} has no id field "
                                  f"{self.spec.id_field!r}; set --pipeline-id-field to the "
                                  f"field holding its id, or leave it unset to use the stream "
                                  f"sequence", field=self.spec.id_field)
                place = Place(place.stream, place.seq, doc[self.spec.id_field], place.subject)
            body = request_for(doc, self.spec, request_id)
        except PoolingError as err:
            return Tracked(msg, local, request_id, self.spec.task, fmt, False, deliveries,
                           place), err
        t = Tracked(msg, local, request_id, self.spec.task, fmt, False, deliveries, place)
        return t, Incoming(reply=local, task_name=self.spec.task, body=body, fmt=fmt,
                           request_id=request_id, received_at=time.monotonic(),
                           solo=compute_alone(deliveries, self.limits.max_deliveries))

    async def _store_result(self, place: Place, data: bytes, headers: dict[str, str]) -> Stored:
        if self._store is None:
            await self._nc.publish(place.subject, data, headers=headers)
            return Stored.NEW
        try:
            ack = await self._js.publish(place.subject, data, headers=headers,
                                         timeout=PUBLISH_TIMEOUT_S)
        except Exception as exc:  # not stored: the document is delivered again
            log.warning("pipeline: could not store the result of %s:%s on %s (%r)",
                        place.stream, place.seq, place.subject, exc)
            return Stored.FAILED
        return Stored.REPEAT if ack.duplicate else Stored.NEW

    async def deliver(self, t: Tracked, body: bytes, headers: dict | None) -> bool:
        frame, _ = decode(body)
        place: Place = t.context
        data = encode({**frame, "doc_id": place.doc_id}, t.fmt)
        return await self._store_result(place, data, {**(headers or {}), **place.headers()}) \
            is not Stored.FAILED

    async def deliver_error(self, t: Tracked, error: PoolingError, headers: dict | None) -> bool:
        place: Place = t.context
        all_headers = {**(headers or {}), **place.headers()}
        # Shrunk to fit max_payload with the source headers and doc_id, as every error frame
        # (a result that could never be stored would be delivered again forever).
        data, service = error_frame(t.request_id, error, t.fmt, self._nc.max_payload,
                                    all_headers, fields={"doc_id": place.doc_id})
        stored = await self._store_result(place, data, {**all_headers, **service})
        if stored is Stored.NEW:
            # Counted once per document: a repeat refused by the results stream's de-duplication
            # is a redelivery whose first answer was stored (and counted) already.
            self._replier.count_error(error, service)
        return stored is not Stored.FAILED
