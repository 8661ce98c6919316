"""LoRA adapters beside the base model (PROTOCOL 1.3, "Adapters"): a tiny BERT with two
adapters saved by PEFT, and a folder that ships its task adapters as PEFT subfolders named by
task (jina-embeddings-v3's layout), served by a worker and the offline PoolingModel, each
request equal to a PeftModel with that adapter run directly; requests with different adapters
in flight together never share a batch."""

import asyncio

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, BertModel

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.models import adapters as adapters_module
from poolwire.models.adapters import AdapterError
from poolwire.models.backend_choice import BackendError, build_backend
from poolwire.models.model import bundled_model_dir, load_model
from poolwire.offline import PoolingModel
from tests.helpers import close
from tests.model_zoo import _bert

pytestmark = pytest.mark.timeout(300)

peft = pytest.importorskip("peft", reason="the adapters extra: pip install 'poolwire[adapters]'")

TEXTS = ["Rivers flow downhill until they meet the ocean.", "A short one.",
         "The station was crowded before dawn."]
TASKS = ("retrieval.query", "retrieval.passage")


def save_lora(base_dir, folder, seed: int, targets: list[str]) -> None:
    """An adapter as PEFT saves it, with non-zero B matrices so it changes the outputs."""
    torch.manual_seed(seed)
    base = AutoModel.from_pretrained(base_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                             init_lora_weights=False)
    peft.get_peft_model(base, config).save_pretrained(folder)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    torch.manual_seed(11)
    config = _bert()
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    base = root / "base"
    BertModel(config).eval().save_pretrained(base)
    tokenizer.save_pretrained(base)
    save_lora(base, root / "legal", 1, ["query", "value"])
    save_lora(base, root / "medical", 2, ["key", "dense"])
    # jina-embeddings-v3's layout: the task adapters in subfolders named by task.
    tasks = root / "jina-like"
    BertModel(config).eval().save_pretrained(tasks)
    tokenizer.save_pretrained(tasks)
    for seed, task in enumerate(TASKS, start=3):
        save_lora(tasks, tasks / task, seed, ["query", "value"])
    return {"base": base, "legal": root / "legal", "medical": root / "medical", "tasks": tasks}


def peft_vectors(base_dir, adapter_dir, texts) -> np.ndarray:
    """PEFT's own output: a PeftModel with that adapter (None: the base model), its normalised
    CLS vectors (the folder's default pooling)."""
    tok = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModel.from_pretrained(base_dir).eval()
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir).eval()
    with torch.no_grad():
        out = [model(**tok(t, return_tensors="pt")).last_hidden_state[0, 0] for t in texts]
    return torch.nn.functional.normalize(torch.stack(out), dim=-1).numpy()


@pytest.fixture(scope="module")
def served(dirs):
    return load_model(dirs["base"], adapters={"legal": dirs["legal"], "medical": dirs["medical"]})


async def test_each_adapter_equals_peft_and_batches_never_mix(served, dirs, start_worker, nc,
                                                              prefix):
    want = {name: peft_vectors(dirs["base"], dirs.get(name), TEXTS)
            for name in (None, "legal", "medical")}
    assert np.abs(want["legal"] - want[None]).max() > 1e-3  # the adapters do change the output
    client = PoolingClient(nc, prefix=prefix)
    # A long max_wait_ms so that requests in flight together are planned into shared batches
    # whenever they may share one.
    async with start_worker(served, backend="torch", max_wait_ms=50.0) as worker:
        planner = worker.engine._planner
        planned = planner.next_batch
        batches: list[set] = []

        def recording():
            batch = planned()
            if batch:
                batches.append({item.payload[0].plan.spec.adapter for item in batch})
            return batch

        planner.next_batch = recording
        names = [None, "legal", "medical"] * 4
        replies = await asyncio.gather(*(
            client.embed(TEXTS, **({"adapter": n} if n else {})) for n in names))
        with pytest.raises(PoolingServiceError) as unknown:
            await client.embed(TEXTS[0], adapter="finance")
        described = worker.describe()
    for name, reply in zip(names, replies):
        close([d["data"] for d in reply["data"]], want[name])
    assert batches and all(len(adapters) == 1 for adapters in batches), batches
    assert len(batches) < len(names)  # requests of one adapter did share batches
    assert unknown.value.code == "invalid_request"
    assert unknown.value.error["adapters"] == ["legal", "medical"]
    assert described["adapters"] == "legal,medical" and described["backend"] == "torch"


async def test_task_adapter_subfolders_are_offered_by_name(dirs, start_worker, nc, prefix,
                                                           tmp_path):
    model = load_model(dirs["tasks"])
    assert model.adapter_names == sorted(TASKS)
    client = PoolingClient(nc, prefix=prefix)
    async with start_worker(model, backend="torch") as worker:
        query = await client.embed(TEXTS, adapter="retrieval.query")
        scored = await client.score(TEXTS[0], TEXTS[1:], adapter="retrieval.passage")
        assert worker.describe()["adapters"] == "retrieval.passage,retrieval.query"
    close([d["data"] for d in query["data"]],
          peft_vectors(dirs["tasks"], dirs["tasks"] / "retrieval.query", TEXTS))
    passage = peft_vectors(dirs["tasks"], dirs["tasks"] / "retrieval.passage", TEXTS)
    close([d["data"] for d in scored["data"]], passage[1:] @ passage[0])
    # Offline, the same adapters by the same names, on PoolingModel's encode too.
    offline = PoolingModel(dirs["tasks"], backend="torch", state_dir=tmp_path)
    close(offline.encode(TEXTS, pooling_task="embed", adapter="retrieval.query").data,
          peft_vectors(dirs["tasks"], dirs["tasks"] / "retrieval.query", TEXTS))


def test_offline_adapters_and_openvino_falls_back(served, dirs, tmp_path):
    model = PoolingModel(dirs["base"], backend="auto", state_dir=tmp_path,
                         adapters={"legal": dirs["legal"]})
    close(model.embed(TEXTS, adapter="legal").data, peft_vectors(dirs["base"], dirs["legal"], TEXTS))
    close(model.embed(TEXTS).data, peft_vectors(dirs["base"], None, TEXTS))
    # OpenVINO compiles the base model only: auto serves adapters with torch and says why;
    # openvino asked for is refused in one line.
    assert model.backend.name == "torch" and "adapters" in model.backend.reason
    with pytest.raises(BackendError, match="LoRA adapters"):
        build_backend("openvino", served, "exact", "float32", tmp_path)


def test_refused_in_one_line(dirs, monkeypatch):
    with pytest.raises(AdapterError, match="already ships an adapter named"):
        load_model(dirs["tasks"], adapters={"retrieval.query": dirs["legal"]})
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        load_model(dirs["base"], adapters={"x": dirs["base"]})
    monkeypatch.setattr(adapters_module, "peft_missing", lambda: "No module named 'peft'")
    with pytest.raises(AdapterError) as missing:
        load_model(dirs["base"], adapters={"legal": dirs["legal"]})
    assert "pip install 'poolwire[adapters]'" in str(missing.value)
    assert "\n" not in str(missing.value)
