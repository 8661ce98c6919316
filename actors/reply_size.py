"""The size of a one-message reply, estimated from the input before any work is done (pure).

A one-message reply that cannot fit max_payload is refused with `payload_too_large`; knowing
that only after the forward pass wastes the model's time (a 10,000-text embed computed for 6 s
and then failed). The estimate is an upper bound, so a request it admits never fails the exact
check in framing.one_reply for its size (that check stays as the backstop):
- MessagePack packs every float as float32: 5 bytes each, exactly;
- JSON writes a float32's value as Python's shortest float repr: at most 23 characters
  (`-1.4012984643248171e-45`), plus a separator;
- binary bytes are elements x element size, as base64 in JSON;
- everything around the items (request_id, model, task, usage, labels, warnings) is encoded
  for real, with the largest token count the usage could hold."""

from dataclasses import dataclass, replace
from typing import Any

from poolwire.actors.framing import header_bytes
from poolwire.schemas.codec import WireFormat, encode
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.media import text_of
from poolwire.schemas.tasks import TOKEN_LEVEL_TASKS, Task

JSON_FLOAT_CHARS = 23
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_MAX_USAGE = 2**32 - 1  # a usage count never needs more bytes than this in either encoding


@dataclass(frozen=True)
class ReplyEstimate:
    items: int
    bytes: int   # the one-message reply, at most
    limit: int   # max_payload less the request's reply headers

    @property
    def fits(self) -> bool:
        return self.bytes <= self.limit


def item_shapes(task: Task, n_items: int, width: int,
                token_counts: list[int] | None = None) -> list[tuple[int, ...]]:
    """Each item's shape: [D] vectors (embed: dimensions; classify: labels), [] scores, and
    [T, D] token rows (token-level tasks, from each item's token count)."""
    if task is Task.SCORE:
        return [()] * n_items
    if token_counts is not None:
        return [(t, width) for t in token_counts]
    return [(width,)] * n_items


def _msgpack_int(value: int) -> int:
    return 1 if value < 128 else 2 if value < 256 else 3 if value < 2**16 else 5 if value < 2**32 else 9


def _msgpack_array(n: int) -> int:
    return 1 if n < 16 else 3 if n < 2**16 else 5


def _msgpack_bin(n: int) -> int:
    return 2 if n < 256 else 3 if n < 2**16 else 5


def _values(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _float_item_bytes(index: int, shape: tuple[int, ...], fmt: WireFormat) -> int:
    """`{index, data}` with data a float, a [D] list or a [T, D] list of lists."""
    if fmt is WireFormat.MSGPACK:
        head = 1 + 6 + _msgpack_int(index) + 5  # map, "index", the int, "data"
        if not shape:
            return head + 5
        if len(shape) == 1:
            return head + _msgpack_array(shape[0]) + 5 * shape[0]
        rows, width = shape
        return head + _msgpack_array(rows) + rows * (_msgpack_array(width) + 5 * width)
    head = len('{"index":,"data":}') + len(str(index))
    if not shape:
        return head + JSON_FLOAT_CHARS
    if len(shape) == 1:
        return head + 2 + shape[0] * (JSON_FLOAT_CHARS + 1)
    rows, width = shape
    return head + 2 + rows * (2 + width * (JSON_FLOAT_CHARS + 1) + 1)


def _binary_item_bytes(index: int, shape: tuple[int, ...], dtype: str, fmt: WireFormat) -> int:
    """`{index, dtype, shape, bytes}`."""
    raw = _values(shape) * ELEMENT_BYTES[dtype]
    if fmt is WireFormat.MSGPACK:
        return (1 + 6 + _msgpack_int(index) + 6 + 1 + len(dtype) + 6 + _msgpack_array(len(shape))
                + sum(_msgpack_int(d) for d in shape) + 6 + _msgpack_bin(raw) + raw)
    shape_text = len(str(list(shape)).replace(" ", ""))
    return (len('{"index":,"dtype":"","shape":,"bytes":""}') + len(str(index)) + len(dtype)
            + shape_text + 4 * ((raw + 2) // 3))


def estimate_reply(shapes: list[tuple[int, ...]], *, fmt: WireFormat, binary: bool, dtype: str,
                   request_id: str, model: str, task: str, max_payload: int,
                   header_bytes: int = 0, labels: list[str] | None = None,
                   warnings: list[str] | None = None) -> ReplyEstimate:
    """An upper bound on the bytes of the one-message reply holding items of these shapes."""
    closing: dict[str, Any] = {"request_id": request_id, "model": model, "task": task,
                               "usage": {"prompt_tokens": _MAX_USAGE, "total_tokens": _MAX_USAGE}}
    if labels:
        closing["labels"] = labels
    if warnings:
        closing["warnings"] = warnings
    closing["data"] = []
    total = len(encode(closing, fmt))
    if fmt is WireFormat.MSGPACK:
        total += _msgpack_array(len(shapes)) - 1  # encode() counted the empty list's header
    else:
        total += max(len(shapes) - 1, 0)          # commas between items
    for index, shape in enumerate(shapes):
        total += (_binary_item_bytes(index, shape, dtype, fmt) if binary
                  else _float_item_bytes(index, shape, fmt))
    return ReplyEstimate(items=len(shapes), bytes=total, limit=max_payload - header_bytes)


def request_items(task: Task, request) -> int:
    """Items of a one-message reply, from a validated request, without tokenizing. Score
    sizes that do not pair up count as 0: the planner refuses them with invalid_request."""
    if task is Task.SCORE and request.documents is not None:  # the rerank form
        return min(request.top_n or len(request.documents), len(request.documents))
    if task is Task.SCORE:
        a = len(request.text_1) if isinstance(request.text_1, list) else 1  # one element
        b = len(request.text_2) if isinstance(request.text_2, list) else 1
        return max(a, b) if a == b or 1 in (a, b) else 0
    value = request.input
    if not isinstance(value, list) or (value and isinstance(value[0], int)):
        return 1  # one text or image, or one list of token ids
    return len(value)


def documents_bytes(request, fmt: WireFormat) -> int:
    """What `document` adds to a rerank reply (return_documents): at most the top_n largest
    documents, each with its key."""
    if not request.return_documents or request.documents is None:
        return 0
    texts = (text_of(d) for d in request.documents)  # image documents are not echoed (1.3)
    sizes = sorted((len(encode({"document": t}, fmt)) for t in texts if t is not None),
                   reverse=True)
    return sum(sizes[:request.top_n or len(sizes)])


def too_large(estimate: ReplyEstimate, max_payload: int,
              as_binary: ReplyEstimate | None = None, remedy: str | None = None) -> PoolingError:
    """payload_too_large with the numbers and the remedy; `as_binary` is the same reply in
    binary encoding (None when the request already asked for it); `remedy` replaces the
    usual ones where the sender cannot choose stream or binary (a pipeline document)."""
    if remedy is None:
        remedy = 'send it with "stream": true (one frame per item)'
        if as_binary is not None and as_binary.fits:
            remedy += f', or with "encoding_format": "binary" (about {as_binary.bytes} bytes)'
    return PoolingError(
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"a one-message reply to {estimate.items} items would be about {estimate.bytes} bytes, "
        f"over this connection's max_payload of {max_payload} bytes ({estimate.limit} after "
        f"headers): {remedy}; nothing was computed",
        items=estimate.items, estimated_bytes=estimate.bytes, max_payload=max_payload)


def reply_room(job, max_payload: int) -> tuple[int, dict[str, str] | None]:
    """The max_payload and headers a one-message reply to `job` is sized against: the
    connection's, less what its intake adds before storing it (job.reserve), so that a reply
    which fits here still fits once stored."""
    reserve = job.reserve
    if reserve is None:
        return max_payload, job.headers
    return max_payload - reserve.body_bytes, {**(job.headers or {}), **reserve.headers}


# Bytes a BGE-M3 item's map adds for its keys, beyond the items it is estimated as.
OUTPUTS_MAP_BYTES = 64


def several_outputs(task: Task, request) -> bool:
    """An embed item that is a map of BGE-M3's outputs (PROTOCOL 1.3), not a plain vector."""
    return task is Task.EMBED and request.outputs is not None and list(request.outputs) != ["dense"]


def outputs_shapes(request, model, token_counts: list[int]) -> list[list[tuple[int, ...]]]:
    """Per item, shapes whose float or binary items bound each output's: the dense vector,
    the lexical weights as 2k + 8 values (k <= the item's tokens: one weight per distinct id),
    the multi-vector rows (one per token but the first)."""
    width = request.dimensions or model.embedding_size
    colbert = model.m3.colbert_size if getattr(model, "m3", None) is not None else width
    out = []
    for tokens in token_counts:
        parts = {"dense": (width,), "sparse": (2 * tokens + 8,),
                 "multi_vector": (max(tokens - 1, 0), colbert)}
        out.append([parts[name] for name in request.outputs])
    return out


def token_extras_bytes(plan, model, fmt: WireFormat) -> int:
    """What a token-level reply's items carry besides their rows, once tokenized: `tokens` and
    `offsets` (return_tokens) encoded for real, as the plan holds them; `entities`
    (aggregation) bounded before any forward pass, as at most one entity a real token, each
    the longest label and float and the largest offsets, its word made of the item's tokens
    (all of them, in one string: a bound on every word's text)."""
    total = 0
    if plan.token_meta is not None:
        total += sum(len(encode(meta, fmt)) for meta in plan.token_meta)
    if plan.entities is not None:
        label = max(model.labels or [""], key=len)
        one = len(encode({"entity_group": label, "score": -1.4012984643248171e-45, "word": "",
                          "start": _MAX_USAGE, "end": _MAX_USAGE}, fmt)) + 1  # + a comma
        empty = len(encode({"entities": []}, fmt)) + 4  # its key and a list header
        for seq in plan.sequences:
            real = [i for i, span in enumerate(seq.offsets or ()) if span is not None]
            tokens = model.tokenizer.convert_ids_to_tokens([seq.ids[i] for i in real])
            total += empty + len(real) * one + len(encode(" ".join(tokens), fmt))
    return total


# A bound on any one value of a sequence-level item (a float's JSON repr and separator, or
# MessagePack's 5 bytes), and on everything around an item, whatever the encoding.
_VALUE_BOUND = JSON_FLOAT_CHARS + 1
_ITEM_BOUND = 64
_CLOSING_BOUND = 512


def _clearly_fits(n_items: int, width: int, job, model, room: int) -> bool:
    """A coarse upper bound on a sequence-level reply that decides the common case (a few
    vectors, far below max_payload) without encoding anything; where it does not decide, the
    exact estimate does. Strings count 6 bytes a character: JSON escapes a character as
    at most six (a backslash, u and four hex digits)."""
    if getattr(model, "sparse", None) is not None:
        return False  # a sparse item's size is not its width
    strings = len(job.request_id) + len(model.name) + sum(len(w) for w in job.warnings)
    if job.task in (Task.CLASSIFY, Task.TOKEN_CLASSIFY):
        strings += sum(len(label) for label in model.labels)
    bound = (n_items * (max(width, 1) * _VALUE_BOUND + _ITEM_BOUND) + _CLOSING_BOUND
             + 6 * strings)
    return bound <= room


def check_reply_fits(job, plan, model, max_payload: int) -> None:
    """Raise payload_too_large when the one-message reply of `job` (a messages.Job) cannot fit.
    Sequence-level tasks are judged before tokenizing (`plan` None), token-level tasks (and
    BGE-M3's maps, sized by their tokens) once their TaskPlan gives the token counts; each call
    ignores the other kind, and streams."""
    request, task = job.request, job.task
    by_tokens = task in TOKEN_LEVEL_TASKS or several_outputs(task, request)
    if request.stream or (plan is not None) != by_tokens:
        return
    width = (request.dimensions or model.embedding_size
             if task in (Task.EMBED, Task.TOKEN_EMBED) else model.num_labels)
    per_item = 0
    if plan is not None and several_outputs(task, request):
        groups = outputs_shapes(request, model, [len(s) for s in plan.sequences])
        shapes = [shape for group in groups for shape in group]
        per_item = OUTPUTS_MAP_BYTES * len(groups)
    elif plan is not None:
        shapes = item_shapes(task, plan.n_items, width, [len(s) for s in plan.sequences])
        per_item = token_extras_bytes(plan, model, job.fmt)
    else:
        shapes = item_shapes(task, request_items(task, request), width)

    room, headers = reply_room(job, max_payload)

    documents = documents_bytes(request, job.fmt)

    def estimate(binary: bool) -> ReplyEstimate:
        found = estimate_reply(
            shapes, fmt=job.fmt, binary=binary, dtype=request.embed_dtype,
            request_id=job.request_id, model=model.name, task=task.value,
            max_payload=room, header_bytes=header_bytes(headers),
            labels=model.labels if task in (Task.CLASSIFY, Task.TOKEN_CLASSIFY) else None,
            warnings=list(job.warnings) or None)
        extra = documents + per_item
        return replace(found, bytes=found.bytes + extra) if extra else found

    binary = request.encoding_format == "binary"
    if plan is None and _clearly_fits(len(shapes), width, job, model, room - header_bytes(headers)
                                      - documents - per_item):
        return
    if task is Task.EMBED and getattr(model, "sparse", None) is not None:
        # A sparse item holds at most max_active_dims (else vocabulary-many) index/value pairs;
        # as a float item of 2k + 8 values it is bounded in every encoding. Without
        # max_active_dims that bound is the whole vocabulary, far past what trained sparse
        # models emit, so only the exact check after the forward pass applies.
        if request.max_active_dims is None:
            return
        shapes = [(2 * min(request.max_active_dims, model.embedding_size) + 8,)] * len(shapes)
        binary = False
    first = estimate(binary)
    if not first.fits:
        remedy = job.reserve.remedy if job.reserve is not None else None
        raise too_large(first, max_payload, None if binary else estimate(True), remedy)
