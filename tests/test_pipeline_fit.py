"""What a pipeline adds to a reply, judged alone: the engine's size check leaves room for a
result's doc_id and source headers (Incoming.reserve), the missing-text-field error lists
bounded previews of the field names, and a doc_id from --pipeline-id-field is bounded."""

import numpy as np
import pytest

from poolwire.actors.framing import ReplyStyle, header_bytes, one_reply, wire_item
from poolwire.actors.messages import Job, ReplyReserve
from poolwire.actors.pipeline import (LISTED_FIELDS, MAX_DOC_ID_CHARS, Place, PipelineSpec,
                                      checked_doc_id, doc_id_bytes, field_list, request_for)
from poolwire.actors.reply_size import check_reply_fits, reply_room
from poolwire.schemas.codec import WireFormat, decode, encode
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.requests import parse_request
from poolwire.schemas.tasks import Task

WIDTH = 384


class Model:  # what check_reply_fits reads of a LoadedModel
    name = "all-MiniLM-L6-v2"
    embedding_size = WIDTH
    num_labels = 0
    labels = None


def job(fmt: WireFormat, reserve: ReplyReserve | None) -> Job:
    request = parse_request(Task.EMBED, {"input": "a document", "request_id": "DOCS:1"})
    return Job(request=request, task=Task.EMBED, reply="_POOLWIRE.pipeline.0", fmt=fmt,
               request_id="DOCS:1", received_at=0.0, reserve=reserve)


def stored_bytes(fmt: WireFormat, doc_id, headers: dict[str, str]) -> int:
    """The result as the pipeline stores it: the engine's reply, plus doc_id, plus headers."""
    style = ReplyStyle(fmt, False, "float32")
    values = np.random.default_rng(0).standard_normal(WIDTH).astype(np.float32)
    reply = one_reply("DOCS:1", Model.name, "embed", [wire_item(0, values, style)], 5, style, 2**40)
    frame, _ = decode(reply)
    return len(encode({**frame, "doc_id": doc_id}, fmt)) + header_bytes(headers)


@pytest.mark.parametrize("fmt", list(WireFormat))
@pytest.mark.parametrize("doc_id", [7, "d" * MAX_DOC_ID_CHARS, "\U0001F600" * MAX_DOC_ID_CHARS])
def test_a_result_the_engine_admits_still_fits_once_the_pipeline_adds_to_it(fmt, doc_id):
    headers = Place("DOCS", 1, doc_id, "docs.out.1").headers()
    reserve = ReplyReserve(headers=headers, body_bytes=doc_id_bytes(doc_id, fmt))
    size = stored_bytes(fmt, doc_id, headers)
    # Every max_payload around the stored size (JSON's estimate allows 23 characters a float,
    # most take fewer): wherever the engine admits the reply, the stored result fits; without
    # the reserve it admits some that cannot be stored (MessagePack's estimate is near exact).
    admitted_without_reserve_but_too_big = 0
    for max_payload in range(size - 300, size + 4000, 3):
        try:
            check_reply_fits(job(fmt, reserve), None, Model, max_payload)
        except PoolingError as err:
            assert err.code is ErrorCode.PAYLOAD_TOO_LARGE
        else:
            assert size <= max_payload
        try:
            check_reply_fits(job(fmt, None), None, Model, max_payload)
            admitted_without_reserve_but_too_big += size > max_payload
        except PoolingError:
            pass
    if fmt is WireFormat.MSGPACK:
        assert admitted_without_reserve_but_too_big > 0


def test_the_reserve_adds_its_headers_to_the_requests_own_and_takes_its_bytes_off():
    reserve = ReplyReserve(headers={"Pooling-Source-Seq": "1"}, body_bytes=30)
    j = job(WireFormat.MSGPACK, reserve)
    j = Job(**{**j.__dict__, "headers": {"Pooling-Deprecation": "embed"}})
    assert reply_room(j, 1000) == (970, {"Pooling-Deprecation": "embed", "Pooling-Source-Seq": "1"})
    assert reply_room(job(WireFormat.JSON, None), 1000) == (1000, None)


def test_the_pipelines_refusal_names_its_own_remedy():
    reserve = ReplyReserve(headers={}, body_bytes=0, remedy="raise the server's max_payload")
    with pytest.raises(PoolingError) as caught:
        check_reply_fits(job(WireFormat.MSGPACK, reserve), None, Model, 1000)
    assert "raise the server's max_payload" in caught.value.message
    assert '"stream": true' not in caught.value.message  # a document cannot ask for a stream


def test_the_missing_field_error_lists_bounded_previews_of_the_field_names():
    doc = {f"{i:02d}" + "k" * 100_000: i for i in range(50)}
    doc[3] = "a non-string key"
    with pytest.raises(PoolingError) as caught:
        request_for(doc, PipelineSpec("DOCS", "docs.in", "docs.out", "embed"), "DOCS:1")
    message = caught.value.message
    assert len(message) < 1500, len(message)
    assert message.count("...(100002 chars)") == LISTED_FIELDS
    assert "and 41 more" in message and "'text'" in message
    assert field_list({"b": 1, "a": 2}) == "a, b"


@pytest.mark.parametrize("value", [1, -2**63, 2**64 - 1, "x", "x" * MAX_DOC_ID_CHARS])
def test_a_short_string_or_64_bit_integer_is_a_doc_id(value):
    assert checked_doc_id(value, "id", "DOCS:1") == value


@pytest.mark.parametrize("value, says", [
    ("x" * (MAX_DOC_ID_CHARS + 1), f"is {MAX_DOC_ID_CHARS + 1} characters long"),
    ("", "is empty"),
    ("\ud800", "is not valid Unicode"),
    (2**64, "is an integer outside 64 bits"),
    (-2**63 - 1, "is an integer outside 64 bits"),  # an audit found -(2**64 - 1) accepted
    (-(2**64 - 1), "is an integer outside 64 bits"),
    ({"nested": [1, 2]}, "is a dict"),
    (True, "is a bool"),
])
def test_any_other_doc_id_is_invalid_request_naming_the_field(value, says):
    with pytest.raises(PoolingError) as caught:
        checked_doc_id(value, "key", "DOCS:1")
    err = caught.value
    assert err.code is ErrorCode.INVALID_REQUEST and err.extra.get("field") == "key"
    assert says in err.message and "--pipeline-id-field" in err.message
    assert len(err.message) < 600
