"""The model zoo over NATS (issue 11): for every zoo model and every task it supports, what a
poolwire worker answers equals what Sentence-Transformers (`SentenceTransformer.encode` with the
same prompt, `CrossEncoder.predict`) or the transformers model run directly here computes, to
1e-5 in float32; NER entities equal the transformers pipeline's for each aggregation."""

import json

import numpy as np
import pytest
import torch
from transformers.activations import ACT2FN

from poolwire.client import PoolingClient, PoolingServiceError
from tests.helpers import close, rows
from tests.model_zoo import MATRYOSHKA, PROMPTS

pytestmark = pytest.mark.timeout(300)

TEXTS = ["Angela Merkel visited Paris.", "A short one.",
         "The committee questions a careful experiment after a long debate in Berlin."]
QUERY, DOCS = "where is the station", ["the station is north of the river", "a red car"]


def normalised(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


def activation(logits: torch.Tensor, kind: str) -> np.ndarray:
    out = {"softmax": lambda t: torch.softmax(t, -1), "sigmoid": torch.sigmoid,
           "none": lambda t: t}[kind](logits)
    return out.numpy()


def per_text(model, texts, fn) -> list[np.ndarray]:
    """fn(encoded one text, unpadded) -> [1, T, ...] tensor; rows of each text."""
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = model.tokenizer(text, return_tensors="pt")
            out.append(fn(enc)[0].numpy())
    return out


def st_model(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def _tokens_in(model, texts, prefix="") -> int:
    return sum(len(model.tokenizer(prefix + t)["input_ids"]) for t in texts)


# ---- Sentence-Transformers embedders ----

@pytest.mark.parametrize("name", ["st_mean_dense", "st_mean_dense_old", "qwen3_st"])
async def test_sentence_transformers_embedders(zoo, zoo_dirs, start_worker, nc, prefix, name):
    """Both layouts of the mean+Dense+Normalize model give the vectors Sentence-Transformers
    gives from the current layout; the Qwen3 decoder pools its last token (its tokenizer pads on
    the left in Sentence-Transformers, on the right in poolwire)."""
    model = zoo(name)
    reference = st_model(zoo_dirs["st_mean_dense" if name.startswith("st_mean") else name])
    want = reference.encode(TEXTS, convert_to_numpy=True)
    if name == "st_mean_dense_old":  # the old layout is one Sentence-Transformers still reads
        close(st_model(zoo_dirs[name]).encode(TEXTS, convert_to_numpy=True), want)
    base = reference[0].auto_model
    token_rows = per_text(model, TEXTS, lambda enc: base(
        input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state)
    if name.startswith("st_mean"):  # vLLM applies the Dense projection to token rows too
        dense = reference[2]
        token_rows = [dense({"sentence_embedding": torch.from_numpy(r)})["sentence_embedding"]
                      .detach().numpy() for r in token_rows]
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        embed = await client.embed(TEXTS)
        tokens = await client.token_embed(TEXTS)
        score = await client.score(QUERY, DOCS)
    close(np.stack(rows(embed)), want)
    assert embed["usage"]["prompt_tokens"] == _tokens_in(model, TEXTS)
    assert len(want[0]) == model.embedding_size == (16 if name.startswith("st_mean") else 32)
    for got, raw in zip(rows(tokens), token_rows):
        close(got, normalised(torch.from_numpy(raw)).numpy())  # the Normalize module's default
    q, d = reference.encode([QUERY], convert_to_numpy=True), reference.encode(DOCS, convert_to_numpy=True)
    close([item["data"] for item in score["data"]], (d @ q[0]).tolist())


async def test_prompts_dimensions_and_use_activation(zoo, zoo_dirs, start_worker, nc, prefix):
    """CLS pooling with the folder's prompts: the default prompt, a named one, a literal one,
    on embed and on both sides of a bi-encoder score; prompt tokens count in usage."""
    model = zoo("st_cls_prompts")
    reference = st_model(zoo_dirs["st_cls_prompts"])
    enc = lambda texts, **kw: reference.encode(texts, convert_to_numpy=True, **kw)  # noqa: E731
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        default = await client.embed(TEXTS)
        passage = await client.embed(TEXTS, prompt_name="passage")
        literal = await client.embed(TEXTS, prompt="custom: ")
        cut = await client.embed(TEXTS, dimensions=16)
        activated = await client.embed(TEXTS, use_activation=True)
        score = await client.score(QUERY, DOCS, prompt_name="passage")
        with_tokens = await client.token_embed(TEXTS[0], return_tokens=True)
        errors = []
        for field, options in [("dimensions", {"dimensions": 12}),
                               ("prompt_name", {"prompt_name": "nope"}),
                               ("prompt", {"prompt": "x", "prompt_name": "query"}),
                               ("use_activation", {"normalize": True, "use_activation": False}),
                               ("prompt_name", {"input": [[101, 2000, 102]], "prompt_name": "query"})]:
            with pytest.raises(PoolingServiceError) as info:
                await client.request("embed", {"input": TEXTS[0], **options})
            assert info.value.code == "invalid_request" and info.value.error["field"] == field
            errors.append(info.value.error["message"])
    close(np.stack(rows(default)), enc(TEXTS))  # default_prompt_name "query"
    close(np.stack(rows(default)), enc(TEXTS, prompt_name="query"))
    close(np.stack(rows(passage)), enc(TEXTS, prompt_name="passage"))
    close(np.stack(rows(literal)), enc(TEXTS, prompt="custom: "))
    close(np.stack(rows(cut)), enc(TEXTS, truncate_dim=16))  # no Normalize module: not normalised
    close(np.stack(rows(activated)), normalised(torch.from_numpy(enc(TEXTS))).numpy())
    assert default["usage"]["prompt_tokens"] == _tokens_in(model, TEXTS, PROMPTS["query"])
    assert literal["usage"]["prompt_tokens"] == _tokens_in(model, TEXTS, "custom: ")
    q = normalised(torch.from_numpy(enc([QUERY], prompt_name="passage")))
    d = normalised(torch.from_numpy(enc(DOCS, prompt_name="passage")))
    close([item["data"] for item in score["data"]], (d @ q[0]).numpy())
    assert ", ".join(map(str, MATRYOSHKA)) in errors[0] and "passage, query" in errors[1]
    item = with_tokens["data"][0]
    prompted = model.tokenizer(PROMPTS["query"] + TEXTS[0])
    assert item["tokens"] == model.tokenizer.convert_ids_to_tokens(prompted["input_ids"])
    assert len(item["tokens"]) == len(item["data"])
    # [CLS], the prompt's own tokens and [SEP] have no span in the input; the rest map back.
    prompt_len = len(model.tokenizer(PROMPTS["query"])["input_ids"]) - 1
    assert all(span is None for span in item["offsets"][:prompt_len] + item["offsets"][-1:])
    words = [TEXTS[0][a:b].lower() for a, b in item["offsets"][prompt_len:-1]]
    assert words == [t.removeprefix("##") for t in item["tokens"][prompt_len:-1]]


async def test_a_causal_lm_folder_whose_modules_say_last_token_pooling_embeds_with_it(
        zoo, zoo_dirs, start_worker, nc, prefix):
    """A Qwen3ForCausalLM folder with Qwen3-Embedding's modules.json (last-token Pooling,
    Normalize): the decoder's last hidden state, normalised. Without those modules the folder
    is refused (tests/test_llm_rerankers_e2e.py)."""
    from transformers import Qwen3ForCausalLM

    model = zoo("qwen3_plain")
    assert (model.architecture, model.pooling_method, model.normalize_default) == \
        ("Qwen3ForCausalLM", "last", True)
    lm = Qwen3ForCausalLM.from_pretrained(zoo_dirs["qwen3_plain"]).eval()
    hidden = per_text(model, TEXTS, lambda enc: lm.model(
        input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state)
    want = np.stack([normalised(torch.from_numpy(r[-1])).numpy() for r in hidden])
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        got = await client.embed(TEXTS)
        tokens = await client.token_embed(TEXTS)
        score = await client.score(TEXTS[0], TEXTS[1:])
    close(np.stack(rows(got)), want)
    for got_rows, raw in zip(rows(tokens), hidden):
        close(got_rows, normalised(torch.from_numpy(raw)).numpy())
    close([i["data"] for i in score["data"]], want[1:] @ want[0])


# ---- classifiers ----

def token_head_by_hand(model, hidden: torch.Tensor) -> torch.Tensor:
    """Each architecture's classification head written out, on every token (vLLM's
    token_classify): independent of how poolwire applies the model's modules."""
    m = model.module
    if hasattr(m, "pre_classifier"):                                  # DistilBERT
        return m.classifier(torch.relu(m.pre_classifier(hidden)))
    if hasattr(m, "pooler"):                                          # DeBERTa ContextPooler
        act = ACT2FN[m.config.pooler_hidden_act]
        return m.classifier(act(m.pooler.dense(hidden)))
    if hasattr(m, "score"):                                           # decoders
        return m.score(hidden)
    if hasattr(m.classifier, "out_proj"):                             # RoBERTa, XLM-R
        return m.classifier.out_proj(torch.tanh(m.classifier.dense(hidden)))
    return m.classifier(hidden)                                       # BERT


def reference_classifier(model, kind: str):
    def logits(texts):
        with torch.inference_mode():  # one text at a time: a decoder without pad id needs it
            return torch.cat([model.module(**{
                k: v for k, v in model.tokenizer(t, return_tensors="pt").items()
                if k != "token_type_ids" or model.takes_token_types}).logits for t in texts])

    def tokens(enc):
        return token_head_by_hand(model, model.module.base_model(**{
            k: v for k, v in enc.items() if k != "token_type_ids" or model.takes_token_types}
        ).last_hidden_state)

    return activation(logits(TEXTS), kind), [activation(torch.from_numpy(r), kind)
                                             for r in per_text(model, TEXTS, tokens)]


@pytest.mark.parametrize("name, kind", [("roberta3", "softmax"), ("xlmr3", "softmax"),
                                        ("distil_seq", "softmax"), ("deberta_seq", "softmax"),
                                        ("regression", "none"), ("qwen3_seq", "sigmoid")])
async def test_sequence_classifiers(zoo, start_worker, nc, prefix, name, kind):
    """classify, and token_classify with the model's own head on every token; a regression
    head (problem_type regression) is returned unchanged, as vLLM does."""
    model = zoo(name)
    want, want_tokens = reference_classifier(model, kind)
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        got = await client.classify(TEXTS)
        raw = await client.classify(TEXTS, use_activation=False)
        tokens = await client.token_classify(TEXTS)
        score = await client.score(QUERY, DOCS) if model.num_labels == 1 else None
    close(np.stack(rows(got)), want)
    close(np.stack(rows(raw)), activation(torch.from_numpy(want), "none") if kind == "none"
          else reference_classifier(model, "none")[0])
    for got_rows, want_rows in zip(rows(tokens), want_tokens):
        close(got_rows, want_rows)
    if score is not None:  # one label: also a cross-encoder, identity for regression
        with torch.inference_mode():
            pairs = [model.tokenizer(QUERY, d, return_tensors="pt") for d in DOCS]
            want_scores = torch.cat([model.module(**{
                k: v for k, v in p.items() if k != "token_type_ids" or model.takes_token_types}
            ).logits[:, 0] for p in pairs])
        close([i["data"] for i in score["data"]], activation(want_scores, kind))


@pytest.mark.parametrize("name", ["roberta1_ce", "xlmr1_ce"])
async def test_cross_encoders_score_as_cross_encoder_predict(zoo, zoo_dirs, start_worker, nc,
                                                             prefix, name):
    """The activation the CrossEncoder saved (Identity for roberta1_ce, Sigmoid for xlmr1_ce)
    is the one poolwire applies, on score, classify and token_classify."""
    from sentence_transformers import CrossEncoder

    model = zoo(name)
    kind = {"roberta1_ce": "none", "xlmr1_ce": "sigmoid"}[name]
    assert model.activation_kind == kind
    want_scores = CrossEncoder(str(zoo_dirs[name]), device="cpu").predict(
        [(QUERY, d) for d in DOCS], convert_to_numpy=True)
    want, want_tokens = reference_classifier(model, kind)
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        score = await client.score(QUERY, DOCS)
        got = await client.classify(TEXTS)
        tokens = await client.token_classify(TEXTS)
        with pytest.raises(PoolingServiceError) as info:  # no prompts on a cross-encoder
            await client.score(QUERY, DOCS, prompt="query: ")
    assert "warnings" not in score  # score is computed with the configured classify
    close([i["data"] for i in score["data"]], want_scores)
    close(np.stack(rows(got)), want)
    for got_rows, want_rows in zip(rows(tokens), want_tokens):
        close(got_rows, want_rows)
    assert info.value.error["field"] == "prompt"


@pytest.mark.parametrize("name", ["distil_tok", "deberta_tok", "ner"])
async def test_token_classifiers(zoo, start_worker, nc, prefix, name):
    model = zoo(name)
    want = per_text(model, TEXTS, lambda enc: torch.softmax(model.module(**{
        k: v for k, v in enc.items() if k != "token_type_ids" or model.takes_token_types}).logits, -1))
    async with start_worker(model):
        got = await PoolingClient(nc, prefix=prefix).token_classify(TEXTS)
    for got_rows, want_rows in zip(rows(got), want):
        close(got_rows, want_rows)


@pytest.mark.parametrize("name", ["ner", "distil_tok"])
async def test_entities_equal_the_transformers_pipeline(zoo, start_worker, nc, prefix, name):
    from transformers import pipeline

    model = zoo(name)
    pipe = pipeline("token-classification", model=model.module, tokenizer=model.tokenizer,
                    device="cpu")
    async with start_worker(model):
        client = PoolingClient(nc, prefix=prefix)
        replies = {agg: await client.token_classify(TEXTS, aggregation=agg, return_tokens=True)
                   for agg in ("simple", "first", "max")}
        streamed = [f async for f in client.stream("token_classify", {
            "input": TEXTS[0], "aggregation": "first", "return_tokens": True})]
        plain = await client.token_classify(TEXTS, aggregation="none")
    assert all("entities" not in item and "tokens" not in item for item in plain["data"])
    for agg, reply in replies.items():
        assert any(item["entities"] for item in reply["data"]), agg  # something to compare
        for text, item in zip(TEXTS, reply["data"]):
            want = pipe(text, aggregation_strategy=agg)
            got = item["entities"]
            assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in got] == \
                [(e["entity_group"], e["word"], e["start"], e["end"]) for e in want], agg
            close([e["score"] for e in got], [float(e["score"]) for e in want])
    item = replies["simple"]["data"][0]
    enc = model.tokenizer(TEXTS[0], return_offsets_mapping=True, return_special_tokens_mask=True)
    assert item["tokens"] == model.tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert item["offsets"] == [None if s else list(span) for span, s in
                               zip(enc["offset_mapping"], enc["special_tokens_mask"])]
    items = [f for f in streamed if "index" in f]
    # The streamed text computes alone (a one-row pass), the replies' in a batch of three: the
    # same entities, scores within float32 rounding.
    alone, batched = items[0]["entities"] if items else None, replies["first"]["data"][0]["entities"]
    assert alone is not None and [{k: v for k, v in e.items() if k != "score"} for e in alone] == \
        [{k: v for k, v in e.items() if k != "score"} for e in batched]
    close([e["score"] for e in alone], [e["score"] for e in batched])
    assert sum((f["tokens"] for f in items), []) == item["tokens"]


# ---- task selection (vLLM's cases per model kind) and model folders ----

@pytest.mark.parametrize("name, supported, default", [
    ("st_mean_dense", "embed,token_embed,score", "embed"),
    ("qwen3_plain", "embed,token_embed,score", "embed"),
    ("roberta3", "classify,token_classify", "classify"),
    ("roberta1_ce", "classify,token_classify,score", "classify"),
    ("xlmr1_ce", "classify,token_classify,score", "classify"),
    ("distil_seq", "classify,token_classify", "classify"),
    ("deberta_seq", "classify,token_classify", "classify"),
    ("regression", "classify,token_classify,score", "classify"),
    ("qwen3_seq", "classify,token_classify,score", "classify"),
    ("deberta_tok", "token_classify", "token_classify"),
    ("ner", "token_classify", "token_classify"),
])
def test_task_selection_per_model_kind(zoo, name, supported, default):
    """Start-up task, supported tasks, `--task score` refused, and the verdict on a score
    request: served when computed with the configured task, deprecated otherwise."""
    from poolwire.actors.task_policy import TaskConfigError, Verdict
    from poolwire.actors.worker import task_policy_for
    from poolwire.schemas.tasks import Task
    from poolwire.settings import WorkerSettings

    model = zoo(name)
    policy = task_policy_for(model, WorkerSettings())
    assert ",".join(t.value for t in policy.supported) == supported
    assert policy.configured.value == default
    with pytest.raises(TaskConfigError, match="not a task a deployment is configured for"):
        task_policy_for(model, WorkerSettings(task="score"))
    if "score" not in supported:
        assert policy.judge(Task.SCORE) == Verdict.UNSUPPORTED
        return
    assert policy.judge(Task.SCORE) == Verdict.SERVE
    other = "token_embed" if default == "embed" else "token_classify"
    warn = task_policy_for(model, WorkerSettings(task=other))
    reject = task_policy_for(model, WorkerSettings(task=other, multitask="reject"))
    if default == "embed":
        # PROTOCOL 1.2: a token_embed deployment scores by late interaction (MaxSim), served.
        assert warn.judge(Task.SCORE) == reject.judge(Task.SCORE) == Verdict.SERVE
    else:
        assert warn.judge(Task.SCORE) == Verdict.DEPRECATED
        assert reject.judge(Task.SCORE) == Verdict.NOT_CONFIGURED
    assert warn.judge(Task(default)) == Verdict.DEPRECATED


def _hub_cache(root, repo_id: str, folder, commit: str):
    """The layout huggingface_hub keeps: models--org--name/{refs/main, snapshots/<commit>/}."""
    import shutil

    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)


async def test_a_hub_id_resolves_through_the_cache_and_shows_its_revision(
        zoo_dirs, tmp_path, monkeypatch, start_worker, nc, prefix):
    from poolwire.models.model import load_model

    commit = "0123456789abcdef0123456789abcdef01234567"
    _hub_cache(tmp_path, "zoo-org/cls-prompts", zoo_dirs["st_cls_prompts"], commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    model = load_model("zoo-org/cls-prompts")
    assert (model.name, model.revision, model.pooling_method) == ("zoo-org/cls-prompts", commit, "cls")
    with pytest.raises(ValueError) as info:
        load_model("zoo-org/not-in-the-cache")
    message = str(info.value)
    assert "\n" not in message and "'zoo-org/not-in-the-cache'" in message
    assert "local" in message and "HF_HUB_CACHE" in message and "HF_HUB_OFFLINE" in message
    async with start_worker(model) as worker:
        info_reply = await nc.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"", timeout=5)
        reply = await PoolingClient(nc, prefix=prefix).embed("hello")
    assert json.loads(info_reply.data)["metadata"]["model_revision"] == commit
    assert reply["model"] == "zoo-org/cls-prompts"


def test_serve_with_a_hub_id_not_in_the_cache_says_how_models_load(tmp_path):
    """`poolwire serve --model org/name`, offline, with an empty cache: exit 2 and one line."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "POOLWIRE_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "poolwire", "serve", "--model", "zoo-org/absent",
                           "--nats-url", "nats://127.0.0.1:1"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("poolwire:")]
    assert len(lines) == 1 and "'zoo-org/absent'" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
