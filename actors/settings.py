"""One settings object for the worker: the CLI, the environment (POOLWIRE_*, NATS_URL) and
tests all build a WorkerSettings."""

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Path | None = Field(None, description="model folder; default: the bundled all-MiniLM-L6-v2")
    model_name: str | None = Field(None, description="name in replies; default: the folder's name")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (CUDA when present)")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="the model's weights and activations")
    task: str | None = Field(None, description="the configured task; default: the priority rule")
    multitask: Literal["warn", "reject"] = Field(
        "warn", description="requests on other supported tasks: served with a warning, or refused")
    prefix: str = Field("pooling", description="subject prefix P: requests on P.<task>")
    queue: str = Field("poolwire", description="queue group shared by the workers")
    nats_url: str | None = Field(None, description="NATS server; none: start an embedded one")
    nats_port: int = Field(4222, description="port of the embedded nats-server (-1: any free port)")
    state_dir: Path = Field(Path(".poolwire"), description="embedded server's JetStream store")
    max_batch_tokens: int = Field(8192, ge=1, description="padded tokens per forward pass")
    max_batch_size: int = Field(64, ge=1, description="sequences per forward pass")
    max_wait_ms: float = Field(2.0, ge=0, description="wait for more work when a batch is not full")
    max_added_padding: int = Field(
        16, ge=0, description="an item joins a batch only if it adds at most this many padding tokens")
    max_queued_tokens: int = Field(262144, ge=1, description="admission bound; past it: overloaded")
    drain_timeout_s: float = Field(30.0, gt=0, description="how long a drain waits for in-flight work")

    @classmethod
    def env_name(cls, field: str) -> str:
        return "POOLWIRE_" + field.upper()

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "WorkerSettings":
        """Defaults, overridden by POOLWIRE_* (and NATS_URL), overridden by explicit values."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for name in cls.model_fields:
            raw = environ.get(cls.env_name(name))
            if raw not in (None, ""):
                values[name] = raw
        if "nats_url" not in values and environ.get("NATS_URL"):
            values["nats_url"] = environ["NATS_URL"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
