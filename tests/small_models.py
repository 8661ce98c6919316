"""Small models of every kind, built from configs with random weights and saved to a folder
with the MiniLM tokenizer, so every loader path runs for real (DESIGN.md "Models")."""

from pathlib import Path

import torch
from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification,
                          BertForTokenClassification)


def _config(num_labels: int, **extra) -> BertConfig:
    return BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=512, num_labels=num_labels,
                      id2label={i: f"LABEL_{chr(65 + i)}" for i in range(num_labels)},
                      label2id={f"LABEL_{chr(65 + i)}": i for i in range(num_labels)}, **extra)


def build(folder: Path, tokenizer_dir: Path, kind: str, num_labels: int, seed: int = 0, **extra) -> Path:
    """kind: "sequence" or "token" classification; weights are random but seeded."""
    torch.manual_seed(seed)
    cls = BertForSequenceClassification if kind == "sequence" else BertForTokenClassification
    model = cls(_config(num_labels, **extra)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder
