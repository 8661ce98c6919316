"""Rerankers that score with token logits (PROTOCOL.md 1.3): a decoder language model whose
answer to "does this document fit the query?" is read from the logits of a few tokens at the
last position of its prompt template (Qwen3-Reranker: "no"/"yes", mxbai-rerank v2: "0"/"1",
bge-reranker-v2-gemma: "Yes").

As vLLM's `classifier_from_token` does, only the answer tokens' rows of the LM head are kept
and folded into one Linear row, so such a model is an ordinary one-label classifier to the rest
of the engine: `from_2_way_softmax` (two tokens, false then true) gives the row
W[true] - W[false], whose sigmoid is the two-way softmax P(true); `no_post_processing` (one
token) gives W[true], the token's logit. Sentence-Transformers 6's `LogitScore` module computes
the same numbers (logit[true] - logit[false], or logit[true]) before its activation.

Where the tokens and the template come from: a Sentence-Transformers 6 CrossEncoder folder says
both (a `LogitScore` module, the folder's chat template); any other folder gets them from the
worker's `--reranker` option. Nothing here guesses."""

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import torch

from poolwire.models.reranker_templates import TEMPLATES
from poolwire.models.tokenizing import TokenSeq, _too_long, truncation_limit

METHODS = ("from_2_way_softmax", "no_post_processing")
OPTION_KEYS = ("classifier_from_token", "method", "template")
_LOGIT_SCORE = "LogitScore"


@dataclass(frozen=True)
class RerankerOption:
    """`--reranker`: vLLM's hf-overrides names, as `key=value` words."""

    classifier_from_token: tuple[str, ...] = ()
    method: str | None = None
    template: str | None = None   # a name of reranker_templates.TEMPLATES, or a .jinja file


def parse_reranker_option(text: str) -> RerankerOption:
    """'classifier_from_token=no,yes method=from_2_way_softmax template=qwen3-reranker' ->
    RerankerOption; ValueError (one line) naming what is wrong and what is accepted."""
    values: dict[str, str] = {}
    for word in shlex.split(text):
        key, sep, value = word.partition("=")
        if not sep or key not in OPTION_KEYS or not value:
            raise ValueError(f"--reranker {text!r}: {word!r} is not one of "
                             f"{', '.join(k + '=...' for k in OPTION_KEYS)}")
        if key in values:
            raise ValueError(f"--reranker {text!r}: {key} is given twice")
        values[key] = value
    if "template" not in values:
        raise ValueError(f"--reranker {text!r}: template=... is missing (one of "
                         f"{', '.join(TEMPLATES)}, or a .jinja file)")
    tokens = tuple(t for t in values.get("classifier_from_token", "").split(",") if t)
    method = values.get("method")
    if method is not None and method not in METHODS:
        raise ValueError(f"--reranker {text!r}: method {method!r} is not one of "
                         f"{', '.join(METHODS)}")
    if tokens and method is None:
        method = "from_2_way_softmax" if len(tokens) == 2 else "no_post_processing"
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"--reranker {text!r}: from_2_way_softmax needs two tokens, the false "
                         f"one then the true one (classifier_from_token=no,yes)")
    if method == "no_post_processing" and len(tokens) != 1:
        raise ValueError(f"--reranker {text!r}: no_post_processing needs one token "
                         f"(classifier_from_token=Yes)")
    if method is not None and not tokens:
        raise ValueError(f"--reranker {text!r}: method needs classifier_from_token")
    return RerankerOption(tokens, method, values["template"])


def template_text(template: str) -> str:
    """A built-in template by name, else the Jinja file at that path."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    path = Path(template)
    if path.suffix != ".jinja" or not path.is_file():
        raise ValueError(f"--reranker template={template!r} is neither one of "
                         f"{', '.join(TEMPLATES)} nor a .jinja file")
    return path.read_text()


def read_logit_score(folder: Path) -> tuple[int, int | None] | None:
    """(true_token_id, false_token_id) of a Sentence-Transformers 6 CrossEncoder folder's
    LogitScore module, or None when the folder has none."""
    modules_file = Path(folder) / "modules.json"
    if not modules_file.is_file():
        return None
    for module in json.loads(modules_file.read_text()):
        if module.get("type", "").rpartition(".")[2] == _LOGIT_SCORE:
            cfg = json.loads((Path(folder) / module.get("path", "") / "config.json").read_text())
            if cfg.get("module_input_name", "causal_logits") != "causal_logits":
                raise ValueError(f"{modules_file}: a LogitScore module on "
                                 f"{cfg['module_input_name']!r} is not supported; poolwire "
                                 f"reads it on the language model's logits")
            return int(cfg["true_token_id"]), (None if cfg.get("false_token_id") is None
                                               else int(cfg["false_token_id"]))
    return None


def chat_template_kwargs(folder: Path) -> dict:
    """Sentence-Transformers' `processing_kwargs["chat_template"]` (sentence_bert_config.json):
    what it passes to apply_chat_template, less its own `restore_suffix` switch and the size
    arguments (poolwire applies PROTOCOL's length rules itself)."""
    cfg_file = Path(folder) / "sentence_bert_config.json"
    if not cfg_file.is_file():
        return {}
    kwargs = dict((json.loads(cfg_file.read_text()).get("processing_kwargs") or {})
                  .get("chat_template") or {})
    for key in ("restore_suffix", "padding", "truncation", "max_length", "return_tensors"):
        kwargs.pop(key, None)
    return kwargs


def token_id(tokenizer, token: str) -> int:
    """The id of an answer token, which must be one token of the vocabulary."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"--reranker classifier_from_token: {token!r} is {len(ids)} tokens in "
                         f"this model's tokenizer, not one; name the answer tokens as the "
                         f"tokenizer spells them")
    return ids[0]


def answer_head(lm_head: torch.nn.Module, true_id: int, false_id: int | None) -> torch.nn.Linear:
    """vLLM's trick: only the answer tokens' rows of the LM head, folded into one Linear row
    (W[true] - W[false], or W[true])."""
    weight = lm_head.weight.detach()
    row = weight[true_id] - (weight[false_id] if false_id is not None else 0)
    bias = getattr(lm_head, "bias", None)
    head = torch.nn.Linear(weight.shape[1], 1, bias=bias is not None,
                           device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(row[None, :])
        if bias is not None:
            head.bias.copy_((bias[true_id] - (bias[false_id] if false_id is not None else 0))[None])
    return head


@dataclass
class PromptTemplate:
    """A reranker's prompt template over one tokenizer: the token sequence of each
    (query, document) pair, as Sentence-Transformers 6 renders pairs (roles `query` and
    `document`, an instruction as a `system` message) through apply_chat_template."""

    tokenizer: object
    template: str
    kwargs: dict = field(default_factory=dict)
    source: str = ""             # where the template came from, for logs and errors

    def __post_init__(self) -> None:
        self.suffix = self._suffix()
        probe = [self._render([("q", "d")], i)[0] for i in ("first instruction", "second one")]
        self.takes_instruction = probe[0] != probe[1]

    def _messages(self, query: str, document: str, instruction: str | None) -> list[dict]:
        messages = [{"role": "system", "content": instruction}] if instruction is not None else []
        return messages + [{"role": "query", "content": query},
                           {"role": "document", "content": document}]

    def _render(self, pairs, instruction: str | None) -> list[list[int]]:
        out = self.tokenizer.apply_chat_template(
            [self._messages(q, d, instruction) for q, d in pairs], chat_template=self.template,
            tokenize=True, return_dict=True, **self.kwargs)
        return [list(ids) for ids in out["input_ids"]]

    def _suffix(self) -> list[int]:
        """The template's tail after the document: the longest common token suffix of two
        renders with different contents (how Sentence-Transformers finds it), so that a
        truncated prompt still ends where the model reads its answer."""
        first, second = self._render([("0", "0"), ("1 2 3 4", "1 2 3 4")], None)
        count = 0
        for a, b in zip(reversed(first), reversed(second)):
            if a != b:
                break
            count += 1
        return first[len(first) - count:] if count < min(len(first), len(second)) else []

    def pairs(self, first: list[str], second: list[str], instruction: str | None,
              truncate: int | None, side: str, max_length: int) -> list[TokenSeq]:
        """PROTOCOL's length rules on the rendered prompt: over the maximum is input_too_long
        unless truncation was asked; a cut keeps the template's suffix (the content before it
        is cut from the side asked), as Sentence-Transformers restores the suffix after its
        own truncation."""
        limit = truncation_limit(truncate, max_length)
        out = []
        for i, ids in enumerate(self._render(list(zip(first, second)), instruction)):
            if limit is None:
                if len(ids) > max_length:
                    raise _too_long(i, len(ids), max_length)
            elif len(ids) > limit:
                tail = self.suffix[-limit:] if limit else []
                body, keep = ids[:len(ids) - len(tail)], limit - len(tail)
                ids = (body[:keep] if side == "right" else body[len(body) - keep:]) + tail
            out.append(TokenSeq(ids))
        return out

