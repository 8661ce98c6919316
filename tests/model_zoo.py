"""The model zoo (issue 11): the kinds of models users deploy, built tiny from configs (hidden
32, 2 layers, random but seeded weights, the MiniLM tokenizer) and saved as users find them:
Sentence-Transformers folders written by sentence_transformers itself where that is the norm,
plain transformers folders otherwise."""

import json
import shutil
from pathlib import Path

import torch
from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification,
                          BertForMaskedLM, BertForTokenClassification, BertModel, DebertaV2Config,
                          DebertaV2ForSequenceClassification, DebertaV2ForTokenClassification,
                          DistilBertConfig, DistilBertForSequenceClassification,
                          DistilBertForTokenClassification, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3Model,
                          RobertaConfig, RobertaForSequenceClassification, XLMRobertaConfig,
                          XLMRobertaForSequenceClassification)

VOCAB = 30522  # the MiniLM (BERT uncased) tokenizer's
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
PROMPTS = {"query": "query: ", "passage": "passage: "}
MATRYOSHKA = [8, 16, 32]


def _labels(n: int, names: list[str] | None = None) -> dict:
    names = names or [f"LABEL_{chr(65 + i)}" for i in range(n)]
    return {"num_labels": n, "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)}}


def _bert(**extra) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=512, **extra)


def _roberta(cls, **extra):
    # type_vocab_size 2 and pad id 0: the BERT tokenizer sends segment ids 0/1 for pairs and
    # pads with id 0, which a real RoBERTa tokenizer would not.
    return cls(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=514, type_vocab_size=2,
               pad_token_id=0, **extra)


def _deberta(**extra) -> DebertaV2Config:
    return DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=512, pad_token_id=0, **extra)


def _distilbert(**extra) -> DistilBertConfig:
    return DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                            max_position_embeddings=512, pad_token_id=0, **extra)


def _qwen3(pad_token_id: int | None = 0, **extra) -> Qwen3Config:
    return Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       intermediate_size=64, max_position_embeddings=512,
                       pad_token_id=pad_token_id, **extra)


def _save_hf(folder: Path, model, tokenizer_dir: Path, padding_side: str = "right") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.padding_side = padding_side
    tok.save_pretrained(folder)
    return folder


def _sentence_transformer(folder: Path, base: Path, pooling: str, dense: int | None,
                          normalize: bool, **kwargs) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    modules = [models.Transformer(str(base)), models.Pooling(32, pooling)]
    if dense:
        modules.append(models.Dense(32, dense))
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu", **kwargs).save(str(folder))
    return folder


def _pooling_modules(folder: Path, mode: str) -> Path:
    """A plain transformers folder given the modules.json a Sentence-Transformers folder states
    its pooling with (Transformer at the root, Pooling, Normalize), written by hand as
    Qwen3-Embedding's are: the weights stay the CausalLM's own."""
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode": mode}))
    (folder / "2_Normalize").mkdir()
    return folder


def _cross_encoder(folder: Path, base: Path, activation: torch.nn.Module | None) -> Path:
    from sentence_transformers import CrossEncoder

    CrossEncoder(str(base), device="cpu", activation_fn=activation).save(str(folder))
    return folder


def to_old_layout(new: Path, old: Path) -> Path:
    """The same model in the layout Sentence-Transformers 2.x wrote: per-mode pooling flags,
    `sentence_transformers.models.*` module types, max_seq_length in sentence_bert_config.json."""
    shutil.copytree(new, old)
    modules = json.loads((old / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rpartition(".")[2]
    (old / "modules.json").write_text(json.dumps(modules))
    pooling = json.loads((old / "1_Pooling" / "config.json").read_text())
    mode = pooling.pop("pooling_mode")
    pooling.pop("embedding_dimension", None)
    pooling.update({"word_embedding_dimension": 32, "pooling_mode_cls_token": mode == "cls",
                    "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
                    "pooling_mode_mean_sqrt_len_tokens": False,
                    "pooling_mode_weightedmean_tokens": False,
                    "pooling_mode_lasttoken": mode == "lasttoken"})
    (old / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    # The current layout keeps the maximum in the tokenizer's model_max_length.
    max_len = json.loads((new / "tokenizer_config.json").read_text())["model_max_length"]
    (old / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_len,
                                                               "do_lower_case": False}))
    return old


def colbert_pylate(folder: Path, base: Path, out_features: int = 16) -> Path:
    """A ColBERT folder as PyLate saves it: the Transformer at the root, then a bias-free
    `Dense` projection of every token row, no Pooling module, PyLate's own settings (query and
    document prefixes, lengths, MaxSim) in config_sentence_transformers.json."""
    from safetensors.torch import save_file

    shutil.copytree(base, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 180,
                                                                  "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "query_prefix": "[unused0]", "document_prefix": "[unused1]", "query_length": 32,
        "document_length": 180, "attend_to_expansion_tokens": False, "skiplist_words": ["!"],
        "do_query_expansion": True, "similarity_fn_name": "MaxSim", "prompts": {},
        "default_prompt_name": None}))
    dense = folder / "1_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({
        "in_features": 32, "out_features": out_features, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity"}))
    save_file({"linear.weight": torch.randn(out_features, 32) / 32 ** 0.5},
              str(dense / "model.safetensors"))
    return folder


def sparse_encoder(folder: Path, base: Path, pooling: str = "max",
                   activation: str = "relu") -> Path:
    """A Sentence-Transformers SparseEncoder folder (MLMTransformer + SpladePooling), saved by
    `SparseEncoder.save` itself."""
    import warnings

    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLMTransformer's deprecation in favour of Transformer
        SparseEncoder(modules=[MLMTransformer(str(base)), SpladePooling(pooling, activation)],
                      device="cpu").save(str(folder))
    return folder


def build_zoo(root: Path, tokenizer_dir: Path) -> dict[str, Path]:
    """Every zoo model, each from its own seed."""
    zoo: dict[str, Path] = {}

    def seeded(seed: int):
        torch.manual_seed(seed)

    seeded(11)
    base = _save_hf(root / "_bert_base", BertModel(_bert(), add_pooling_layer=False), tokenizer_dir)
    zoo["st_mean_dense"] = _sentence_transformer(root / "st-mean-dense", base, "mean", 16, True)
    zoo["st_mean_dense_old"] = to_old_layout(zoo["st_mean_dense"], root / "st-mean-dense-old")

    seeded(12)
    base = _save_hf(root / "_bert_base2", BertModel(_bert(), add_pooling_layer=False), tokenizer_dir)
    config = json.loads((base / "config.json").read_text())
    config["matryoshka_dimensions"] = MATRYOSHKA
    (base / "config.json").write_text(json.dumps(config))
    zoo["st_cls_prompts"] = _sentence_transformer(root / "st-cls-prompts", base, "cls", None,
                                                  False, prompts=PROMPTS,
                                                  default_prompt_name="query")

    seeded(13)
    base = _save_hf(root / "_qwen3", Qwen3Model(_qwen3()), tokenizer_dir, padding_side="left")
    zoo["qwen3_st"] = _sentence_transformer(root / "qwen3-st", base, "lasttoken", None, True)
    seeded(14)
    # As decoder embedders often ship (Qwen3-Embedding's config names Qwen3ForCausalLM, and
    # its modules.json says last-token pooling and Normalize; without them such a folder is
    # refused, PROTOCOL 1.3).
    zoo["qwen3_plain"] = _pooling_modules(_save_hf(root / "qwen3-plain", Qwen3ForCausalLM(_qwen3()),
                                                   tokenizer_dir), "lasttoken")

    seeded(15)
    # No pad_token_id, as in many decoder configs: transformers itself then refuses batches.
    zoo["qwen3_seq"] = _save_hf(root / "qwen3-seq", Qwen3ForSequenceClassification(
        _qwen3(pad_token_id=None, **_labels(1))), tokenizer_dir)

    seeded(21)
    zoo["roberta3"] = _save_hf(root / "roberta3", RobertaForSequenceClassification(
        _roberta(RobertaConfig, **_labels(3))), tokenizer_dir)
    seeded(22)
    base = _save_hf(root / "_roberta1", RobertaForSequenceClassification(
        _roberta(RobertaConfig, **_labels(1))), tokenizer_dir)
    # Identity, not CrossEncoder's default sigmoid: the folder's saved choice must win.
    zoo["roberta1_ce"] = _cross_encoder(root / "roberta1-ce", base, torch.nn.Identity())
    seeded(23)
    zoo["xlmr3"] = _save_hf(root / "xlmr3", XLMRobertaForSequenceClassification(
        _roberta(XLMRobertaConfig, **_labels(3))), tokenizer_dir)
    seeded(24)
    base = _save_hf(root / "_xlmr1", XLMRobertaForSequenceClassification(
        _roberta(XLMRobertaConfig, **_labels(1))), tokenizer_dir)
    zoo["xlmr1_ce"] = _cross_encoder(root / "xlmr1-ce", base, torch.nn.Sigmoid())

    seeded(31)
    zoo["regression"] = _save_hf(root / "regression", BertForSequenceClassification(
        _bert(problem_type="regression", **_labels(1))), tokenizer_dir)
    seeded(32)
    zoo["distil_seq"] = _save_hf(root / "distil-seq", DistilBertForSequenceClassification(
        _distilbert(**_labels(3))), tokenizer_dir)
    seeded(33)
    zoo["distil_tok"] = _save_hf(root / "distil-tok", DistilBertForTokenClassification(
        _distilbert(**_labels(5, NER_LABELS))), tokenizer_dir)
    seeded(34)
    zoo["deberta_seq"] = _save_hf(root / "deberta-seq", DebertaV2ForSequenceClassification(
        _deberta(**_labels(3))), tokenizer_dir)
    seeded(35)
    zoo["deberta_tok"] = _save_hf(root / "deberta-tok", DebertaV2ForTokenClassification(
        _deberta(**_labels(5, NER_LABELS))), tokenizer_dir)
    seeded(36)
    zoo["ner"] = _save_hf(root / "bert-ner", BertForTokenClassification(
        _bert(**_labels(5, NER_LABELS))), tokenizer_dir)

    # PROTOCOL 1.2: late interaction and sparse models.
    seeded(41)
    base = _save_hf(root / "_bert_colbert", BertModel(_bert(), add_pooling_layer=False),
                    tokenizer_dir)
    zoo["colbert"] = colbert_pylate(root / "colbert", base)
    seeded(42)
    base = _save_hf(root / "_bert_mlm", BertForMaskedLM(_bert()), tokenizer_dir)
    zoo["splade_max"] = sparse_encoder(root / "splade-max", base, "max", "relu")
    zoo["splade_sum"] = sparse_encoder(root / "splade-sum", base, "sum", "log1p_relu")
    return zoo


# Issue 27's families that OpenVINO needed a different trace for (models/traceable_attention.py).
EMBEDDING_GEMMA_PROMPTS = {"query": "task: search result | query: ",
                           "document": "title: none | text: "}


def embedding_gemma(folder: Path, tokenizer_dir: Path, seed: int = 61) -> Path:
    """EmbeddingGemma's layout: a Gemma3TextModel with bidirectional attention (a sliding
    layer whose window, 4 here, is shorter than the texts, then a full one), mean pooling, two
    bias-free Dense modules (up, then down), Normalize, and its retrieval prompts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import Gemma3TextConfig, Gemma3TextModel

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              intermediate_size=64, max_position_embeddings=512, pad_token_id=0,
                              query_pre_attn_scalar=16, use_bidirectional_attention=True,
                              sliding_window=4,
                              layer_types=["sliding_attention", "full_attention"])
    base = _save_hf(folder.with_name("_" + folder.name), Gemma3TextModel(config), tokenizer_dir)
    identity = torch.nn.Identity()
    modules = [models.Transformer(str(base)), models.Pooling(32, "mean"),
               models.Dense(32, 64, bias=False, activation_function=identity),
               models.Dense(64, 24, bias=False, activation_function=identity),
               models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu", prompts=EMBEDDING_GEMMA_PROMPTS,
                        similarity_fn_name="cosine").save(str(folder))
    return folder


def modernbert_cross_encoder(folder: Path, tokenizer_dir: Path, seed: int = 62) -> Path:
    """A ModernBERT cross-encoder: one label, mean pooling over the tokens (as
    `classifier_pooling: mean` rerankers ship), local attention of 8 (a window shorter than
    the texts, so padded rows see no key), layers full, local, full."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    torch.manual_seed(seed)
    config = ModernBertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                              num_attention_heads=2, intermediate_size=64,
                              max_position_embeddings=512, pad_token_id=0, cls_token_id=101,
                              sep_token_id=102, bos_token_id=101, eos_token_id=102,
                              local_attention=8, global_attn_every_n_layers=2,
                              classifier_pooling="mean", **_labels(1))
    base = _save_hf(folder.with_name("_" + folder.name),
                    ModernBertForSequenceClassification(config), tokenizer_dir)
    return _cross_encoder(folder, base, torch.nn.Sigmoid())


# ---- PROTOCOL 1.3: rerankers that score with token logits (issue 27) ----

RERANK_TEXTS = ["where is the station", "the station is north of the river", "a red car",
                "Which planet is largest?", "Jupiter is the largest planet.", "Paris is in France.",
                "Judge the fit of a passage", "find passages about trains"]
# The option each original hub folder is served with (docs/MODELS.md).
RERANKER_OPTIONS = {
    "qwen3_reranker": "classifier_from_token=no,yes method=from_2_way_softmax template=qwen3-reranker",
    "qwen3_reranker_seq": "template=qwen3-reranker",
    "mxbai_rerank_v2": "classifier_from_token=0,1 method=from_2_way_softmax template=mxbai-rerank-v2",
    "bge_reranker_gemma": "classifier_from_token=Yes method=no_post_processing template=bge-reranker-gemma",
}
_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>"]


def reranker_tokenizer(folder: Path, family: str, chat_template: str | None = None):
    """A tiny tokenizer holding the answer tokens as single tokens and the family's special
    tokens (MiniLM's lowercasing WordPiece has no "Yes", no <|im_start|>), saved as
    tokenizer.json: for Qwen a byte-level BPE trained here on the templates and test texts (as
    the hub ships Qwen's, which transformers loads as Qwen2Tokenizer for a qwen2 config), for
    Gemma a word-level one where words and every other character are tokens of their own."""
    from tokenizers import Regex, Tokenizer, decoders, models as tk_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from poolwire.models.reranker_templates import TEMPLATES

    corpus = list(TEMPLATES.values()) + RERANK_TEXTS + \
        ["yes no 0 1 Yes No <think> </think> first instruction second one 2 3 4"] * 20
    if family == "gemma":
        specials = _GEMMA_SPECIALS
        splitter = pre_tokenizers.Split(Regex(r"\w+|[^\w]"), behavior="isolated")
        words = sorted({piece for text in corpus for piece, _ in splitter.pre_tokenize_str(text)})
        vocab = {tok: i for i, tok in enumerate(["<unk>"] + specials + words)}
        tok = Tokenizer(tk_models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = splitter
        tok.add_special_tokens(specials)
        extra = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                 "unk_token": "<unk>"}
    else:
        specials = _QWEN_SPECIALS
        tok = Tokenizer(tk_models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(corpus, trainers.BpeTrainer(
            vocab_size=700, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        extra = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=512,
                                   chat_template=chat_template, **extra)
    fast.save_pretrained(folder)
    return fast


# Qwen's general chat template, as the hub's Qwen3-Reranker folder ships one: not the
# reranker's prompt, which is why such a folder needs --reranker template=...
_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_llm_rerankers(root: Path) -> dict[str, Path]:
    """Qwen3-Reranker (the hub's Qwen3ForCausalLM folder; the same weights as a
    Sentence-Transformers 6 CrossEncoder folder with LogitScore and its chat template; vLLM's
    sequence-classification conversion), mxbai-rerank v2 (Qwen2, untied LM head) and
    bge-reranker-v2-gemma (Gemma): tiny, seeded, saved as the hub ships them."""
    from sentence_transformers import CrossEncoder
    from transformers import (GemmaConfig, GemmaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    from poolwire.models.reranker_templates import QWEN3_RERANKER

    out: dict[str, Path] = {}
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, intermediate_size=64,
                 max_position_embeddings=512)

    folder = root / "qwen3-reranker"
    tok = reranker_tokenizer(folder, "qwen", _CHATML)
    torch.manual_seed(51)
    lm = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), tie_word_embeddings=True,
                                      pad_token_id=tok.pad_token_id, **small)).eval()
    lm.save_pretrained(folder)
    out["qwen3_reranker"] = folder

    st = root / "qwen3-reranker-st"
    shutil.copytree(folder, st)
    (st / "chat_template.jinja").write_text(QWEN3_RERANKER)
    CrossEncoder(str(st), device="cpu").save(str(st))  # its own modules: Transformer + LogitScore
    out["qwen3_reranker_st"] = st

    seq = root / "qwen3-reranker-seq"
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    conv = Qwen3ForSequenceClassification(Qwen3Config(
        vocab_size=len(tok), pad_token_id=tok.pad_token_id, **_labels(1), **small)).eval()
    conv.model.load_state_dict(lm.model.state_dict())
    with torch.no_grad():  # vLLM's convert_model_to_seq_cls.py, from_2_way_softmax
        weight = lm.get_output_embeddings().weight
        conv.score.weight.copy_((weight[yes] - weight[no])[None])
    conv.save_pretrained(seq)
    reranker_tokenizer(seq, "qwen", _CHATML)
    out["qwen3_reranker_seq"] = seq

    folder = root / "mxbai-rerank-v2"
    tok = reranker_tokenizer(folder, "qwen", _CHATML)
    torch.manual_seed(52)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), tie_word_embeddings=False,
                                 pad_token_id=tok.pad_token_id,
                                 **{k: v for k, v in small.items() if k != "head_dim"})
                     ).eval().save_pretrained(folder)
    out["mxbai_rerank_v2"] = folder

    folder = root / "bge-reranker-v2-gemma"
    tok = reranker_tokenizer(folder, "gemma")
    torch.manual_seed(53)
    GemmaForCausalLM(GemmaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                 **small)).eval().save_pretrained(folder)
    out["bge_reranker_gemma"] = folder
    return out


# ---- Issue 27's encoder families served right on torch, each built as the hub ships it ----

NOMIC_PROMPTS = {"query": "search_query: ", "document": "search_document: "}


def _encoder_config(family: str, **extra):
    """Hidden 32, 2-3 layers, MiniLM's vocabulary and pad id 0 (its tokenizer pads with 0)."""
    from transformers import GteConfig, ModernBertConfig, MPNetConfig, NomicBertConfig

    small = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                 pad_token_id=0, **extra)
    if family == "modernbert":
        # Local attention of 8 (shorter than the long test text) in the middle layer.
        return ModernBertConfig(num_hidden_layers=3, max_position_embeddings=512,
                                cls_token_id=101, sep_token_id=102, bos_token_id=101,
                                eos_token_id=102, local_attention=8,
                                global_attn_every_n_layers=2, **small)
    if family == "mpnet":
        return MPNetConfig(num_hidden_layers=2, max_position_embeddings=514, **small)
    if family == "nomic_bert":
        return NomicBertConfig(num_hidden_layers=2, head_dim=16, max_position_embeddings=512,
                               **small)
    if family == "gte":
        return GteConfig(num_hidden_layers=2, max_position_embeddings=512, type_vocab_size=2,
                         **small)
    raise ValueError(family)


def build_encoder_families(root: Path, tokenizer_dir: Path) -> dict[str, Path]:
    """ModernBERT (modernbert-embed's layout: mean, Normalize), MPNet (all-mpnet-base-v2's:
    mean, Normalize), NomicBERT (nomic-embed-text's: mean, Normalize, its query/document
    prompts), GTE (gte-base-en-v1.5's: CLS, no Normalize) as Sentence-Transformers folders
    written by Sentence-Transformers itself, and a ModernBERT token classifier as a plain
    transformers folder; all native in transformers, none needing remote code."""
    from transformers import (GteModel, ModernBertForTokenClassification, ModernBertModel,
                              MPNetModel, NomicBertModel)

    out: dict[str, Path] = {}
    for seed, (name, cls, family, pooling, normalize, prompts) in enumerate([
            ("modernbert_st", ModernBertModel, "modernbert", "mean", True, None),
            ("mpnet_st", MPNetModel, "mpnet", "mean", True, None),
            ("nomic_st", NomicBertModel, "nomic_bert", "mean", True, NOMIC_PROMPTS),
            ("gte_st", GteModel, "gte", "cls", False, None)], start=71):
        torch.manual_seed(seed)
        base = _save_hf(root / f"_{name}", cls(_encoder_config(family)), tokenizer_dir)
        out[name] = _sentence_transformer(root / name.replace("_", "-"), base, pooling, None,
                                          normalize, **({"prompts": prompts} if prompts else {}))
    torch.manual_seed(75)
    out["modernbert_tok"] = _save_hf(root / "modernbert-tok", ModernBertForTokenClassification(
        _encoder_config("modernbert", **_labels(5, NER_LABELS))), tokenizer_dir)
    return out
