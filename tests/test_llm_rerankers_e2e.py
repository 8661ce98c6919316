"""Rerankers that score with token logits (PROTOCOL.md 1.3, issue 27): each family of the zoo,
served by a worker and by PoolingModel, equals its model card's own computation run here with
transformers (its prompt built the card's way, the logits at the last position, the card's
softmax or logit), or `CrossEncoder.predict` for a Sentence-Transformers 6 folder, to 1e-5; a
decoder folder that says neither how to pool nor how to score is refused in one line."""

import functools
import json

import numpy as np
import pytest
import torch

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.models.model import load_model
from poolwire.models.token_logits import parse_reranker_option
from tests.helpers import close
from tests.model_zoo import RERANKER_OPTIONS, build_llm_rerankers

pytestmark = pytest.mark.timeout(300)

QUERY = "where is the station"
DOCS = ["the station is north of the river", "a red car", "Paris is in France.",
        "Jupiter is the largest planet."]
INSTRUCTION = "find passages about trains"
FAMILIES = ["qwen3_reranker", "qwen3_reranker_st", "qwen3_reranker_seq", "mxbai_rerank_v2",
            "bge_reranker_gemma"]


@pytest.fixture(scope="module")
def reranker_dirs(tmp_path_factory):
    return build_llm_rerankers(tmp_path_factory.mktemp("rerankers"))


@pytest.fixture(scope="module")
def rerankers(reranker_dirs):
    loaded: dict = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_model(reranker_dirs[name], reranker=RERANKER_OPTIONS.get(name))
        return loaded[name]

    return get


# ---- the model cards' own computations, one pair at a time (no padding) ----

@functools.cache
def _lm(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


@functools.cache
def _tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _last_logits(folder, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return _lm(folder)(input_ids=torch.tensor([ids])).logits[0, -1]


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def qwen3_card(folder, pairs, instruction=None) -> tuple[np.ndarray, list[int]]:
    """Qwen3-Reranker's model card: prefix + format_instruction + suffix, P(yes) from the
    log-softmax of the "no" and "yes" logits; also the raw log-odds, and each prompt's length."""
    tok = _tokenizer(folder)
    prefix = ("<|im_start|>system\nJudge whether the Document meets the requirements based on "
              "the Query and the Instruct provided. Note that the answer can only be \"yes\" or "
              "\"no\".<|im_end|>\n<|im_start|>user\n")
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    instruction = instruction or "Given a web search query, retrieve relevant passages that answer the query"
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    scores, raw, lengths = [], [], []
    for query, doc in pairs:
        ids = _ids(tok, prefix) + tok(f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}")[
            "input_ids"] + _ids(tok, suffix)
        logits = _last_logits(folder, ids)
        pair = torch.stack([logits[no], logits[yes]]).log_softmax(dim=0).exp()
        scores.append(pair[1].item())
        raw.append((logits[yes] - logits[no]).item())
        lengths.append(len(ids))
    return np.array(scores), np.array(raw), lengths


def mxbai_card(folder, pairs, instruction=None):
    """mxbai-rerank v2 (MxbaiRerankV2): prefix, [instruction + sep], query, sep, document, sep,
    task prompt, suffix; logit("1") - logit("0"), whose sigmoid is the two-way softmax."""
    tok = _tokenizer(folder)
    prefix = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
              "assistant.<|im_end|>\n<|im_start|>user\n")
    task = ("You are a search relevance expert who evaluates how well documents match search "
            "queries. For each query-document pair, carefully analyze the semantic relationship "
            "between them, then provide your binary relevance judgment (0 for not relevant, 1 "
            "for relevant).\nRelevance:")
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    pos, neg = _ids(tok, "1")[0], _ids(tok, "0")[0]
    raw, lengths = [], []
    for query, doc in pairs:
        text = f"query: {query}"
        if instruction:
            text = f"instruction: {instruction}\n" + text
        ids = (_ids(tok, prefix) + _ids(tok, text) + _ids(tok, "\n") + _ids(tok, f"document: {doc}")
               + _ids(tok, "\n") + _ids(tok, task) + _ids(tok, suffix))
        logits = _last_logits(folder, ids)
        raw.append((logits[pos] - logits[neg]).item())
        lengths.append(len(ids))
    raw = np.array(raw)
    return 1 / (1 + np.exp(-raw)), raw, lengths


def gemma_card(folder, pairs, instruction=None):
    """bge-reranker-v2-gemma's model card (get_inputs): BOS + "A: query", sep + "B: passage",
    sep + prompt; the "Yes" logit (the card's score), its sigmoid (FlagEmbedding's normalize)."""
    assert instruction is None
    tok = _tokenizer(folder)
    prompt = ("Given a query A and a passage B, determine whether the passage contains an answer "
              "to the query by providing a prediction of either 'Yes' or 'No'.")
    yes = _ids(tok, "Yes")[0]
    raw, lengths = [], []
    for query, doc in pairs:
        ids = ([tok.bos_token_id] + _ids(tok, f"A: {query}") + _ids(tok, "\n")
               + _ids(tok, f"B: {doc}") + _ids(tok, "\n") + _ids(tok, prompt))
        raw.append(_last_logits(folder, ids)[yes].item())
        lengths.append(len(ids))
    raw = np.array(raw)
    return 1 / (1 + np.exp(-raw)), raw, lengths


def reference(name, folder, pairs, instruction=None):
    """(scores, raw logits, prompt lengths) as the family's own code computes them."""
    if name == "qwen3_reranker_st":
        from sentence_transformers import CrossEncoder

        ce = CrossEncoder(str(folder), device="cpu")
        kw = {"prompt": instruction} if instruction else {}
        raw = np.asarray(ce.predict(pairs, activation_fn=torch.nn.Identity(), **kw))
        scores = 1 / (1 + np.exp(-raw))  # the folder's saved activation, Sigmoid
        assert "Sigmoid" in type(ce.activation_fn).__name__
        _, _, lengths = qwen3_card(folder, pairs, instruction)
        return np.asarray(scores), np.asarray(raw), lengths
    card = {"qwen3_reranker": qwen3_card, "qwen3_reranker_seq": qwen3_card,
            "mxbai_rerank_v2": mxbai_card, "bge_reranker_gemma": gemma_card}[name]
    # The conversion's reference is the original's card on the original's weights.
    source = folder.parent / "qwen3-reranker" if name == "qwen3_reranker_seq" else folder
    return card(source, pairs, instruction)


# ---- served by a worker and offline ----

@pytest.mark.parametrize("name", FAMILIES)
async def test_each_family_equals_its_model_card(rerankers, reranker_dirs, start_worker, nc,
                                                 prefix, name):
    """Pair form, rerank form (ordered by the card's score, top_n, documents), raw logits
    with use_activation false, the template's tokens in usage, discovery's score_method."""
    model = rerankers(name)
    pairs = [(QUERY, d) for d in DOCS]
    want, raw, lengths = reference(name, reranker_dirs[name], pairs)
    instructed = name != "bge_reranker_gemma"
    if instructed:  # Qwen3-Reranker's <Instruct> (the ST folder's prompt), mxbai's line
        with_instruction, _, _ = reference(name, reranker_dirs[name], pairs[:2], INSTRUCTION)
        assert not np.allclose(with_instruction, want[:2], atol=1e-7)
    async with start_worker(model, backend="torch") as worker:
        client = PoolingClient(nc, prefix=prefix)
        if instructed:
            got = await client.rerank(QUERY, DOCS[:2], instruction=INSTRUCTION)
            close([i["data"] for i in sorted(got["data"], key=lambda i: i["index"])],
                  with_instruction.tolist())
        else:
            with pytest.raises(PoolingServiceError) as info:
                await client.score(QUERY, DOCS[:1], instruction=INSTRUCTION)
            assert info.value.code == "invalid_request"
            assert info.value.error["field"] == "instruction"
            assert "has no instruction" in info.value.error["message"]
        score = await client.score(QUERY, DOCS)
        plain = await client.score(QUERY, DOCS, use_activation=False)
        ranked = await client.rerank(QUERY, DOCS, top_n=3, return_documents=True)
        streamed = [f async for f in client.stream("score", {"text_1": QUERY, "text_2": DOCS})]
        info = await nc.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"", timeout=5)
    close([i["data"] for i in score["data"]], want.tolist())
    close([i["data"] for i in plain["data"]], raw.tolist())
    assert score["usage"]["prompt_tokens"] == sum(lengths)
    order = list(np.argsort(-want, kind="stable")[:3])
    assert [i["index"] for i in ranked["data"]] == order
    assert [i["document"] for i in ranked["data"]] == [DOCS[j] for j in order]
    close([i["data"] for i in ranked["data"]], want[order].tolist())
    items = sorted((f["index"], f["data"]) for f in streamed if "index" in f)
    close([data for _, data in items], want.tolist())
    metadata = json.loads(info.data)["metadata"]
    assert metadata["score_method"] == "token-logits"
    assert metadata["supported_tasks"] == "classify,score"


def test_instruction_on_any_other_model_is_invalid_request(small_models):
    from poolwire.models.model_fields import ModelFacts, check_model_fields
    from poolwire.schemas.errors import PoolingError
    from poolwire.schemas.requests import parse_request
    from poolwire.schemas.tasks import Task

    request = parse_request(Task.SCORE, {"text_1": QUERY, "text_2": DOCS[0], "instruction": "x"})
    with pytest.raises(PoolingError) as info:
        check_model_fields(Task.SCORE, request, ModelFacts.of(small_models["seq1"]))
    assert info.value.code == "invalid_request" and info.value.extra["field"] == "instruction"
    assert "is not one" in info.value.message


async def test_lengths_truncation_keeps_the_template_suffix(rerankers, reranker_dirs,
                                                            start_worker, nc, prefix):
    """Over the maximum: input_too_long naming the index; truncated, the prompt keeps the
    template's tail (where the model reads its answer) and equals the card on the cut prompt."""
    model = rerankers("qwen3_reranker")
    long_doc = " ".join(["station"] * 600)
    template = model.prompt_template
    [full] = template.pairs([QUERY], [long_doc], None, None, "right", 10_000)
    keep = 64
    cut = full.ids[:keep - len(template.suffix)] + template.suffix
    want = torch.stack([(lambda l: l[[template.tokenizer.convert_tokens_to_ids(t) for t in ("no", "yes")]])(
        _last_logits(reranker_dirs["qwen3_reranker"], cut))]).softmax(-1)[0, 1].item()
    async with start_worker(model, backend="torch"):
        client = PoolingClient(nc, prefix=prefix)
        with pytest.raises(PoolingServiceError) as info:
            await client.score(QUERY, [DOCS[0], long_doc])
        got = await client.score(QUERY, long_doc, truncate_prompt_tokens=keep)
    assert info.value.code == "input_too_long" and info.value.error["index"] == 1
    close([got["data"][0]["data"]], [want])
    assert got["usage"]["prompt_tokens"] == keep


@pytest.mark.parametrize("name", ["qwen3_reranker"])
def test_pooling_model_on_openvino_equals_the_card(reranker_dirs, tmp_path, name):
    """Offline, with --backend auto: OpenVINO converts the decoder with its folded answer
    head and gives the card's scores (torch serves where OpenVINO is not installed). One
    family here: a conversion costs about 45 s on the test machine; mxbai-rerank v2 and
    bge-reranker-v2-gemma converted and matched too when run with this test (docs/MODELS.md)."""
    import importlib.util

    from poolwire import PoolingModel

    pm = PoolingModel(str(reranker_dirs[name]), reranker=RERANKER_OPTIONS[name], device="cpu",
                      backend="auto", state_dir=tmp_path)
    if importlib.util.find_spec("openvino") is not None:
        assert pm.backend.name == "openvino"
    want, _, _ = reference(name, reranker_dirs[name], [(QUERY, d) for d in DOCS])
    close(np.asarray(pm.score(QUERY, DOCS)), want)
    ranked = pm.rerank(QUERY, DOCS)
    assert ranked.indices == list(np.argsort(-want, kind="stable"))


# ---- no guessing ----

async def test_a_bare_decoder_folder_is_refused_in_one_line_naming_both_ways(
        reranker_dirs, tmp_path, capsys):
    """The hub's Qwen3-Reranker folder without --reranker: load_model refuses it, and
    `poolwire serve` exits 2 with that one line (before any NATS connection)."""
    from poolwire.cli import serve
    from poolwire.settings import WorkerSettings

    with pytest.raises(ValueError) as info:
        load_model(reranker_dirs["qwen3_reranker"])
    message = str(info.value)
    assert "\n" not in message and "Pooling module" in message and "--reranker" in message
    code = await serve(WorkerSettings(model=reranker_dirs["qwen3_reranker"], state_dir=tmp_path,
                                      nats_url="nats://127.0.0.1:1"))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("poolwire:")]
    assert code == 2 and lines == [f"poolwire: {message}"]


@pytest.mark.parametrize("option, fragment", [
    ("classifier_from_token=no,yes", "template=... is missing"),
    ("template=qwen3-reranker method=softmax classifier_from_token=no,yes", "is not one of"),
    ("template=qwen3-reranker method=from_2_way_softmax classifier_from_token=yes",
     "needs two tokens"),
    ("template=qwen3-reranker tokens=no,yes", "is not one of"),
    ("template=nope", None),
])
def test_the_reranker_option_is_checked(reranker_dirs, option, fragment):
    if fragment is not None:
        with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
            parse_reranker_option(option)
        return
    with pytest.raises(ValueError, match="neither one of"):
        load_model(reranker_dirs["qwen3_reranker"], reranker=option)


def test_an_answer_token_must_be_one_token(reranker_dirs):
    with pytest.raises(ValueError, match="not one"):
        load_model(reranker_dirs["qwen3_reranker"],
                   reranker="classifier_from_token=no,yes!? template=qwen3-reranker")
