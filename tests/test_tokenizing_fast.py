"""The Rust tokenizer called directly (models/tokenizing.py's fast path) gives exactly the ids
that the transformers tokenizer's __call__ gives, whatever truncation, side or state an earlier
call left on the shared Rust tokenizer, and over-long input is still refused."""

import copy

import pytest

from poolwire.models.tokenizing import Tokenizing
from poolwire.schemas.errors import PoolingError

TEXTS = ["a", "Hello, world!", "naïve café — 東京 🙂 " * 3, "word " * 300, "  spaced\tout\n",
         "[CLS] literal special tokens [SEP]"]


def _reference(tok, texts, limit, side):
    tok.truncation_side = side
    return tok(texts, add_special_tokens=True, truncation=limit is not None, max_length=limit,
               return_attention_mask=False, return_token_type_ids=False)["input_ids"]


@pytest.fixture(scope="module")
def tok(minilm):
    return copy.deepcopy(minilm.tokenizer)  # this module changes its state; others keep theirs


@pytest.mark.parametrize("truncate", [-1, 7, 2])
@pytest.mark.parametrize("side", ["right", "left"])
def test_ids_match_the_tokenizer_call(tok, truncate, side):
    tokenizing = Tokenizing(tok, 256)
    limit = 256 if truncate == -1 else truncate
    assert tokenizing._rust is not None
    for texts in (TEXTS, TEXTS[:1], TEXTS[3:4]):
        got = [s.ids for s in tokenizing.texts(texts, truncate, side)]
        assert got == _reference(tok, texts, limit, side)
        # A transformers call in between (offsets, pairs) sets its own state; ours is reset.
        tokenizing.texts(TEXTS[:2], None, "left", offsets=True)
        tokenizing.pairs(["q"], ["d " * 400], 9, "right")
        assert [s.ids for s in tokenizing.texts(texts, truncate, side)] == got


def test_untruncated_input_is_measured_and_refused_as_before(tok):
    tokenizing = Tokenizing(tok, 256)
    tokenizing.texts(TEXTS, 5, "left")  # leaves truncation on
    short = [t for t in TEXTS if len(t) < 100]
    assert [s.ids for s in tokenizing.texts(short, None, "right")] == _reference(tok, short, None, "right")
    with pytest.raises(PoolingError) as err:
        tokenizing.texts(TEXTS, None, "right")
    assert err.value.extra == {"max_tokens": 256, "index": 3}


def test_padding_set_on_the_rust_tokenizer_is_not_applied(tok):
    tok._tokenizer.enable_padding(length=64)
    tokenizing = Tokenizing(tok, 256)
    assert [s.ids for s in tokenizing.texts(TEXTS[:2], None, "right")] == \
        _reference(tok, TEXTS[:2], None, "right")


def test_ids_encoded_ahead_are_the_ids_planned_and_only_where_the_key_matches(tok):
    """The engine's tokenize thread encodes a micro-batch's texts ahead (encode_ahead, on its
    own copy of the tokenizer); planning takes those ids where text, limit and side match, and
    encodes the rest as usual: the ids equal the tokenizer call's either way."""
    tokenizing = Tokenizing(tok, 256)
    ahead = tokenizing.encode_ahead([(t, 7, "left") for t in TEXTS] + [(TEXTS[1], None, "right")])
    assert ahead[(TEXTS[2], 7, "left")] == _reference(tok, [TEXTS[2]], 7, "left")[0]
    tokenizing.use_ahead(ahead)
    for truncate, side in [(7, "left"), (7, "right"), (None, "right"), (-1, "left")]:
        texts = TEXTS if truncate is not None else TEXTS[:3]
        limit = 256 if truncate == -1 else truncate
        got = [s.ids for s in tokenizing.texts(texts + ["not ahead"], truncate, side)]
        assert got == _reference(tok, texts + ["not ahead"], limit, side)
    # Over-long input is refused with ids from ahead too.
    tokenizing.use_ahead(tokenizing.encode_ahead([(TEXTS[3], None, "right")] * 2))
    with pytest.raises(PoolingError) as err:
        tokenizing.texts([TEXTS[3]], None, "right")
    assert err.value.code.value == "input_too_long"


def test_a_cut_below_the_special_tokens_is_refused_naming_the_least(tok):
    """The tokenizer gives a text back uncut when the limit is below the special tokens it adds
    ([CLS] and [SEP]: 2; 3 for a pair), so truncate_prompt_tokens 1 used to let a text of any
    length through. Token ids get no special tokens, so 1 cuts them to one."""
    tokenizing = Tokenizing(tok, 256)
    for side in ("right", "left"):
        with pytest.raises(PoolingError) as err:
            tokenizing.texts(["word " * 300], 1, side)
        assert err.value.code.value == "invalid_request"
        assert err.value.extra["field"] == "truncate_prompt_tokens"
        assert "at least 2" in err.value.message
        assert [s.ids for s in tokenizing.texts(["word " * 300], 2, side)] == [[101, 102]]
    with pytest.raises(PoolingError, match="at least 3"):
        tokenizing.pairs(["q"], ["d " * 400], 2, "right")
    assert len(tokenizing.pairs(["q"], ["d " * 400], 3, "right")[0]) == 3
    assert [s.ids for s in tokenizing.token_ids([[101, 2000, 2001, 102]], 1, "right")] == [[101]]
