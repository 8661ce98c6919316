"""Request fields checked against the model and each other (models/model_fields.py), and the
prompt a request's texts get."""

import pytest

from poolwire.models.model_fields import ModelFacts, check_model_fields, prompt_for
from poolwire.schemas.errors import PoolingError
from poolwire.schemas.requests import parse_request
from poolwire.schemas.tasks import Task

FACTS = ModelFacts("m", 32, {"query": "q: ", "doc": "d: "}, (8, 16, 32))
CROSS = ModelFacts("ce", 32, cross_encoder_score=True)
M3 = ModelFacts("bge-m3", 32, outputs=("dense", "sparse", "multi_vector"),
                adapters=("retrieval.query", "retrieval.passage"))
SPARSE = ModelFacts("splade", 30522, sparse=True, outputs=("sparse",))


def check(task, body, facts=FACTS):
    check_model_fields(task, parse_request(task, body), facts)


@pytest.mark.parametrize("task, body, facts, field, says", [
    (Task.EMBED, {"input": "x", "dimensions": 12}, FACTS, "dimensions", "8, 16, 32"),
    (Task.EMBED, {"input": "x", "dimensions": 64}, ModelFacts("m", 32), "dimensions", "32"),
    (Task.EMBED, {"input": "x", "normalize": False, "use_activation": True}, FACTS,
     "use_activation", "disagree"),
    (Task.TOKEN_EMBED, {"input": "x", "prompt_name": "passage"}, FACTS, "prompt_name", "doc, query"),
    (Task.EMBED, {"input": "x", "prompt": "a", "prompt_name": "query"}, FACTS, "prompt", "both"),
    (Task.EMBED, {"input": [1, 2], "prompt": "a"}, FACTS, "prompt", "token ids"),
    (Task.SCORE, {"text_1": "a", "text_2": "b", "prompt": "a"}, CROSS, "prompt", "cross-encoder"),
    (Task.TOKEN_CLASSIFY, {"input": [[1, 2]], "aggregation": "max"}, FACTS, "aggregation", "token ids"),
    # PROTOCOL 1.3: outputs the model lacks, or on a one-output model, list the model's outputs.
    (Task.EMBED, {"input": "x", "outputs": ["dense", "colbert"]}, M3, "outputs",
     "dense, sparse, multi_vector"),
    (Task.EMBED, {"input": "x", "outputs": ["dense"]}, FACTS, "outputs", "one output, dense"),
    (Task.EMBED, {"input": "x", "outputs": ["sparse"]}, SPARSE, "outputs", "one output, sparse"),
    (Task.EMBED, {"input": "x", "adapter": "legal"}, M3, "adapter",
     "retrieval.query, retrieval.passage"),
    (Task.CLASSIFY, {"input": "x", "adapter": "legal"}, FACTS, "adapter", "--adapter NAME=DIR"),
])
def test_invalid_combinations_name_the_field(task, body, facts, field, says):
    with pytest.raises(PoolingError) as info:
        check(task, body, facts)
    assert info.value.extra.get("field") == field and says in info.value.message


@pytest.mark.parametrize("task, body", [
    (Task.EMBED, {"input": "x", "dimensions": 16}),
    (Task.EMBED, {"input": "x", "normalize": True, "use_activation": True}),
    (Task.CLASSIFY, {"input": "x", "use_activation": False}),
    (Task.TOKEN_CLASSIFY, {"input": [[1, 2]], "aggregation": "none", "return_tokens": True}),
    (Task.SCORE, {"text_1": "a", "text_2": "b", "prompt_name": "doc"}),
])
def test_valid_combinations_pass(task, body):
    check(task, body)


def test_the_prompt_a_request_gets():
    prompts, default = {"query": "q: ", "doc": "d: "}, "query"
    get = lambda task, body: prompt_for(task, parse_request(task, body), prompts, default)  # noqa: E731
    assert get(Task.EMBED, {"input": "x"}) == "q: "                  # the folder's default
    assert get(Task.EMBED, {"input": "x", "prompt_name": "doc"}) == "d: "
    assert get(Task.EMBED, {"input": "x", "prompt": ""}) == ""        # an explicit empty prompt
    assert get(Task.SCORE, {"text_1": "a", "text_2": "b"}) == "q: "
    assert get(Task.CLASSIFY, {"input": "x"}) == ""                  # prompts are for embedders
    assert prompt_for(Task.EMBED, parse_request(Task.EMBED, {"input": "x"}), {}, None) == ""


def test_tokens_and_offsets_of_text_prompt_and_token_id_input(minilm):
    """return_tokens: spans are in the input text (a prompt's own tokens have none), and
    token-id input has tokens but no spans; a left cut keeps the spans of what is left."""
    from poolwire.models.task_heads import plan_task
    from poolwire.models.tokenizing import Tokenizing

    tok = Tokenizing(minilm.tokenizer, minilm.max_length)
    text = "Angela Merkel visited Paris"

    def meta(body):
        return plan_task(Task.TOKEN_EMBED, parse_request(Task.TOKEN_EMBED, body), minilm,
                         tok).token_meta[0]

    plain = meta({"input": text, "return_tokens": True})
    prompted = meta({"input": text, "return_tokens": True, "prompt": "query: "})
    ids = meta({"input": [101, 2000, 102], "return_tokens": True})
    cut = meta({"input": text, "return_tokens": True, "truncate_prompt_tokens": 4,
                "truncation_side": "left"})
    assert plain["tokens"][0] == "[CLS]" and plain["offsets"][0] is None and plain["offsets"][-1] is None
    assert [text[a:b].lower() for a, b in plain["offsets"][1:-1]] == \
        [t.removeprefix("##") for t in plain["tokens"][1:-1]]
    # "query", ":" carry no span; the text's tokens carry the same spans as without a prompt.
    assert prompted["tokens"][1:3] == ["query", ":"] and prompted["offsets"][1:3] == [None, None]
    assert prompted["offsets"][3:] == plain["offsets"][1:]
    assert ids == {"tokens": ["[CLS]", "to", "[SEP]"], "offsets": [None, None, None]}
    assert cut["tokens"] == ["[CLS]"] + plain["tokens"][-3:-1] + ["[SEP]"]
    assert cut["offsets"][1:-1] == plain["offsets"][-3:-1]


@pytest.mark.parametrize("task, body", [
    (Task.EMBED, {"input": "x", "outputs": ["multi_vector", "dense"]}),
    (Task.SCORE, {"text_1": "a", "text_2": "b", "adapter": "retrieval.passage"}),
])
def test_outputs_and_adapters_the_model_has_pass(task, body):
    check(task, body, M3)


@pytest.mark.parametrize("task, body, says", [
    (Task.EMBED, {"input": "x", "outputs": ["dense", "dense"]}, "twice"),
    (Task.EMBED, {"input": "x", "outputs": []}, "outputs"),
    (Task.TOKEN_EMBED, {"input": "x", "outputs": ["dense"]}, "not valid for task"),
])
def test_outputs_shape_is_checked_before_the_model(task, body, says):
    with pytest.raises(PoolingError) as info:
        parse_request(task, body)
    assert info.value.extra.get("field") == "outputs" and says in info.value.message
