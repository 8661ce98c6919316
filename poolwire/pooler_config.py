"""The task-policy settings of one deployment, as vLLM names them (`PoolerConfig`): which task
it is configured for, what happens to requests on other tasks, and chunked processing of
inputs longer than the model. The offline `PoolingModel` takes one directly; a worker's
`WorkerSettings` validates its own fields of the same names through it (settings.py), so the
two cannot drift apart."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Chunked processing accepts this many times the model's maximum length by default
# (PROTOCOL.md "Longer than the model").
MAX_EMBED_LEN_FACTOR = 8


# vLLM's PoolerConfig key for chunked_processing, accepted as a synonym.
VLLM_CHUNKED = "enable_chunked_processing"


def vllm_spelling(data):
    """{"enable_chunked_processing": x} as {"chunked_processing": x}; both that disagree is
    an error naming both."""
    if not isinstance(data, dict) or VLLM_CHUNKED not in data:
        return data
    data = dict(data)
    value = data.pop(VLLM_CHUNKED)
    if data.get("chunked_processing") not in (None, value):
        raise ValueError(f"{VLLM_CHUNKED} {value!r} and chunked_processing "
                         f"{data['chunked_processing']!r} disagree: give one of them")
    data["chunked_processing"] = value
    return data


class PoolerConfig(BaseModel):
    """`PoolerConfig(task="embed")`, as vLLM's offline API is told its one task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str | None = Field(None, description="the configured task; default: the priority rule")
    multitask: Literal["warn", "reject"] = Field(
        "warn", description="requests on other supported tasks: served with a warning, or refused")
    chunked_processing: bool = Field(
        False, description="embed inputs longer than the model's maximum length (up to "
                           "max_embed_len tokens) in chunks of that length, the item being the "
                           "chunks' token-weighted mean (vLLM's enable_chunked_processing)")
    max_embed_len: int | None = Field(
        None, ge=1, description="with chunked processing, the longest embed input accepted, in "
                                "tokens; default: 8 x the model's maximum length")
    # Not a task-policy setting, but set wherever the task is (the CLI, POOLWIRE_*, --pooler-config
    # JSON, PoolerConfig offline), so one place says what a deployment agreed to run.
    trust_remote_code: bool = Field(
        False, description="run the Python code a model folder names in its config.json or "
                           "tokenizer_config.json (auto_map); off: such a folder is refused at "
                           "start")

    @model_validator(mode="before")
    @classmethod
    def _vllm_spelling(cls, data):
        return vllm_spelling(data)

    @model_validator(mode="after")
    def _max_embed_len_needs_chunking(self):
        if self.max_embed_len is not None and not self.chunked_processing:
            raise ValueError(f"max_embed_len {self.max_embed_len} applies only with chunked "
                             f"processing: also set chunked_processing (--chunked-processing), "
                             f"or leave max_embed_len out")
        return self

    def embed_limit(self, max_length: int) -> int | None:
        """The longest embed input accepted with chunking, or None without it. A limit below
        the model's own maximum would refuse inputs the model takes whole: an error naming both."""
        if not self.chunked_processing:
            return None
        limit = self.max_embed_len or MAX_EMBED_LEN_FACTOR * max_length
        if limit < max_length:
            raise ValueError(f"max_embed_len {limit} is below the model's maximum length "
                             f"{max_length}: give at least {max_length}, or leave it out for "
                             f"{MAX_EMBED_LEN_FACTOR} x {max_length}")
        return limit
