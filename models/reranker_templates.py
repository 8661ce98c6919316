"""The prompt templates of rerankers that score with token logits, for folders that do not ship
one (the hub's original Qwen3-Reranker, mxbai-rerank v2 and bge-reranker-v2-gemma folders carry
a general chat template, or none). Each is a Jinja chat template in the convention
Sentence-Transformers 6 renders pairs with: the query is the message of role `query`, the
document the message of role `document`, and an instruction (Sentence-Transformers' prompt,
PROTOCOL's `instruction`) a message of role `system`. Written from each model card's own
prompt-building code, so a folder served with `--reranker template=NAME` sees the tokens its card
computes; a Sentence-Transformers folder's own chat_template.jinja is used instead where it has
one."""

# Each template takes its three parts the same way. A template ends in an expression, not a
# newline: Jinja as transformers runs it drops a template's last newline.
_PARTS = (
    "{%- set instruction = messages | selectattr('role', 'eq', 'system') "
    "| map(attribute='content') | first -%}"
    "{%- set query = messages | selectattr('role', 'eq', 'query') "
    "| map(attribute='content') | first -%}"
    "{%- set document = messages | selectattr('role', 'eq', 'document') "
    "| map(attribute='content') | first -%}"
)

# Qwen3-Reranker's model card: format_instruction between its prefix and suffix; the default
# instruction is the card's.
QWEN3_RERANKER = _PARTS + (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
    "<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {{ instruction | default('Given a web search query, retrieve relevant passages "
    "that answer the query', true) }}\n"
    "<Query>: {{ query }}\n<Document>: {{ document }}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{{ '' }}"
)

# mxbai-rerank v2 (mixedbread's MxbaiRerankV2): Qwen's chat prefix, the optional instruction,
# the query and document, the task prompt, the chat suffix; no instruction by default.
MXBAI_RERANK_V2 = _PARTS + (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n<|im_start|>user\n"
    "{% if instruction %}instruction: {{ instruction }}\n{% endif %}"
    "query: {{ query }}\ndocument: {{ document }}\n"
    "You are a search relevance expert who evaluates how well documents match search queries. "
    "For each query-document pair, carefully analyze the semantic relationship between them, "
    "then provide your binary relevance judgment (0 for not relevant, 1 for relevant).\n"
    "Relevance:<|im_end|>\n<|im_start|>assistant\n{{ '' }}"
)

# bge-reranker-v2-gemma's model card (get_inputs): BOS, "A: query", "\n", "B: passage", "\n",
# the prompt; no instruction (the card's prompt is fixed).
BGE_RERANKER_GEMMA = _PARTS + (
    "{{ bos_token }}A: {{ query }}\nB: {{ document }}\n"
    "Given a query A and a passage B, determine whether the passage contains an answer to the "
    "query by providing a prediction of either 'Yes' or 'No'."
)

TEMPLATES = {"qwen3-reranker": QWEN3_RERANKER, "mxbai-rerank-v2": MXBAI_RERANK_V2,
             "bge-reranker-gemma": BGE_RERANKER_GEMMA}
