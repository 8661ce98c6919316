"""Bounds every decoded body keeps before anything reads its fields, and `preview`, the one way
a client's value is quoted back in an error message.

Both are about hostile input: a body that nests a thousand lists deep makes any recursive code
(pydantic's error repr, msgpack's encoder) raise RecursionError, a JSON string with a lone
surrogate (`"\\ud800"`, a UTF-16 text cut mid-emoji) is a Python str that no tokenizer or encoder
accepts, and a value quoted whole can make an error frame larger than the connection allows."""

import reprlib
from typing import Any

from poolwire.schemas.errors import invalid

# The protocol nests at most three levels (the map, a list of token-id lists, the ids); sixteen
# leaves room for optional fields to come and stays far below Python's recursion limit (1000).
MAX_DEPTH = 16
# A request_id is echoed in every frame (and is the durable mode's Nats-Msg-Id): longer than
# this it is not usable, and the error to it carries a generated one (PROTOCOL.md "Errors").
MAX_REQUEST_ID_CHARS = 256
PREVIEW_CHARS = 60

# reprlib bounds the depth and width of containers, so quoting a hostile value costs no more
# than the preview itself; strings and bytes are cut before repr (repr of a 700 KB key would
# build 700 KB first).
_repr = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple, _repr.maxset = 2, 4, 4, 4, 4
_repr.maxstring = _repr.maxother = _repr.maxlong = PREVIEW_CHARS


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A short, single-line, encodable quotation of a client's value: at most about `limit`
    characters, and `...(N chars)` saying how much was left out."""
    if isinstance(value, (str, bytes, bytearray)):
        # repr escapes lone surrogates and control characters, up to 4 characters each.
        shown = repr(value[:limit])
        if len(value) <= limit and len(shown) <= limit + 3:
            return shown
        return f"{shown[:limit]}...({len(value)} {_unit(value)})"
    try:
        shown = _repr.repr(value)
    except (ValueError, RecursionError):  # e.g. an int past Python's 4300-digit str limit
        return f"<a {type(value).__name__}>"
    return shown if len(shown) <= limit + 5 else shown[:limit] + "..."


def field_name(key: str) -> str:
    """A key as the `field` of an error: itself when short, else cut, saying its length."""
    return key if len(key) <= PREVIEW_CHARS else f"{key[:PREVIEW_CHARS]}...({len(key)} chars)"


def _unit(value) -> str:
    return "chars" if isinstance(value, str) else "bytes"


def is_valid_unicode(text: str) -> bool:
    if text.isascii():  # the common case, without building the UTF-8 bytes
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_body(body: dict) -> None:
    """Raise PoolingError(invalid_request) for a body nested deeper than MAX_DEPTH or holding a
    string (key or value) that is not valid Unicode; `field` names the top-level key.

    Iterative on purpose: a recursive walk would itself hit the recursion limit it guards."""
    stack: list[tuple[Any, int, str | None]] = [(body, 1, None)]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_DEPTH:
            raise invalid(f"the body nests deeper than {MAX_DEPTH} levels"
                          + (f" under {preview(field)}" if field else "")
                          + "; no request field nests more than 3", field=field)
        if isinstance(value, dict):
            for key, item in value.items():
                top = field if field is not None else (field_name(key) if isinstance(key, str) else None)
                if isinstance(key, str) and not is_valid_unicode(key):
                    raise _surrogate("a key", key, top if field is not None else None)
                if isinstance(item, (dict, list, str)):
                    stack.append((item, depth + 1, top))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, field) for item in value
                         if isinstance(item, (dict, list, str)))
        elif isinstance(value, str) and not is_valid_unicode(value):
            raise _surrogate("a string", value, field)


def _surrogate(what: str, text: str, field: str | None):
    where = f" in {preview(field)}" if field else ""
    return invalid(f"{what}{where} is not valid Unicode (a lone surrogate, as a UTF-16 text cut "
                   f"in the middle of a character gives): {preview(text)}; send UTF-8 text",
                   field=field)
