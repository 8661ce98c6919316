"""Deterministic English texts for tests and benchmarks: short sentences and longer passages
(the workload of `poolwire bench`)."""

import random

_SUBJECTS = ["the cat", "a researcher", "our team", "the old bridge", "every river", "the market",
             "a small robot", "the committee", "my neighbour", "the orchestra", "this algorithm"]
_VERBS = ["watches", "describes", "builds", "crosses", "measures", "ignores", "celebrates",
          "questions", "follows", "repairs", "explains"]
_OBJECTS = ["the quiet harbour", "a long report", "the morning train", "several new ideas",
            "the broken clock", "a distant mountain", "the final chapter", "an unusual signal",
            "the summer festival", "a careful experiment", "the crowded station"]
_TAILS = ["before dawn", "with great care", "despite the rain", "for the first time",
          "after a long debate", "in the city centre", "without a word", "every single day"]


def sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(_TAILS)}"
    return s[0].upper() + s[1:] + "."


def passage(rng: random.Random, min_words: int = 60, max_words: int = 200) -> str:
    target = rng.randint(min_words, max_words)
    words: list[str] = []
    while len(words) < target:
        words.extend(sentence(rng).split())
    return " ".join(words[:target]) + "."


def mixed_texts(n: int, seed: int = 0, short_share: float = 0.7) -> list[str]:
    """70% short sentences, 30% passages of 60-200 words, the same for a given seed."""
    rng = random.Random(seed)
    return [sentence(rng) if rng.random() < short_share else passage(rng) for _ in range(n)]


SHORT_MAX_WORDS = 30  # the sentences above have at most ~12 words, passages at least 60


def is_short(text: str) -> bool:
    """A sentence, not a passage: the texts whose latency is one short text's."""
    return len(text.split()) <= SHORT_MAX_WORDS
