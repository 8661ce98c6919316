"""token_classify on a sequence classifier: the model's own classification head applied to every
token's hidden state, as vLLM's token_classify does (PROTOCOL.md "Task policy").

Heads differ by architecture, and each is applied with the model's own modules so the
per-token rows are exactly what the head computes on that token:
- BERT-like (`classifier` is one Linear): the Linear on every token. As in vLLM, the base
  model's pooler (BERT's dense+tanh on [CLS]) is not part of the head.
- DistilBERT: pre_classifier, ReLU, classifier.
- RoBERTa, XLM-R, ELECTRA (a head module that picks token 0 itself, then dense+out_proj), and
  DeBERTa (ContextPooler, which also picks token 0, then classifier): every token is presented
  to the head as its own length-1 sequence, so the head's "first token" is that token.
- decoders (`score` Linear, e.g. Qwen2ForSequenceClassification): the Linear on every token."""

from collections.abc import Callable

import torch

TokenHead = Callable[[torch.Tensor], torch.Tensor]  # [B, T, H] -> [B, T, labels]


def _each_token_as_a_sequence(head: Callable[[torch.Tensor], torch.Tensor]) -> TokenHead:
    def apply(hidden: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = hidden.shape
        return head(hidden.reshape(batch * tokens, 1, width)).reshape(batch, tokens, -1)
    return apply


def per_token_head(module: torch.nn.Module) -> TokenHead | None:
    """The head of a *ForSequenceClassification module as a per-token function, or None when
    its architecture's head is not one poolwire knows how to apply per token."""
    classifier = getattr(module, "classifier", None)
    pre = getattr(module, "pre_classifier", None)
    if isinstance(pre, torch.nn.Linear) and isinstance(classifier, torch.nn.Linear):
        return lambda hidden: classifier(torch.relu(pre(hidden)))
    pooler = getattr(module, "pooler", None)
    if pooler is not None and isinstance(classifier, torch.nn.Linear):
        return _each_token_as_a_sequence(lambda seq: classifier(pooler(seq)))
    if isinstance(classifier, torch.nn.Linear):
        return classifier
    if classifier is not None and hasattr(classifier, "out_proj"):
        return _each_token_as_a_sequence(classifier)
    score = getattr(module, "score", None)
    if isinstance(score, torch.nn.Linear):
        return score
    return None
