"""The one codec: request bodies in, reply frames out, in the request's own encoding.

MessagePack is the native form; a body whose first non-blank byte is `{` is JSON (no MessagePack
map starts with that byte), and every reply to it is JSON too, with binary bytes as base64."""

import base64
import json
from enum import Enum
from typing import Any

import msgpack

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


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encode(frame: dict[str, Any], fmt: WireFormat) -> bytes:
    """Encode one reply frame; floats go out as 32-bit in MessagePack (PROTOCOL.md)."""
    if fmt is WireFormat.JSON:
        return json.dumps(frame, separators=(",", ":"), default=_json_default).encode()
    return msgpack.packb(frame, use_single_float=True, use_bin_type=True)
