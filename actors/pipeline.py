"""Pipelines (PROTOCOL.md "Durable mode", Pipelines): a worker consumes a stream poolwire does
not own, one document per message, and publishes each result to an output subject made from
the input subject, so a results stream keeps them and de-duplicates redeliveries."""

import logging
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nats.js.errors import NotFoundError

from poolwire.actors.durable import (PUBLISH_TIMEOUT_S, JetStreamIntake, Tracked, durable_names,
                                     ensure_dead_stream)
from poolwire.actors.durable_policy import compute_alone
from poolwire.actors.framing import error_frame, header_bytes
from poolwire.actors.messages import Incoming, ReplyReserve
from poolwire.schemas.codec import WireFormat, decode, encode, sniff_format
from poolwire.schemas.errors import ErrorCode, PoolingError, invalid
from poolwire.schemas.sanity import MAX_REQUEST_ID_CHARS, field_name, is_valid_unicode, preview

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
    # A multimodal model's image field (PROTOCOL 1.3): bytes, or {bucket, name} of an object in
    # the NATS object store; a document holding it is embedded as that image.
    image_field: str | None = None


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


# A doc_id is echoed in every result, as a request_id is in every frame, and an error frame
# cannot shorten it (it is how a consumer matches the result to its document): so it gets the
# request_id's bound. 256 characters encode to at most about 3 KB (JSON's \u escapes of astral
# characters), which any max_payload a pooling reply fits in leaves room for.
MAX_DOC_ID_CHARS = MAX_REQUEST_ID_CHARS
# How many of a document's field names the missing-text-field error lists, each a preview.
LISTED_FIELDS = 10


def field_list(doc: dict) -> str:
    """The first LISTED_FIELDS field names, each cut to a preview, and how many were left out:
    bounded whatever the document holds (a thousand keys, or keys of a megabyte each)."""
    names = sorted(field_name(k) if isinstance(k, str) else preview(k) for k in doc)
    shown = ", ".join(names[:LISTED_FIELDS])
    return shown + (f" and {len(names) - LISTED_FIELDS} more" if len(names) > LISTED_FIELDS else "")


def checked_doc_id(value: Any, field: str, request_id: str) -> str | int:
    """A document's id as taken from --pipeline-id-field: a string of at most MAX_DOC_ID_CHARS
    characters or a 64-bit integer; else invalid_request naming the field."""
    if isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**64:
        return value  # a signed or an unsigned 64-bit integer (MessagePack carries both)
    if isinstance(value, str) and 0 < len(value) <= MAX_DOC_ID_CHARS and is_valid_unicode(value):
        return value
    if isinstance(value, str):
        what = (f"is {len(value)} characters long" if value else "is empty") \
            if is_valid_unicode(value) else "is not valid Unicode"
    elif isinstance(value, int) and not isinstance(value, bool):
        what = "is an integer outside 64 bits (signed or unsigned)"
    else:
        what = f"is a {type(value).__name__}"
    raise invalid(f"document {request_id}'s id field {field_name(field)!r} ({preview(value)}) "
                  f"{what}; a doc_id must be a string of 1 to {MAX_DOC_ID_CHARS} characters or a "
                  f"64-bit integer (its result carries the stream sequence as doc_id instead); "
                  f"point --pipeline-id-field at a field holding such an id", field=field)


def doc_id_bytes(doc_id: Any, fmt: WireFormat) -> int:
    """At most what `"doc_id": <id>` adds to an encoded reply map: JSON's `,"doc_id":<id>` is
    one byte shorter than `{"doc_id":<id>}`; MessagePack's key and value, and 2 bytes for a
    map header that may outgrow the 15-key fixmap."""
    return len(encode({"doc_id": doc_id}, fmt)) + (2 if fmt is WireFormat.MSGPACK else 0)


def image_element(value: Any, field: str, request_id: str) -> dict:
    """A document's image as a request element: bytes (or base64 in a JSON document) inline, a
    map as an object store reference (validated with the request)."""
    if isinstance(value, dict):
        return {"image_ref": value}
    if isinstance(value, (bytes, str)):
        return {"image": value}
    raise invalid(f"document {request_id}: field {field!r} holds a {type(value).__name__}; an "
                  f"image is bytes (base64 in JSON) or {{bucket, name}} of an object in the NATS "
                  f"object store", field=field)


def request_for(doc: Any, spec: PipelineSpec, request_id: str) -> dict:
    """The pooling request of one document; raises invalid_request naming what is missing."""
    if not isinstance(doc, dict):
        raise invalid(f"document {request_id} is a {type(doc).__name__}, not a map")
    if spec.image_field is not None and doc.get(spec.image_field) is not None:
        return {"input": image_element(doc[spec.image_field], spec.image_field, request_id),
                "request_id": request_id}
    if spec.text_field not in doc:
        raise invalid(f"document {request_id} has no field {spec.text_field!r} (it has: "
                      f"{field_list(doc)}); set --pipeline-text-field to the field holding the "
                      f"text", field=spec.text_field)
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
        try:
            self._store = await self._js.find_stream_name_by_subject(f"{s.output}.>")
        except NotFoundError:
            self._store = None
        await ensure_dead_stream(self._js, self.prefix, self.replicas)
        # Subscribing last: a bind that JetStream's election interrupted is run again whole.
        consumer = durable_names(self.prefix, self.queue, s.stream).consumer
        await self._bind_consumer(s.stream, consumer, f"{s.input}.>")
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
                doc_id = checked_doc_id(doc[self.spec.id_field], self.spec.id_field, request_id)
                place = Place(place.stream, place.seq, doc_id, place.subject)
            body = request_for(doc, self.spec, request_id)
        except PoolingError as err:
            return Tracked(msg, local, request_id, self.spec.task, fmt, False, deliveries,
                           place), err
        t = Tracked(msg, local, request_id, self.spec.task, fmt, False, deliveries, place)
        return t, Incoming(reply=local, task_name=self.spec.task, body=body, fmt=fmt,
                           request_id=request_id, received_at=time.monotonic(),
                           solo=compute_alone(deliveries, self.limits.max_deliveries),
                           reserve=self._reserve(place, fmt))

    def _reserve(self, place: Place, fmt: WireFormat) -> ReplyReserve:
        """What `deliver` adds to the engine's reply, so the engine refuses a result that
        could not be stored (payload_too_large, stored as this document's error result)
        instead of computing it, failing to store it, and being delivered it again."""
        return ReplyReserve(
            headers=place.headers(), body_bytes=doc_id_bytes(place.doc_id, fmt),
            remedy=f"a pipeline stores one message per document, so raise the NATS server's "
                   f"max_payload (now {self._nc.max_payload} bytes) or serve a model with "
                   f"smaller outputs")

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
        all_headers = {**(headers or {}), **place.headers()}
        if len(data) + header_bytes(all_headers) > self._nc.max_payload:
            # The engine's checks left room for this (Incoming.reserve), so only a reply they
            # did not size gets here; storing it would fail on every delivery.
            return await self.deliver_error(t, PoolingError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"the result of document {t.request_id} is {len(data)} bytes with its doc_id, "
                f"over max_payload {self._nc.max_payload} with its headers; raise the NATS "
                f"server's max_payload", max_payload=self._nc.max_payload), headers)
        return await self._store_result(place, data, all_headers) is not Stored.FAILED

    async def deliver_error(self, t: Tracked, error: PoolingError, headers: dict | None) -> bool:
        place: Place = t.context
        all_headers = {**(headers or {}), **place.headers()}
        # Shrunk to fit max_payload with the source headers and doc_id, as every error frame
        # (a result that could never be stored would be delivered again forever).
        data, service = error_frame(t.request_id, error, t.fmt, self._nc.max_payload,
                                    all_headers, fields={"doc_id": place.doc_id})
        if len(data) + header_bytes({**all_headers, **service}) > self._nc.max_payload:
            # A doc_id within its bound that still leaves no room on a tiny max_payload: the
            # stream sequence identifies the document as well, and the result is stored.
            data, service = error_frame(t.request_id, error, t.fmt, self._nc.max_payload,
                                        all_headers, fields={"doc_id": place.seq})
        stored = await self._store_result(place, data, {**all_headers, **service})
        if stored is Stored.NEW:
            # Counted once per document: a repeat refused by the results stream's de-duplication
            # is a redelivery whose first answer was stored (and counted) already.
            self._replier.count_error(error, service)
        return stored is not Stored.FAILED
