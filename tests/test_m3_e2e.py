"""BGE-M3's three outputs from one deployment (PROTOCOL 1.3, "Several outputs"): a tiny BERT
encoder with random `sparse_linear.pt` and `colbert_linear.pt` saved beside it as
FlagEmbedding ships them, served by a worker and by the offline PoolingModel, against a
reference reimplemented here from FlagEmbedding's published formulas (M3Embedder's
`encode_single_device`, `compute_lexical_matching_score`, `colbert_score` and
`compute_score`) on transformers' own hidden states."""

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, BertModel

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.models.model import bundled_model_dir, load_model
from poolwire.offline import PoolingModel
from poolwire.offline_errors import InvalidRequestError
from tests.helpers import close
from tests.model_zoo import _bert

pytestmark = pytest.mark.timeout(300)

TEXTS = ["Rivers flow downhill until they meet the ocean.", "A short one.",
         "The station was crowded before dawn, and the river ran past it."]
QUERY = "how do rivers reach the sea?"
WEIGHTS = (0.4, 0.2, 0.4)


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bge-m3")
    torch.manual_seed(7)
    config = _bert()
    BertModel(config).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(folder)
    # As FlagEmbedding saves them: the state dicts of nn.Linear(hidden, 1) and (hidden, hidden).
    torch.save(torch.nn.Linear(32, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(32, 32).state_dict(), folder / "colbert_linear.pt")
    return folder


@pytest.fixture(scope="module")
def m3_model(m3_dir):
    return load_model(m3_dir)


@pytest.fixture(scope="module")
def reference(m3_dir):
    """FlagEmbedding's M3 computation, one text at a time (no padding)."""
    tok = AutoTokenizer.from_pretrained(m3_dir)
    encoder = AutoModel.from_pretrained(m3_dir).eval()
    sparse_linear = torch.nn.Linear(32, 1)
    sparse_linear.load_state_dict(torch.load(m3_dir / "sparse_linear.pt"))
    colbert_linear = torch.nn.Linear(32, 32)
    colbert_linear.load_state_dict(torch.load(m3_dir / "colbert_linear.pt"))
    unused = {tok.convert_tokens_to_ids(tok.special_tokens_map[t])
              for t in ("cls_token", "eos_token", "pad_token", "unk_token")
              if t in tok.special_tokens_map}

    def encode(text: str) -> dict:
        inputs = tok(text, return_tensors="pt")
        with torch.no_grad():
            h = encoder(**inputs).last_hidden_state
            dense = torch.nn.functional.normalize(h[:, 0], dim=-1)[0].numpy()
            weights = torch.relu(sparse_linear(h)).squeeze(-1)[0].numpy()
            colbert = colbert_linear(h[:, 1:]) * inputs["attention_mask"][:, 1:][:, :, None].float()
            colbert = torch.nn.functional.normalize(colbert, dim=-1)[0].numpy()
        lexical: dict[int, float] = {}
        for w, idx in zip(weights, inputs["input_ids"][0].tolist()):
            if idx not in unused and w > 0 and w > lexical.get(idx, 0):
                lexical[idx] = float(w)
        tokens = int(inputs["attention_mask"].sum())
        return {"dense": dense, "sparse": lexical, "multi_vector": colbert[:tokens - 1]}

    def score(a: dict, b: dict) -> dict:
        dense = float(a["dense"] @ b["dense"])
        sparse = sum(w * b["sparse"][t] for t, w in a["sparse"].items() if t in b["sparse"])
        sims = a["multi_vector"] @ b["multi_vector"].T
        colbert = float(sims.max(-1).sum() / a["multi_vector"].shape[0])
        hybrid = (WEIGHTS[0] * dense + WEIGHTS[1] * sparse + WEIGHTS[2] * colbert) / sum(WEIGHTS)
        return {"dense": dense, "sparse": sparse, "multi_vector": colbert, "hybrid": hybrid}

    return encode, score


def check_item(got: dict, want: dict) -> None:
    close(got["dense"], want["dense"])
    indices = [int(i) for i in got["sparse"]["indices"]]
    assert indices == sorted(want["sparse"])
    close(got["sparse"]["values"], [want["sparse"][i] for i in indices])
    close(got["multi_vector"], want["multi_vector"])


def from_binary(part: dict) -> np.ndarray:
    return np.frombuffer(part["bytes"], dtype="<f4").reshape(part["shape"])


async def test_worker_serves_all_three_outputs_and_hybrid_score(m3_model, reference,
                                                                start_worker, nc, prefix):
    encode, score = reference
    want = [encode(t) for t in TEXTS]
    client = PoolingClient(nc, prefix=prefix)
    async with start_worker(m3_model, backend="torch", score_method="hybrid") as worker:
        plain = await client.embed(TEXTS)
        every = await client.embed(TEXTS, outputs=["dense", "sparse", "multi_vector"])
        binary = await client.embed(TEXTS[:2], outputs=["sparse", "multi_vector", "dense"],
                                    encoding_format="binary")
        streamed = [f async for f in client.stream(
            "embed", {"input": TEXTS, "outputs": ["multi_vector", "sparse"], "stream": True})]
        rows = await client.token_embed(TEXTS[0])
        hybrid = await client.score(QUERY, TEXTS)
        ranked = await client.rerank(QUERY, TEXTS)
        with pytest.raises(PoolingServiceError) as bad:
            await client.embed(TEXTS[0], outputs=["dense", "colbert"])
        described = worker.describe()
    # The default stays a plain embedder: a 1.2 publisher sees the dense vectors.
    for item, w in zip(plain["data"], want):
        close(item["data"], w["dense"])
    for item, w in zip(every["data"], want):
        assert list(item["data"]) == ["dense", "sparse", "multi_vector"]
        check_item(item["data"], w)
    for item, w in zip(binary["data"], want):
        data = item["data"]
        assert set(item) == {"index", "data"} and list(data) == ["sparse", "multi_vector", "dense"]
        close(from_binary(data["dense"]), w["dense"])
        close(from_binary(data["multi_vector"]), w["multi_vector"])
        indices = np.frombuffer(data["sparse"]["indices"], dtype="<u4").tolist()
        assert indices == sorted(w["sparse"]) and data["sparse"]["shape"] == [30522]
        close(np.frombuffer(data["sparse"]["bytes"], dtype="<f4"),
              [w["sparse"][i] for i in indices])
    items = {f["index"]: f["data"] for f in streamed if "index" in f}
    assert streamed[-1]["done"] and sorted(items) == [0, 1, 2]
    for i, w in enumerate(want):
        close(items[i]["multi_vector"], w["multi_vector"])
    close(rows["data"][0]["data"], want[0]["multi_vector"])  # token_embed = the ColBERT rows
    q = encode(QUERY)
    scores = [score(q, w) for w in want]
    close([d["data"] for d in hybrid["data"]], [s["hybrid"] for s in scores], atol=1e-4)
    assert [d["index"] for d in ranked["data"]] == list(np.argsort([-s["hybrid"] for s in scores]))
    assert bad.value.code == "invalid_request" and bad.value.error["outputs"] == \
        ["dense", "sparse", "multi_vector"]
    assert described["outputs"] == "dense,sparse,multi_vector"
    assert described["score_method"] == "hybrid" and described["hybrid_weights"] == "0.4,0.2,0.4"


@pytest.mark.parametrize("method", ["dense", "sparse", "multi_vector"])
def test_offline_outputs_and_each_score_method(m3_dir, reference, method, tmp_path):
    encode, score = reference
    model = PoolingModel(m3_dir, backend="torch", score_method=method, state_dir=tmp_path)
    scores = model.score(QUERY, TEXTS)
    q = encode(QUERY)
    close(scores.data, [score(q, encode(t))[method] for t in TEXTS], atol=1e-4)
    if method != "dense":
        return
    got = model.embed(TEXTS, outputs=["dense", "sparse", "multi_vector"])
    for item, text in zip(got.data, TEXTS):
        check_item(item, encode(text))
    close(model.embed(TEXTS).data, np.stack([encode(t)["dense"] for t in TEXTS]))


def test_outputs_refused_on_a_one_output_model(minilm, tmp_path):
    model = PoolingModel(bundled_model_dir(), backend="torch", state_dir=tmp_path)
    with pytest.raises(InvalidRequestError, match="one output, dense"):
        model.embed("a text", outputs=["dense"])
    with pytest.raises(ValueError, match="--score-method"):
        PoolingModel(bundled_model_dir(), backend="torch", score_method="sparse",
                     state_dir=tmp_path)


def test_openvino_serves_the_heads_on_its_hidden_states(m3_dir, reference, tmp_path):
    """The heads run after the backend's hidden states, so OpenVINO serves all three outputs."""
    pytest.importorskip("openvino")
    encode, score = reference
    model = PoolingModel(m3_dir, backend="openvino", score_method="hybrid", state_dir=tmp_path)
    assert model.backend.name == "openvino"
    for item, text in zip(model.embed(TEXTS, outputs=["dense", "sparse", "multi_vector"]).data,
                          TEXTS):
        check_item(item, encode(text))
    q = encode(QUERY)
    close(model.score(QUERY, TEXTS).data, [score(q, encode(t))["hybrid"] for t in TEXTS],
          atol=1e-4)
