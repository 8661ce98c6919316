"""Request validation: strict types, task applicability and PROTOCOL.md's error order."""

import pytest

from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.requests import parse_request, request_id_of
from poolwire.schemas.tasks import Task


def error_of(task, body) -> PoolingError:
    with pytest.raises(PoolingError) as info:
        parse_request(task, body)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    return info.value


@pytest.mark.parametrize("value", ["hi", ["a", "b"], [101, 7592, 102], [[101, 102], [101, 5, 102]]])
def test_every_input_form_is_accepted(value):
    assert parse_request(Task.EMBED, {"input": value}).input == value


def test_defaults_and_null_counts_as_absent():
    req = parse_request(Task.EMBED, {"input": "x", "dimensions": None, "request_id": None})
    assert (req.dimensions, req.request_id, req.encoding_format, req.stream, req.priority) == \
        (None, None, "float", False, 0)


@pytest.mark.parametrize("body, field", [
    ({"input": "x", "dimension": 3}, "dimension"),                 # typo: unknown key
    ({"input": "x", "aggregation": "simple"}, "aggregation"),      # not valid for embed
    ({"input": "x", "dimensions": 3.0}, "dimensions"),             # float where int expected
    ({"input": "x", "dimensions": True}, "dimensions"),            # bool where int expected
    ({"input": "x", "dimensions": 0}, "dimensions"),               # range
    ({"input": "x", "normalize": 1}, "normalize"),                 # int where bool expected
    ({"input": "x", "deadline_ms": 0}, "deadline_ms"),
    ({"input": "x", "truncation_side": "middle"}, "truncation_side"),
    ({"input": "x", "encoding_format": "base64"}, "encoding_format"),
    ({"input": "x", "embed_dtype": "int8"}, "embed_dtype"),
    ({"input": 5}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [""]}, "input"),
    ({"input": [[]]}, "input"),
    ({}, "input"),                                                  # required
    ({"input": "x", "stream": "yes"}, "stream"),
])
def test_bad_fields_name_the_field(body, field):
    assert error_of(Task.EMBED, body).extra["field"] == field


def test_unknown_key_comes_before_type_errors():
    err = error_of(Task.EMBED, {"input": 5, "bogus": 1})
    assert err.extra["field"] == "bogus"


def test_an_unknown_key_comes_before_one_of_another_task_wherever_it_stands():
    for body in ({"input": "x", "aggregation": "simple", "bogus": 1},
                 {"input": "x", "bogus": 1, "aggregation": "simple"}):
        assert error_of(Task.EMBED, body).extra["field"] == "bogus"


def test_field_not_valid_for_task_comes_before_type_errors():
    err = error_of(Task.CLASSIFY, {"input": 5, "dimensions": "x"})
    assert err.extra["field"] == "dimensions" and "not valid for task classify" in err.message


@pytest.mark.parametrize("task, body, field", [
    (Task.EMBED, {"input": "hi", "dimensions": 0, "normalize": 1}, "normalize"),
    (Task.EMBED, {"input": "hi", "deadline_ms": 0, "priority": 1.5}, "priority"),
    (Task.EMBED, {"input": "hi", "truncation_side": "middle", "stream": 1}, "stream"),
    (Task.SCORE, {"query": "a", "documents": ["b"], "top_n": 0, "return_documents": 1},
     "return_documents"),
    (Task.EMBED, {"input": "hi", "dimensions": 0, "deadline_ms": 0}, "dimensions"),  # both range
])
def test_a_type_error_comes_before_a_range_error_whatever_the_fields_order(task, body, field):
    """PROTOCOL.md: among the fields' errors, type before range (pydantic lists them in the
    fields' declared order, which put `dimensions: 0` before `normalize: 1`)."""
    assert error_of(task, body).extra["field"] == field


def test_a_token_id_out_of_range_is_told_as_such():
    err = error_of(Task.EMBED, {"input": [101, -5, 102]})
    assert err.extra["field"] == "input" and "greater than or equal to 0" in err.message
    # Texts and ids mixed fail every type `input` takes: a type error, before a range one.
    err = error_of(Task.EMBED, {"input": ["a", -5], "dimensions": 0})
    assert err.extra["field"] == "input" and "valid string" in err.message


def test_score_takes_pairs_not_input():
    assert error_of(Task.SCORE, {"input": "x"}).extra["field"] == "input"
    assert error_of(Task.SCORE, {"text_1": "a"}).extra["field"] == "text_2"
    req = parse_request(Task.SCORE, {"text_1": "a", "text_2": ["b", "c"], "use_activation": False})
    assert req.text_2 == ["b", "c"]


def test_request_id_of_only_takes_usable_strings():
    assert request_id_of({"request_id": "abc"}) == "abc"
    assert request_id_of({"request_id": 5}) is None
    assert request_id_of({"request_id": ""}) is None
    assert request_id_of(["request_id"]) is None


# vLLM's own per-task parameter cases (tests/test_pooling_params.py): embed-like tasks take
# `dimensions` and `use_activation`, classify-like tasks take `use_activation` only.
@pytest.mark.parametrize("task, valid, invalid", [
    (Task.EMBED, ("dimensions", "use_activation"), ("aggregation", "return_tokens")),
    (Task.TOKEN_EMBED, ("dimensions", "use_activation", "return_tokens"), ("aggregation",)),
    (Task.CLASSIFY, ("use_activation",), ("dimensions", "return_tokens", "prompt", "aggregation")),
    (Task.TOKEN_CLASSIFY, ("use_activation", "return_tokens"), ("dimensions", "prompt")),
])
def test_which_task_takes_which_model_field(task, valid, invalid):
    values = {"dimensions": 4, "use_activation": False, "return_tokens": True,
              "aggregation": "simple", "prompt": "q: "}
    for name in valid:
        assert getattr(parse_request(task, {"input": "x", name: values[name]}), name) == values[name]
    for name in invalid:
        with pytest.raises(PoolingError, match=f"'{name}' is not valid for task {task}"):
            parse_request(task, {"input": "x", name: values[name]})
