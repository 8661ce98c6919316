"""Entity spans of token_classify (`aggregation` simple / first / max), grouped by the
transformers token-classification pipeline's own code (gather_pre_entities, aggregate and its
"O" filter), so poolwire's spans are the pipeline's spans by construction rather than by a copy
of its rules."""

import numpy as np

from poolwire.models.tokenizing import TokenSeq


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def pipeline_scores(rows: np.ndarray, activation: str) -> np.ndarray:
    """The pipeline groups softmax probabilities whatever the model's activation; recover them
    from the rows the request computed (logits, softmax, or sigmoid of the logits)."""
    rows = rows.astype(np.float32)
    if activation == "softmax":
        return rows
    if activation == "sigmoid":
        p = np.clip(rows, 1e-7, 1 - 1e-7)
        return _softmax(np.log(p / (1 - p)))
    return _softmax(rows)


class EntityGrouper:
    """One per served model: a TokenClassificationPipeline over the loaded module, used only for
    its grouping methods (it never runs the model)."""

    def __init__(self, module, tokenizer) -> None:
        from transformers import TokenClassificationPipeline

        self._pipe = TokenClassificationPipeline(model=module, tokenizer=tokenizer)

    def group(self, text: str, seq: TokenSeq, rows: np.ndarray, activation: str,
              strategy: str) -> list[dict]:
        from transformers.pipelines.token_classification import AggregationStrategy

        aggregation = AggregationStrategy(strategy)
        special = np.array([span is None for span in seq.offsets], dtype=np.int64)
        offsets = [span if span is not None else (0, 0) for span in seq.offsets]
        pre = self._pipe.gather_pre_entities(text, np.asarray(seq.ids), pipeline_scores(rows, activation),
                                             offsets, special, aggregation)
        grouped = self._pipe.aggregate(pre, aggregation)
        return [{"entity_group": e["entity_group"], "score": float(e["score"]), "word": e["word"],
                 "start": int(e["start"]), "end": int(e["end"])}
                for e in grouped if e.get("entity_group") != "O"]
