"""How the client returns the whole answer to a big input in the one-reply shape (pure): a
request too big for one message is split into parts by its items, a reply too big for one
message comes as a stream, and both are put back together here.

PROTOCOL.md: a one-message reply is `{request_id, model, task, data: [{index, data}...], usage,
labels?, warnings?}`; a stream is item frames `{request_id, index, offset?, data | dtype, shape,
bytes}` (token-level items may be split by `offset`) and one `done` frame."""

import base64
from collections.abc import Iterable
from typing import Any

import msgpack

# Room left in each part for the keys that are not items (and MessagePack's framing).
_PART_MARGIN = 4096


def _packed_size(value: Any) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def _item_lists(task: str, body: dict[str, Any]) -> dict[str, list] | None:
    """The per-item lists of a body, or None when it has a single item (which cannot be split).
    For score, a lone text (or a list of one) pairs with every text of the other side."""
    if task == "score":
        lists = {k: body[k] for k in ("text_1", "text_2")
                 if isinstance(body.get(k), list) and len(body[k]) > 1}
        return lists or None
    value = body.get("input")
    if isinstance(value, list) and value and not isinstance(value[0], int) and len(value) > 1:
        return {"input": value}
    return None


def split_body(task: str, body: dict[str, Any], max_bytes: int) -> list[tuple[int, dict[str, Any]]]:
    """(first item index, part body) pairs whose MessagePack bodies each fit `max_bytes`, in item
    order; [(0, body)] when the body fits or has a single item."""
    if _packed_size(body) <= max_bytes:
        return [(0, body)]
    lists = _item_lists(task, body)
    if lists is None:
        return [(0, body)]
    n = max(len(v) for v in lists.values())
    rest = {k: v for k, v in body.items() if k not in lists}
    budget = max_bytes - _packed_size(rest) - _PART_MARGIN
    parts, start, size = [], 0, 0
    for i in range(n):
        item = sum(_packed_size(v[i]) for v in lists.values())
        if i > start and size + item > budget:
            parts.append((start, {**rest, **{k: v[start:i] for k, v in lists.items()}}))
            start, size = i, 0
        size += item
    parts.append((start, {**rest, **{k: v[start:n] for k, v in lists.items()}}))
    return parts


def _raw(value: Any) -> bytes:
    return base64.b64decode(value) if isinstance(value, str) else bytes(value)


def assemble_stream(frames: Iterable[dict[str, Any]], request_id: str,
                    ranked: bool = False) -> dict[str, Any]:
    """The one-reply map from a stream's item frames and its `done` frame. Token-level items
    split by `offset` are joined in row order (float rows, or binary bytes with the shape's
    row count summed). `ranked` (the rerank form of score): items stay in the order they came,
    which is the ranking."""
    parts: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    done: dict[str, Any] = {}
    for frame in frames:
        if frame.get("done"):
            done = frame
        else:
            parts.setdefault(frame["index"], []).append((frame.get("offset") or 0, frame))
    data = []
    for index in (list(parts) if ranked else sorted(parts)):
        pieces = [f for _, f in sorted(parts[index], key=lambda p: p[0])]
        first = pieces[0]
        if "bytes" in first:
            shape = list(first["shape"])
            if len(pieces) > 1:
                shape[0] = sum(p["shape"][0] for p in pieces)
            raw = b"".join(_raw(p["bytes"]) for p in pieces)
            item = {"index": index, "dtype": first["dtype"], "shape": shape, "bytes": raw}
        elif len(pieces) > 1:
            item = {"index": index, "data": [row for p in pieces for row in p["data"]]}
        else:
            item = {"index": index, "data": first["data"]}
        # A rerank item's text and a binary sparse item's token ids (PROTOCOL 1.2).
        item.update({k: first[k] for k in ("document", "indices") if k in first})
        data.append(item)
    reply = {"request_id": request_id, "model": done.get("model"), "task": done.get("task"),
             "data": data, "usage": done.get("usage")}
    for key in ("labels", "warnings"):
        if done.get(key):
            reply[key] = done[key]
    return reply


def merge_replies(parts: list[tuple[int, dict[str, Any]]], request_id: str) -> dict[str, Any]:
    """One reply from the replies to the parts of a split request: items re-indexed from each
    part's first index, usage summed, warnings kept once each."""
    first = parts[0][1]
    data, prompt, total, warnings = [], 0, 0, []
    for start, reply in parts:
        data.extend({**item, "index": item["index"] + start} for item in reply["data"])
        prompt += reply["usage"]["prompt_tokens"]
        total += reply["usage"]["total_tokens"]
        warnings.extend(w for w in reply.get("warnings") or [] if w not in warnings)
    merged = {"request_id": request_id, "model": first["model"], "task": first["task"],
              "data": data, "usage": {"prompt_tokens": prompt, "total_tokens": total}}
    if first.get("labels"):
        merged["labels"] = first["labels"]
    if warnings:
        merged["warnings"] = warnings
    return merged
