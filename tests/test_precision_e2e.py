"""Every precision mode serves every task of every test model through a real nats-server, within
the tolerance docs/PERFORMANCE.md ("Precision") states, against float32 transformers computed here.

This CPU may lack native bfloat16, where `--precision fast` falls back to float32; the tests
force the bfloat16 autocast path anyway (by saying the CPU has it), since its results are the
same on every CPU and only its speed depends on the hardware."""

import numpy as np
import pytest
import torch

from poolwire.models import precision
from poolwire.models.model import ModelKind, bundled_model_dir, load_model
from poolwire.client import PoolingClient

pytestmark = pytest.mark.timeout(300)

TEXTS = ["A short one.", "The committee questions a careful experiment after a long debate.",
         "Every river follows the crowded station before dawn, with great care and no word.",
         "Prices rose again in March, the third increase this year, and shops expect more."]
FIRST = "what does the committee question?"

# Largest absolute difference to float32 transformers, per mode, over every task's values
# (probabilities, scores, unit-vector components), and the smallest embedding cosine: the
# tolerances docs/PERFORMANCE.md ("Precision") states. Measured here, across MiniLM and the small
# test models: exact 6e-8; fast 1.8e-3 (MiniLM token rows), cosine 0.999985; bfloat16 weights
# 3.3e-3, cosine 0.99995.
TOLERANCE = {"exact": 1e-5, "fast": 5e-3, "fallback": 1e-5, "bfloat16": 1e-2}
MIN_COSINE = {"exact": 0.99999, "fast": 0.9999, "fallback": 0.99999, "bfloat16": 0.999}


def _activation(model, logits: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(logits) if model.activation_kind == "sigmoid" else torch.softmax(logits, -1)


def reference(model, task: str) -> list[np.ndarray]:
    """What float32 transformers gives for each item of `request(task)`, without poolwire code."""
    enc = model.tokenizer(TEXTS, padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    real = [int(n) for n in mask.sum(1)]
    with torch.inference_mode():
        if model.kind == ModelKind.ENCODER:
            hidden = model.module(**enc).last_hidden_state                        # [B, T, H]
            pooled = torch.nn.functional.normalize(
                (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)
            if task == "embed":
                return list(pooled.numpy())
            if task == "token_embed":
                rows = torch.nn.functional.normalize(hidden, dim=-1)
                return [rows[i, :n].numpy() for i, n in enumerate(real)]
            first = model.tokenizer([FIRST], return_tensors="pt")
            query = torch.nn.functional.normalize(model.module(**first).last_hidden_state.mean(1), dim=-1)
            return list((pooled @ query[0]).numpy()[:, None])                   # score: cosines
        if task == "classify":
            return list(_activation(model, model.module(**enc).logits).numpy())
        if task == "score":  # a cross-encoder: the one label's sigmoid for each (FIRST, text) pair
            pairs = model.tokenizer([FIRST] * len(TEXTS), TEXTS, padding=True, return_tensors="pt")
            return list(torch.sigmoid(model.module(**pairs).logits).numpy())
        if model.kind == ModelKind.TOKEN_CLASSIFICATION:
            logits = model.module(**enc).logits
        else:  # a sequence classifier's head on every token
            logits = model.module.classifier(model.module.base_model(**enc).last_hidden_state)
        probs = _activation(model, logits)
        return [probs[i, :n].numpy() for i, n in enumerate(real)]


def request(task: str) -> dict:
    if task == "score":
        return {"text_1": FIRST, "text_2": TEXTS}
    # Unit rows, so one absolute tolerance fits every task's values.
    return {"input": TEXTS, "normalize": True} if task == "token_embed" else {"input": TEXTS}


def items(reply: dict) -> list[np.ndarray]:
    return [np.atleast_1d(np.asarray(d["data"], np.float32)) for d in reply["data"]]


@pytest.fixture(scope="module")
def bf16_models(small_model_dirs):
    """Each test model with its weights cast to bfloat16 (`--dtype bfloat16`)."""
    dirs = {"minilm": bundled_model_dir(), **small_model_dirs}
    return {name: load_model(path, dtype="bfloat16") for name, path in dirs.items()}


MODES = ["exact", "fast", "fallback", "bfloat16"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["minilm", "seq3", "seq1", "multi", "tok5"])
async def test_every_mode_serves_every_task_within_its_tolerance(
        name, mode, minilm, small_models, bf16_models, start_worker, nc, prefix, monkeypatch):
    model = minilm if name == "minilm" else small_models[name]
    served_model = bf16_models[name] if mode == "bfloat16" else model
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: mode == "fast")
    # torch's autocast is what these modes test (OpenVINO's: tests/test_openvino_backend.py).
    settings = {"precision": "fast" if mode in ("fast", "fallback") else "exact",
                "backend": "torch"}
    async with start_worker(served_model, **settings) as worker:
        assert worker.precision.served == ("fast" if mode == "fast" else "exact")
        assert (worker.precision.autocast is torch.bfloat16) == (mode == "fast")
        client = PoolingClient(nc, prefix=prefix)
        replies = {task.value: await client.request(task.value, request(task.value))
                   for task in worker.policy.supported}
    for task, reply in replies.items():
        want = reference(model, task)
        got = items(reply)
        assert [g.shape for g in got] == [w.shape for w in want], task
        worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        assert worst <= TOLERANCE[mode], (task, worst)
        if task == "embed":
            cosine = min(float(g @ w / np.linalg.norm(g) / np.linalg.norm(w)) for g, w in zip(got, want))
            assert cosine >= MIN_COSINE[mode], cosine


async def test_discovery_says_which_precision_is_served(minilm, start_worker, nc, prefix, monkeypatch):
    import json

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    async with start_worker(minilm, precision="fast", backend="torch") as worker:
        msg = await nc.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"", timeout=5)
    assert json.loads(msg.data)["metadata"]["precision"] == "exact"  # fell back: no bfloat16
