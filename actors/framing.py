"""Reply framing (pure): turns computed items into reply frames that each fit under the
connection's max_payload, headers included (the server counts headers + body; nats-py checks
only the body, and an oversized message resets the connection: NATS.md section 5)."""

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from poolwire.models.sparse_vector import SparseVector
from poolwire.schemas.codec import Float32Rows, WireFormat, encode
from poolwire.schemas.errors import ErrorCode, PoolingError


# Not frozen, for its __init__'s cost on the hot path (see actors/messages.py); never assigned.
@dataclass(unsafe_hash=True)
class ReplyStyle:
    """How one request wants its items: the codec, float lists or raw bytes, and which dtype."""

    fmt: WireFormat
    binary: bool
    dtype: str  # "float32" | "float16" | "bfloat16", used by binary only


# The fewest float32 values the codec writes from the array's bytes (Float32Rows); fewer (a
# classifier's scores, a small vector) go as Python floats, whose packing costs less than the
# rows' fixed cost (measured 2026-12-03: a one-item reply of 32 floats 3.6 us as floats against
# 8.5 us as rows, of 128 floats 6.8 against 9.3, of 384 floats 15.3 against 9.4). The bytes
# are the same either way.
ROWS_FROM = 160


def rows_from(items: int) -> int:
    """ROWS_FROM for each item of a one-message reply of `items` float items. The rows' fixed
    cost is one NumPy pass a reply, shared by its items (codec._msgpack_float32_all), so the
    more items, the fewer values an item needs before its bytes are cheaper than its floats.
    Measured 2026-12-04 (the encoding of replies of 1 to 64 items of 32 to 256 values, rows
    against floats): the two cost the same at about 160 values up to 3 items, 100 at 4, 70 at
    8, 50 at 16, 45 at 32 and 42 at 64."""
    return ROWS_FROM if items < 4 else 40 + 240 // items


def header_bytes(headers: dict[str, str] | None) -> int:
    """Bytes of a NATS header block: `NATS/1.0\\r\\n`, `K: V\\r\\n` per header, `\\r\\n`."""
    if not headers:
        return 0
    return 10 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items()) + 2


def _bfloat16_bytes(values: np.ndarray) -> bytes:
    # Round-to-nearest-even of the upper 16 bits of each float32 (how torch casts to bf16).
    bits = values.astype("<f4").view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def wire_item(index: int, values: np.ndarray, style: ReplyStyle,
              offset: int | None = None, extras: dict[str, Any] | None = None,
              rows_from: int = ROWS_FROM) -> dict[str, Any]:
    """One item (or a slice of token rows) as PROTOCOL.md shapes it; `extras` (tokens,
    offsets, entities) are added as they are; float32 values from `rows_from` on go from the
    array's bytes (see rows_from())."""
    item: dict[str, Any] = {"index": index}
    if isinstance(values, dict):
        # PROTOCOL 1.3, several outputs: `data` maps each output asked to its own form; in
        # binary each is its kind's binary item without `index`.
        item["data"] = {name: _value_wire(value, style) for name, value in values.items()}
    elif style.binary:  # its map's keys are the item's own
        item.update(_value_wire(values, style, key=True))
    else:
        item["data"] = _value_wire(values, style, rows_from=rows_from)
    if offset is not None:
        item["offset"] = offset
    if extras:
        item.update(extras)
    return item


def _value_wire(values, style: ReplyStyle, key: bool = False, rows_from: int = ROWS_FROM):
    """One value's wire form: `{data: ...}` (key) or the bare data in float encoding, the
    `{dtype, shape, bytes}` map in binary."""
    if isinstance(values, SparseVector):
        wire = _sparse_wire(values, style)
        return wire if key or style.binary else wire["data"]
    values = np.asarray(values)
    if style.binary:
        if style.dtype == "bfloat16":
            raw = _bfloat16_bytes(values)
        else:
            raw = values.astype("<f2" if style.dtype == "float16" else "<f4").tobytes()
        return {"dtype": style.dtype, "shape": list(values.shape), "bytes": raw}
    if values.ndim == 0:
        data = values.item()
    elif values.dtype == np.float32 and values.ndim <= 2 and values.size >= rows_from:
        data = Float32Rows(values)  # the codec writes its bytes as they are
    else:
        data = values.tolist()
    return {"data": data} if key else data


def _sparse_wire(values: SparseVector, style: ReplyStyle) -> dict[str, Any]:
    """PROTOCOL.md 1.2: `{data: {indices, values}}`, or in binary `{dtype, shape: [V],
    indices: uint32 bytes, bytes: the values}`."""
    if not style.binary:
        return {"data": values.wire()}
    if style.dtype == "bfloat16":
        raw = _bfloat16_bytes(values.values)
    else:
        raw = values.values.astype("<f2" if style.dtype == "float16" else "<f4").tobytes()
    return {"dtype": style.dtype, "shape": [values.size],
            "indices": values.indices.astype("<u4").tobytes(), "bytes": raw}


def _rows_extras(extras: dict[str, Any] | None, offset: int, count: int,
                 total: int) -> dict[str, Any] | None:
    """The part of an item's extras that goes with token rows [offset, offset + count) of
    `total`: the tokens and offsets of those rows, and the rows' share of the entities, which
    are spread in order over the item's rows (at most about one a row: an entity spans a token
    or more), so that a frame of few rows never has to carry them all. The first frame carries
    `entities` even when its share is empty; a client joins them in offset order, as it joins
    the rows, tokens and offsets."""
    if not extras:
        return None
    part = {k: v[offset:offset + count] for k, v in extras.items() if k in ("tokens", "offsets")}
    entities = extras.get("entities")
    if entities is not None:  # entity j goes with row j * total // len(entities)
        n = len(entities)
        share = entities[-(-offset * n // total):-(-(offset + count) * n // total)]
        if share or offset == 0:
            part["entities"] = share
    return part


def one_reply(request_id: str, model: str, task: str, items: list[dict[str, Any]],
              prompt_tokens: int, style: ReplyStyle, max_payload: int,
              headers: dict[str, str] | None = None, warnings: list[str] | None = None,
              labels: list[str] | None = None, images: int = 0) -> bytes:
    """The whole answer as one message, or PoolingError(payload_too_large) if it cannot fit."""
    frame = _closing(request_id, model, task, prompt_tokens, warnings, labels, images)
    frame["data"] = items
    body = encode(frame, style.fmt)
    limit = max_payload - header_bytes(headers)
    if len(body) > limit:
        raise PoolingError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"the reply would be {len(body)} bytes, over this connection's max_payload of "
            f"{max_payload}: send the request with \"stream\": true, or use "
            f"\"encoding_format\": \"binary\" to shrink it")
    return body


def item_frames(request_id: str, index: int, values: np.ndarray, style: ReplyStyle,
                token_level: bool, max_payload: int,
                headers: dict[str, str] | None = None,
                extras: dict[str, Any] | None = None) -> list[bytes]:
    """Streamed frames for one item. Token-level items always carry `offset` and are split into
    as many frames of whole token rows as needed; any other item must fit in one frame."""
    limit = max_payload - header_bytes(headers)

    def frame(rows: np.ndarray, offset: int | None) -> bytes:
        part = _rows_extras(extras, offset or 0, len(rows), len(values)) if token_level \
            else extras
        return encode({"request_id": request_id, **wire_item(index, rows, style, offset, part)},
                      style.fmt)

    if not token_level:
        body = frame(values, None)
        if len(body) > limit:
            raise PoolingError(ErrorCode.PAYLOAD_TOO_LARGE,
                               f"item {index} needs {len(body)} bytes, over max_payload "
                               f"{max_payload}; ask for fewer dimensions or binary encoding")
        return [body]

    frames: list[bytes] = []
    total = values.shape[0]
    offset = 0
    rows_per_frame = total
    while offset < total:
        chunk = frame(values[offset:offset + rows_per_frame], offset)
        if len(chunk) <= limit:
            frames.append(chunk)
            offset += rows_per_frame
            continue
        if rows_per_frame == 1:
            raise PoolingError(ErrorCode.PAYLOAD_TOO_LARGE,
                               f"one token row of item {index} needs {len(chunk)} bytes, over "
                               f"max_payload {max_payload}; ask for fewer dimensions or binary "
                               f"encoding where the task has them, or raise max_payload")
        # Shrink in proportion to the overshoot, with a margin for per-row size variance
        # (float lists in JSON vary in width).
        rows_per_frame = max(1, min(rows_per_frame - 1, int(rows_per_frame * limit / len(chunk) * 0.95)))
    return frames


def done_frame(request_id: str, model: str, task: str, prompt_tokens: int, style: ReplyStyle,
               warnings: list[str] | None = None, labels: list[str] | None = None,
               images: int = 0) -> bytes:
    frame = _closing(request_id, model, task, prompt_tokens, warnings, labels, images)
    frame["done"] = True
    return encode(frame, style.fmt)


def _closing(request_id: str, model: str, task: str, prompt_tokens: int,
             warnings: list[str] | None, labels: list[str] | None,
             images: int = 0) -> dict[str, Any]:
    """What a request's last frame says, whether it is the one reply or the `done` frame."""
    frame: dict[str, Any] = {
        "request_id": request_id, "model": model, "task": task,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    if images:  # PROTOCOL 1.3: the image elements computed; absent when there are none
        frame["usage"]["images"] = images
    if labels:
        frame["labels"] = labels
    if warnings:
        frame["warnings"] = warnings
    return frame


# Nats-Service-Error repeats the message on one line; kept short so headers never crowd the body.
HEADER_MESSAGE_CHARS = 256
# How much of a message is kept when a frame must be shortened to fit max_payload.
SHORT_MESSAGE_CHARS = 200


def _encodable(text: str) -> str:
    """Text every encoder and the NATS header block accept: lone surrogates become escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return _encodable(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + f"...(shortened from {len(text)} chars)"


def error_frame(request_id: str, error: PoolingError, fmt: WireFormat,
                max_payload: int | None = None,
                headers: dict[str, str] | None = None,
                fields: dict[str, Any] | None = None) -> tuple[bytes, dict[str, str]]:
    """The final error frame and its NATS service headers. With `max_payload`, the frame fits it
    together with `headers` and the service headers (PROTOCOL.md: an error frame always fits,
    messages are shortened if need be): first the message is cut, then the extra keys' text,
    then a request_id too long to echo is replaced by a generated one. `fields` are top-level
    keys the frame carries as they are (a pipeline result's `doc_id`)."""
    message = _encodable(error.message)
    extra = {k: _clean(v) for k, v in error.extra.items()}
    request_id = _encodable(request_id)

    def build() -> tuple[bytes, dict[str, str]]:
        one_line = " ".join(message.split())
        service = {"Nats-Service-Error": _cut(one_line, HEADER_MESSAGE_CHARS),
                   "Nats-Service-Error-Code": str(error.code.status)}
        frame = {"request_id": request_id,
                 "error": {"code": error.code.value, "message": message, **extra},
                 **(fields or {})}
        return encode(frame, fmt), service

    body, service = build()
    if max_payload is None:
        return body, service
    hdr = headers or {}

    def fits() -> bool:
        return len(body) + header_bytes({**hdr, **service}) <= max_payload

    if not fits():
        message = _cut(message, SHORT_MESSAGE_CHARS)
        body, service = build()
    if not fits():
        extra = {k: (_cut(v, 40) if isinstance(v, str) else v) for k, v in extra.items()}
        body, service = build()
    if not fits() and len(request_id) > 32:
        request_id = uuid.uuid4().hex  # too long to echo: unusable, as PROTOCOL.md says
        body, service = build()
    if not fits():
        extra = {}
        body, service = build()
    return body, service
