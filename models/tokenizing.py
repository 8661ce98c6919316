"""Turning request inputs into token sequences, with PROTOCOL.md's length rules: counts include
special tokens, truncation keeps them, and an over-long input without truncation is an error."""

from dataclasses import dataclass

from poolwire.schemas.errors import ErrorCode, PoolingError, invalid


# Not frozen, for its __init__'s cost on the hot path (see actors/messages.py); never assigned.
@dataclass(unsafe_hash=True)
class TokenSeq:
    ids: list[int]
    type_ids: list[int] | None = None  # segment ids of a text pair (cross-encoder)
    # With offsets asked for: [start, end] character spans in the tokenized text, None for
    # special tokens (the tokenizer's special_tokens_mask).
    offsets: list[tuple[int, int] | None] | None = None

    def __len__(self) -> int:
        return len(self.ids)


def truncation_limit(truncate_prompt_tokens: int | None, max_length: int) -> int | None:
    """How many tokens to keep at most, or None when no truncation was asked.
    Range errors are the validator's job (check_truncation); this only maps -1 to the max."""
    if truncate_prompt_tokens is None:
        return None
    return max_length if truncate_prompt_tokens == -1 else truncate_prompt_tokens


def check_truncation(truncate_prompt_tokens: int | None, max_length: int) -> None:
    if truncate_prompt_tokens is None or truncate_prompt_tokens == -1:
        return
    if not 1 <= truncate_prompt_tokens <= max_length:
        raise invalid(f"truncate_prompt_tokens must be -1 or between 1 and the model's maximum "
                      f"length {max_length}, got {truncate_prompt_tokens}",
                      field="truncate_prompt_tokens")


def normalise_input(value) -> tuple[list[str] | None, list[list[int]] | None]:
    """`input` as either a list of texts or a list of token-id lists."""
    if isinstance(value, str):
        return [value], None
    if value and isinstance(value[0], str):
        return list(value), None
    if value and isinstance(value[0], int):
        return None, [list(value)]
    return None, [list(v) for v in value]


def _too_long(index: int, length: int, max_length: int, chunked: bool = False) -> PoolingError:
    if chunked:  # the limit is --max-embed-len, not the model's own
        return PoolingError(ErrorCode.INPUT_TOO_LONG,
                            f"input {index} has {length} tokens, over this worker's chunked "
                            f"processing limit (max_embed_len) of {max_length}; shorten it, set "
                            f"truncate_prompt_tokens, or raise --max-embed-len",
                            max_tokens=max_length, index=index)
    return PoolingError(ErrorCode.INPUT_TOO_LONG,
                        f"input {index} has {length} tokens, over the model's maximum of "
                        f"{max_length}; shorten it or set truncate_prompt_tokens (-1 truncates "
                        f"to the maximum)", max_tokens=max_length, index=index)


def _set_up(rust, limit: int | None, side: str) -> None:
    """A Rust tokenizer set up as transformers sets it up for `tokenizer(texts,
    add_special_tokens=True, truncation=..., max_length=limit)` (set_truncation_and_padding:
    longest_first, stride 0, no padding); left as it is where it already is."""
    if limit is None:
        if rust.truncation is not None:
            rust.no_truncation()
    else:
        target = {"max_length": limit, "stride": 0, "strategy": "longest_first",
                  "direction": side}
        current = rust.truncation
        if current is None or any(current.get(k) != v for k, v in target.items()):
            rust.enable_truncation(**target)
    if rust.padding is not None:
        rust.no_padding()


def _cut(ids: list[int], keep: int, side: str) -> list[int]:
    return ids[:keep] if side == "right" else ids[len(ids) - keep:]


class Tokenizing:
    """Wraps one Hugging Face tokenizer; used from one thread at a time (it sets the
    truncation side on the shared tokenizer per call)."""

    def __init__(self, tokenizer, max_length: int) -> None:
        self._tok = tokenizer
        self.max_length = max_length
        # The Rust tokenizer behind a fast one, called directly for plain ids: transformers'
        # __call__ around it costs several times the encoding itself for a short text (it was
        # the largest part of the event loop's time per request: bench/service_cost.py).
        self._rust = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast", False) \
            else None
        # Ids encoded ahead of planning, by (text, limit, side): see encode_ahead.
        self._ahead: dict[tuple[str, int | None, str], list[int]] = {}
        self._ahead_rust = None  # the ahead thread's own copy of the Rust tokenizer
        self._special: dict[bool, int] = {}  # special tokens added to a text (False), a pair

    @property
    def encodes_ahead(self) -> bool:
        return self._rust is not None

    def encode_ahead(self, texts: list[tuple[str, int | None, str]]
                     ) -> dict[tuple[str, int | None, str], list[int]]:
        """The ids of (text, truncate_prompt_tokens, side) triples, as `texts` would give them,
        keyed by (text, limit, side). Run in a thread of its own: the Rust tokenizer's batch
        call (encode_batch_fast: no character offsets, about a sixth cheaper than encode_batch)
        releases the GIL (its single-text call does not), so a micro-batch's texts are
        encoded on another core while the event loop goes on; that thread has its own copy of
        the tokenizer, whose truncation it sets per call. Hand the result to `use_ahead`."""
        if self._ahead_rust is None:
            from tokenizers import Tokenizer

            self._ahead_rust = Tokenizer.from_str(self._rust.to_str())
        groups: dict[tuple[int | None, str], list[str]] = {}
        for text, truncate, side in texts:
            groups.setdefault((truncation_limit(truncate, self.max_length), side), []).append(text)
        out = {}
        for (limit, side), group in groups.items():
            _set_up(self._ahead_rust, limit, side)
            for text, enc in zip(group, self._ahead_rust.encode_batch_fast(
                    group, add_special_tokens=True)):
                out[(text, limit, side)] = enc.ids
        return out

    def use_ahead(self, ahead: dict[tuple[str, int | None, str], list[int]]) -> None:
        """Ids from encode_ahead for the texts planned next (the event loop's thread); what
        those plans do not use is dropped with the next call."""
        self._ahead = ahead

    def texts(self, texts: list[str], truncate: int | None, side: str,
              offsets: bool = False, longest: int | None = None) -> list[TokenSeq]:
        """`longest`: accept untruncated inputs up to this many tokens instead of the model's
        maximum (chunked processing cuts them afterwards)."""
        limit = truncation_limit(truncate, self.max_length)
        self._check_room(limit, pair=False)
        if not offsets:
            return [TokenSeq(seq) for seq in self._encode(texts, limit, side, longest=longest)]
        if not getattr(self._tok, "is_fast", False):
            raise invalid("return_tokens and aggregation need character offsets, which this "
                          "model's (slow) tokenizer cannot give; leave them out",
                          field="return_tokens")
        enc = self._encode(texts, limit, side, with_offsets=True)
        out = []
        for ids, spans, special in zip(enc["input_ids"], enc["offset_mapping"],
                                       enc["special_tokens_mask"]):
            out.append(TokenSeq(ids, offsets=[None if s else (int(a), int(b))
                                              for (a, b), s in zip(spans, special)]))
        return out

    def _check_room(self, limit: int | None, pair: bool) -> None:
        """A cut keeps the special tokens the tokenizer adds (PROTOCOL.md, "Lengths"), so a
        limit below their number cannot be met: invalid_request. Unchecked, the tokenizer gave
        such a text back uncut (its limit less the special tokens wraps around in the Rust
        tokenizer), and truncate_prompt_tokens 1 let a text past the model's maximum length
        through, as far as a forward pass that failed on it."""
        if limit is None:
            return
        special = self._special.get(pair)
        if special is None:
            special = self._special[pair] = self._tok.num_special_tokens_to_add(pair=pair)
        if limit < special:
            what = "pair of texts" if pair else "text"
            raise invalid(f"truncate_prompt_tokens {limit} leaves no room for the {special} "
                          f"special tokens this model adds to every {what}, which a cut keeps; "
                          f"send at least {special}, or -1 for the model's maximum length",
                          field="truncate_prompt_tokens")

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self._tok.convert_ids_to_tokens(ids)

    def token_ids(self, sequences: list[list[int]], truncate: int | None, side: str,
                  longest: int | None = None) -> list[TokenSeq]:
        """Token ids are used as given: no special tokens are added, and a cut is a plain cut."""
        limit = truncation_limit(truncate, self.max_length)
        vocab = len(self._tok)
        out = []
        for i, seq in enumerate(sequences):
            if max(seq) >= vocab:
                raise invalid(f"input {i} has token id {max(seq)}, outside the vocabulary of "
                              f"{vocab} ids", field="input")
            if limit is not None and len(seq) > limit:
                seq = _cut(seq, limit, side)
            elif limit is None and len(seq) > (longest or self.max_length):
                raise _too_long(i, len(seq), longest or self.max_length, longest is not None)
            out.append(TokenSeq(seq))
        return out

    def pairs(self, first: list[str], second: list[str], truncate: int | None,
              side: str) -> list[TokenSeq]:
        """Text pairs as a cross-encoder sees them: one sequence with segment ids."""
        limit = truncation_limit(truncate, self.max_length)
        self._check_room(limit, pair=True)
        self._tok.truncation_side = side
        enc = self._tok(first, second, add_special_tokens=True, truncation=limit is not None,
                        max_length=limit, return_token_type_ids=True)
        out = []
        for i, (ids, types) in enumerate(zip(enc["input_ids"], enc["token_type_ids"])):
            if limit is None and len(ids) > self.max_length:
                raise _too_long(i, len(ids), self.max_length)
            out.append(TokenSeq(ids, types))
        return out

    def _rust_ids(self, texts: list[str], limit: int | None, side: str) -> list[list[int]]:
        """What `tokenizer(texts, add_special_tokens=True, truncation=..., max_length=limit)`
        gives as input_ids (the ids encoded ahead where there are, the rest encoded here)."""
        if self._ahead:
            ids = [self._ahead.get((t, limit, side)) for t in texts]
            missing = [t for t, found in zip(texts, ids) if found is None]
            if not missing:
                return ids
            encoded = iter(self._rust_ids_now(missing, limit, side))
            return [found if found is not None else next(encoded) for found in ids]
        return self._rust_ids_now(texts, limit, side)

    def _rust_ids_now(self, texts: list[str], limit: int | None, side: str) -> list[list[int]]:
        rust = self._rust
        _set_up(rust, limit, side)
        if len(texts) == 1:  # encode_batch hands even one text to its thread pool
            return [rust.encode(texts[0], add_special_tokens=True).ids]
        # encode_batch_fast: the same ids without character offsets, which the ids never need
        # (measured 2026-12-03: 32.4 against 38.9 us a short text on one core).
        return [e.ids for e in rust.encode_batch_fast(texts, add_special_tokens=True)]

    def _encode(self, texts, limit, side, with_offsets: bool = False, longest: int | None = None):
        """The ids of each text, or with_offsets the whole encoding (ids, offset_mapping,
        special_tokens_mask)."""
        if self._rust is not None and not with_offsets:
            ids = self._rust_ids(texts, limit, side)
            if limit is None:
                for i, seq in enumerate(ids):
                    if len(seq) > (longest or self.max_length):
                        raise _too_long(i, len(seq), longest or self.max_length, longest is not None)
            return ids
        self._tok.truncation_side = side
        enc = self._tok(texts, add_special_tokens=True, truncation=limit is not None,
                        max_length=limit, return_attention_mask=False,
                        return_token_type_ids=False, return_offsets_mapping=with_offsets,
                        return_special_tokens_mask=with_offsets)
        ids = enc["input_ids"]
        if limit is None:
            for i, seq in enumerate(ids):
                if len(seq) > (longest or self.max_length):
                    raise _too_long(i, len(seq), longest or self.max_length, longest is not None)
        return enc if with_offsets else ids
