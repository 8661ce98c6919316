"""Reply frames of PROTOCOL.md. The engine builds frames as plain dicts on its hot path; these
models are the contract those dicts keep, and tests validate real frames against them."""

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

Vector = list[float]
ItemData = Union[float, Vector, list[Vector]]
# Raw little-endian elements; base64 text in JSON. (An alias: the field itself is named `bytes`.)
RawBytes = Union[bytes, str]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Frame):
    prompt_tokens: int = Field(description="tokens the model saw, special tokens included")
    total_tokens: int = Field(description="equal to prompt_tokens for pooling")


class Entity(_Frame):
    """A span grouped as the transformers token-classification pipeline groups it."""

    entity_group: str
    score: float
    word: str
    start: int = Field(description="character offset in the input")
    end: int


Span = Union[list[int], None]  # [start, end] in the input; None for special tokens


class FloatItem(_Frame):
    index: int = Field(description="position of the input (or pair) in the request")
    data: ItemData = Field(description="vector, label scores, score, or token rows")
    offset: int | None = Field(None, description="token-level tasks: first token row in this frame")
    tokens: list[str] | None = Field(None, description="return_tokens: the rows' token strings")
    offsets: list[Span] | None = Field(None, description="return_tokens: the rows' character spans")
    entities: list[Entity] | None = Field(None, description="aggregation: grouped entity spans")


class BinaryItem(_Frame):
    index: int
    dtype: Literal["float32", "float16", "bfloat16"]
    shape: list[int] = Field(description="[D], [T, D] or [] for a score")
    bytes: RawBytes
    offset: int | None = None
    tokens: list[str] | None = None
    offsets: list[Span] | None = None
    entities: list[Entity] | None = None


Item = Union[FloatItem, BinaryItem]


class OneReply(_Frame):
    """The whole answer in one message (`stream` false)."""

    request_id: str
    model: str
    task: str
    data: list[Item]
    usage: Usage
    labels: list[str] | None = Field(None, description="classifier label names, by position")
    warnings: list[str] | None = None


class StreamItemFrame(_Frame):
    """One item (or a slice of a token-level item's rows) of a streamed reply."""

    request_id: str
    index: int
    data: ItemData | None = None
    offset: int | None = None
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    shape: list[int] | None = None
    bytes: RawBytes | None = None
    tokens: list[str] | None = None
    offsets: list[Span] | None = None
    entities: list[Entity] | None = None


class DoneFrame(_Frame):
    request_id: str
    done: Literal[True]
    model: str
    task: str
    usage: Usage
    labels: list[str] | None = None
    warnings: list[str] | None = None


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # code-specific keys: field, supported_tasks, ...

    code: str
    message: str


class ErrorFrame(_Frame):
    request_id: str
    error: ErrorBody
