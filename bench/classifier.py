"""The benchmark's classifier, and its in-process float32 logits.

There is no hub access here and no classifier is bundled, so the benchmark builds one: the
bundled all-MiniLM-L6-v2 encoder (its real weights, pooler included) under a
`BertForSequenceClassification` head initialised from a fixed seed. A tiny random model would
show the precision errors of random weights; this one's logits go through the same 6 trained
layers as the embed path's, so a mode's error on classify is of the size a fine-tuned MiniLM
classifier would see. The head is untrained, so the labels mean nothing: the benchmark compares
logits, never predictions.
"""

from __future__ import annotations

from pathlib import Path

LABELS = ("negative", "neutral", "positive", "mixed")
SEED = 1234
# The head's weights ~ N(0, HEAD_STD): MiniLM's pooler output has a norm near 1.3, so the logits
# come out at a few units, as a fine-tuned classifier's do. BERT's own initialisation (std 0.02)
# gives logits of a few hundredths, beside which every absolute difference would look small.
HEAD_STD = 1.0


def build_classifier(dest: Path, labels: tuple[str, ...] = LABELS, seed: int = SEED) -> Path:
    """Write the classifier folder (config, weights, tokenizer) to `dest` and return it. Its
    tokenizer keeps the encoder's Sentence-Transformers max_seq_length, so both tasks truncate
    the workload alike and the load generator's token counts hold for both. One label makes a
    cross-encoder (bench/rerank.py)."""
    import torch
    import transformers
    from transformers import AutoTokenizer, BertForSequenceClassification

    from poolwire.models.model import bundled_model_dir, read_sentence_transformers_config

    encoder_dir = bundled_model_dir()
    dest = Path(dest)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its report of the head's missing weights
    try:
        model = BertForSequenceClassification.from_pretrained(
            encoder_dir, num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)}, local_files_only=True,
            trust_remote_code=False)
    finally:
        transformers.logging.set_verbosity(verbosity)
    generator = torch.Generator().manual_seed(seed)  # the same head every run
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, HEAD_STD, generator=generator)
        model.classifier.bias.zero_()
    tokenizer = AutoTokenizer.from_pretrained(encoder_dir, local_files_only=True,
                                              trust_remote_code=False)
    st = read_sentence_transformers_config(encoder_dir)
    if st is not None and st.max_seq_length:
        tokenizer.model_max_length = int(st.max_seq_length)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def load_classifier(model_dir: Path, device: str = "cpu"):
    """(tokenizer, model) of a classifier folder in float32, as transformers loads it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True,
                                              trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True,
                                                               trust_remote_code=False)
    return tokenizer, model.to(device).eval()


def classifier_logits(tokenizer, model, texts: list[str], batch_size: int = 32):
    """Logits of every text, [N, labels] in workload order, from transformers directly: batches
    of `batch_size` sorted by length, longest first, as SentenceTransformer.encode sorts them
    (so padding costs the in-process classify peer what it costs the embed baseline)."""
    import numpy as np
    import torch

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out = np.zeros((len(texts), model.config.num_labels), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                            return_tensors="pt").to(model.device)
            out[rows] = model(**enc).logits.float().cpu().numpy()
    return out
