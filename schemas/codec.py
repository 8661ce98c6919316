"""The one codec: request bodies in, reply frames out, in the request's own encoding.

MessagePack is the native form; a body whose first non-blank byte is `{` is JSON (no MessagePack
map starts with that byte), and every reply to it is JSON too, with binary bytes as base64."""

import base64
import json
import os
from enum import Enum
from typing import Any

import msgpack
import numpy as np

from poolwire.schemas.errors import invalid
from poolwire.schemas.sanity import check_body


class WireFormat(str, Enum):
    MSGPACK = "msgpack"
    JSON = "json"


def sniff_format(body: bytes) -> WireFormat:
    """JSON when the first byte other than white space is `{`, else MessagePack."""
    stripped = body.lstrip(b" \t\r\n")
    return WireFormat.JSON if stripped[:1] == b"{" else WireFormat.MSGPACK


def decode(body: bytes) -> tuple[Any, WireFormat]:
    """Decode a body; raises PoolingError(invalid_request) when it is not a decodable map, nests
    too deep or holds a string that is not valid Unicode (schemas/sanity.py).

    The format is returned even on failure paths through `sniff_format`, so the caller can
    answer in kind."""
    fmt = sniff_format(body)
    if not body.strip():
        raise invalid("empty body: send a MessagePack or JSON map")
    try:
        if fmt is WireFormat.JSON:
            value = json.loads(body)
        else:
            # strict_map_key: keys must be str/bytes; raw=False: strings must be UTF-8.
            value = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # any failure to parse hostile bytes is the client's error
        reason = str(exc) or type(exc).__name__
        raise invalid(f"undecodable {fmt.value} body: {reason}") from None
    if not isinstance(value, dict):
        raise invalid(f"the body must be a map, got a {type(value).__name__}")
    # Part of decoding: msgpack already refuses strings that are not UTF-8, and JSON nested too
    # deep already fails to parse; these bounds hold both encodings to the same rules.
    check_body(value)
    return value, fmt


class Float32Rows:
    """A float32 vector or matrix that encode() writes as MessagePack arrays of float32 straight
    from the array's bytes: the bytes packb gives for the same values as Python floats with
    use_single_float, without making a Python float of each (for a 384-wide vector that was
    most of a reply's encoding time). In JSON it is the list of its values, as before."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def tolist(self) -> list:
        return self.array.tolist()


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Float32Rows):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _msgpack_array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _msgpack_float32(array: np.ndarray) -> bytes:
    """A [N] array as one MessagePack array of float32 (marker 0xca, big-endian), a [R, N]
    array as an array of R such arrays."""
    flat = np.empty(array.size, dtype=[("marker", "u1"), ("value", ">f4")])
    flat["marker"] = 0xCA
    flat["value"] = array.reshape(-1)
    if array.ndim == 1:
        return _msgpack_array_header(array.shape[0]) + flat.tobytes()
    row = _msgpack_array_header(array.shape[1])
    cells = flat.view(np.uint8).reshape(array.shape[0], 5 * array.shape[1])
    rows = np.empty((array.shape[0], len(row) + cells.shape[1]), dtype=np.uint8)
    rows[:, :len(row)] = np.frombuffer(row, dtype=np.uint8)
    rows[:, len(row):] = cells
    return _msgpack_array_header(array.shape[0]) + rows.tobytes()


def _msgpack_float32_all(arrays: list[np.ndarray]) -> list:
    """_msgpack_float32 of each array, the vectors of one length (a reply's items) converted
    in one NumPy pass: per array its fixed cost was most of a 32-item reply's encoding."""
    if len(arrays) < 2 or any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays):
        return [_msgpack_float32(a) for a in arrays]
    width = arrays[0].shape[0]
    header = _msgpack_array_header(width)
    cells = np.empty((len(arrays), width), dtype=[("marker", "u1"), ("value", ">f4")])
    cells["marker"] = 0xCA
    cells["value"] = arrays
    rows = np.empty((len(arrays), len(header) + 5 * width), dtype=np.uint8)
    rows[:, :len(header)] = np.frombuffer(header, dtype=np.uint8)
    rows[:, len(header):] = cells.view(np.uint8).reshape(len(arrays), 5 * width)
    whole = memoryview(rows.tobytes())
    step = rows.shape[1]
    return [whole[i * step:(i + 1) * step] for i in range(len(arrays))]


# packb writes each Float32Rows as this marker (a bin of 20 bytes: a per-process random prefix
# and the array's number); the markers are then replaced by the arrays' encodings. A marker
# must occur exactly where packb put it: if any body text held the prefix too, the split below
# finds more pieces than arrays and the frame is packed value by value instead.
_MARK = os.urandom(16)
_PACKED_MARK = b"\xc4\x14" + _MARK


def _pack_with_rows(frame: dict[str, Any]) -> bytes:
    arrays: list[np.ndarray] = []

    def marker(value: Any) -> Any:
        if isinstance(value, Float32Rows):
            arrays.append(value.array)
            return _MARK + (len(arrays) - 1).to_bytes(4, "big")
        raise TypeError(f"cannot encode {type(value).__name__} as MessagePack")

    body = msgpack.packb(frame, use_single_float=True, use_bin_type=True, default=marker)
    if not arrays:
        return body
    pieces = body.split(_PACKED_MARK)
    if len(pieces) == len(arrays) + 1 and all(
            p[:4] == i.to_bytes(4, "big") for i, p in enumerate(pieces[1:])):
        out = [pieces[0]]
        for encoded, piece in zip(_msgpack_float32_all(arrays), pieces[1:]):
            out += [encoded, piece[4:]]
        return b"".join(out)
    return msgpack.packb(frame, use_single_float=True, use_bin_type=True,
                         default=lambda v: v.tolist() if isinstance(v, Float32Rows) else
                         marker(v))


def encode(frame: dict[str, Any], fmt: WireFormat) -> bytes:
    """Encode one reply frame; floats go out as 32-bit in MessagePack (PROTOCOL.md)."""
    if fmt is WireFormat.JSON:
        return json.dumps(frame, separators=(",", ":"), default=_json_default).encode()
    return _pack_with_rows(frame)
