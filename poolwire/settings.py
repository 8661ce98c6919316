"""One settings model for the worker. pydantic-settings derives the environment variables
(POOLWIRE_<FIELD>) and the `poolwire serve` options (--field-name) from the fields below and
their descriptions, so the two can never disagree; tests build the same object directly."""

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, CliImplicitFlag, PydanticBaseSettingsSource, SettingsConfigDict

from poolwire.pooler_config import PoolerConfig, vllm_spelling

ENV_PREFIX = "POOLWIRE_"

# Variables every NATS tool reads, accepted under their usual names below POOLWIRE_<FIELD>.
PLAIN_ENV = {"nats_url": "NATS_URL", "nats_creds": "NATS_CREDS", "nats_nkey": "NATS_NKEY",
             "nats_user": "NATS_USER", "nats_password": "NATS_PASSWORD",
             "nats_token": "NATS_TOKEN", "nats_ca": "NATS_CA", "nats_cert": "NATS_CERT",
             "nats_key": "NATS_KEY"}


class _PlainNatsEnv(PydanticBaseSettingsSource):
    """NATS_URL and friends, as the nats CLI and client libraries name them."""

    def get_field_value(self, field, field_name):  # required by the base class; unused
        return None, field_name, False

    def __call__(self) -> dict[str, str]:
        return {f: os.environ[name] for f, name in PLAIN_ENV.items() if os.environ.get(name)}


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True,
                                      cli_kebab_case=True, cli_hide_none_type=True)

    model: Path | None = Field(
        None, description="model folder, or a Hugging Face hub id resolved through the local HF "
                          "cache (HF_HUB_CACHE); default: the bundled all-MiniLM-L6-v2")
    model_name: str | None = Field(None, description="name in replies; default: the folder's name")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (CUDA when present)")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="the model's weights and activations")
    precision: Literal["exact", "fast"] = Field(
        "exact", description="exact: the weights' own dtype; fast: float32 weights under bfloat16 "
                             "autocast (CPUs with native bfloat16, else float32) or float16 "
                             "autocast (CUDA)")
    reranker: str | None = Field(
        None, description="serve a decoder language model as a reranker that scores with token "
                          "logits (vLLM's hf-overrides names): 'classifier_from_token=no,yes "
                          "method=from_2_way_softmax template=qwen3-reranker'; template is "
                          "qwen3-reranker, mxbai-rerank-v2, bge-reranker-gemma or a .jinja file "
                          "(docs/MODELS.md)")
    backend: Literal["auto", "torch", "openvino"] = Field(
        "auto", description="what computes the model: openvino (CPU), torch, or auto: OpenVINO "
                            "on a CPU where it is installed, converts the model and gives "
                            "torch's outputs, else torch")
    openvino_threads: int | None = Field(
        None, ge=1, description="OpenVINO's inference threads (INFERENCE_NUM_THREADS); default: "
                                "OpenVINO's own, one per core under its LATENCY hint")
    # The task-policy settings are PoolerConfig's own fields (same names, defaults and
    # descriptions), validated through it (_through_pooler_config below).
    task: str | None = Field(None, description=PoolerConfig.model_fields["task"].description)
    multitask: Literal["warn", "reject"] = Field(
        "warn", description=PoolerConfig.model_fields["multitask"].description)
    chunked_processing: CliImplicitFlag[bool] = Field(
        False, description=PoolerConfig.model_fields["chunked_processing"].description)
    max_embed_len: int | None = Field(
        None, ge=1, description=PoolerConfig.model_fields["max_embed_len"].description)
    trust_remote_code: CliImplicitFlag[bool] = Field(
        False, description=PoolerConfig.model_fields["trust_remote_code"].description)
    pooler_config: PoolerConfig = Field(
        default_factory=PoolerConfig,
        description="vLLM's names for the five options above: --pooler-config.task T, or a JSON "
                    "object such as '{\"task\": \"embed\", \"chunked_processing\": true, "
                    "\"max_embed_len\": 4096}' (also "
                    "POOLWIRE_POOLER_CONFIG); a value given both here and by its own option must "
                    "agree")
    adapter: list[str] = Field(
        default_factory=list,
        description="a LoRA adapter saved by PEFT, served beside the base model: NAME=DIR "
                    "(repeat the option for more; POOLWIRE_ADAPTER takes a JSON list); requests "
                    "pick it with \"adapter\": NAME. A folder's own task adapters (PEFT "
                    "subfolders, as jina-embeddings-v3's) are offered without it")
    score_method: Literal["dense", "sparse", "multi_vector", "hybrid"] | None = Field(
        None, description="on a model with several outputs (BGE-M3): what score compares: "
                          "dense (cosine; the default), sparse (lexical weights' dot product), "
                          "multi_vector (ColBERT MaxSim averaged over the query's rows) or "
                          "hybrid (their weighted mean, --hybrid-weights)")
    hybrid_weights: str = Field(
        "0.4,0.2,0.4", description="with --score-method hybrid: the weights of dense, sparse "
                                   "and multi_vector, FlagEmbedding's compute_score weighting")
    prefix: str = Field("pooling", description="subject prefix P: requests on P.<task>")
    queue: str = Field("poolwire", description="queue group shared by the workers")
    allow_mixed_queue: bool = Field(
        False, description="start even when a worker serving another model or configured task "
                           "shares this prefix and queue group (NATS then splits requests "
                           "between them); by default such a worker refuses to start")
    nats_url: str | None = Field(
        None, description="NATS server, or every URL of a cluster comma-separated (also "
                          "NATS_URL; user:password@ or token@ in it work too); none: start an "
                          "embedded one")
    nats_creds: Path | None = Field(
        None, description="NATS credentials file, user JWT and NKey seed (also NATS_CREDS)")
    nats_nkey: Path | None = Field(None, description="NATS NKey seed file (also NATS_NKEY)")
    nats_user: str | None = Field(None, description="NATS user (also NATS_USER)")
    nats_password: SecretStr | None = Field(
        None, description="NATS password (also NATS_PASSWORD; prefer the variable to the option, "
                          "which other users can see in the process list)")
    nats_token: SecretStr | None = Field(None, description="NATS token (also NATS_TOKEN)")
    nats_ca: Path | None = Field(
        None, description="CA certificate file that signed the NATS server's (also NATS_CA)")
    nats_cert: Path | None = Field(
        None, description="TLS client certificate file, with --nats-key (also NATS_CERT)")
    nats_key: Path | None = Field(None, description="TLS client key file (also NATS_KEY)")
    nats_inbox_prefix: str | None = Field(
        None, description="prefix of this worker's own reply subjects (JetStream calls), for "
                          "permissions that keep each user's inbox apart; default _INBOX")
    nats_connect_timeout_s: float = Field(
        5.0, gt=0, description="at start, give up (exit 3) when NATS does not accept the "
                               "connection within this many seconds")
    nats_reconnect_wait_s: float = Field(
        0.25, gt=0, description="after a lost connection, wait between 1/2 and 1 times this "
                                "before each reconnect attempt (jitter)")
    probe_interval_s: float = Field(
        1.0, gt=0, description="self-check: send a probe through the server this often")
    probe_timeout_s: float = Field(
        3.0, gt=0, description="self-check: a probe not back within this many seconds while "
                               "connected means deaf: reconnect, then exit 4")
    health_file: Path | None = Field(
        None, description="heartbeat file for `poolwire health`; default: "
                          "<state-dir>/health.json")
    nats_port: int = Field(4222, description="port of the embedded nats-server (-1: any free port)")
    state_dir: Path = Field(Path(".poolwire"), description="the worker's own files: the embedded "
                           "server's JetStream store, OpenVINO's model cache, the health file")
    max_batch_tokens: int = Field(8192, ge=1, description="padded tokens per forward pass")
    max_batch_size: int = Field(64, ge=1, description="sequences per forward pass")
    max_wait_ms: float = Field(2.0, ge=0, description="wait for more work when a batch is not full")
    max_added_padding: int | Literal["auto"] | None = Field(
        None, description="an item joins a batch only if it adds at most this many padding "
                          "tokens; auto: measured at start, the padding that costs as much as "
                          "one more forward pass on this device and precision; default: auto "
                          "on CUDA, 16 on a CPU (32 for OpenVINO computing in bf16)")
    max_queued_tokens: int = Field(262144, ge=1, description="admission bound; past it: overloaded")
    max_image_pixels: int = Field(
        89_478_485, ge=1, description="multimodal models: an image of more pixels (width x "
                                      "height) is invalid_request; default: Pillow's "
                                      "decompression-bomb limit (MAX_IMAGE_PIXELS)")
    drain_timeout_s: float = Field(30.0, gt=0, description="how long a drain waits for in-flight work")
    durable: CliImplicitFlag[bool] = Field(False, description="also take durable jobs from P.jobs.<task> (JetStream)")
    durable_max_deliveries: int = Field(
        5, ge=1, description="deliveries of a failing durable job or document before P.dead.<task>")
    durable_ack_wait_s: float = Field(
        30.0, gt=0, description="a job unacked this long (worker gone) is delivered again")
    durable_capacity: int = Field(256, ge=1, description="durable jobs a worker holds unacked at once")
    durable_poison_span_s: float = Field(
        300.0, gt=0, description="a job delivered over --durable-max-deliveries times without an "
                                 "answer is dead-lettered once it is this old")
    durable_replicas: int = Field(1, ge=1, description="replicas of the jobs and dead-letter streams "
                                                       "and the failure-count bucket it creates")
    pipeline_stream: str | None = Field(None, description="consume this existing stream as a pipeline")
    pipeline_input: str | None = Field(
        None, description="pipeline input subjects <input>.> (e.g. docs.in)")
    pipeline_output: str | None = Field(
        None, description="results go to <output>.<rest of the input subject> (e.g. docs.embedded)")
    pipeline_text_field: str = Field("text", description="document field holding the text (or texts)")
    pipeline_image_field: str | None = Field(
        None, description="multimodal models: document field holding an image (bytes, or "
                          "{bucket, name} of an object in the NATS object store), used when a "
                          "document has it instead of the text field")
    pipeline_id_field: str | None = Field(
        None, description="document field holding its id; default: the stream sequence")
    pipeline_task: str | None = Field(None, description="pipeline task; default: the configured task")
    pipeline_truncate: CliImplicitFlag[bool] = Field(
        True, description="cut documents longer than the model's maximum instead of failing them "
                          "(an embed pipeline with --chunked-processing embeds them whole)")
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port); none: off")
    metrics_host: str = Field(
        "127.0.0.1", description="address the metrics server binds (0.0.0.0 in a container)")
    otlp_endpoint: str | None = Field(
        None, description="export OpenTelemetry traces over OTLP/HTTP (protobuf) to this base URL "
                          "(/v1/traces is added), e.g. http://127.0.0.1:4318; the standard "
                          "OTEL_EXPORTER_OTLP_* and OTEL_SERVICE_NAME variables work too; none "
                          "(and no OTEL_EXPORTER_OTLP_ENDPOINT): off")
    cache_bucket: str | None = Field(
        None, description="keep computed items in this JetStream key-value bucket (created if "
                          "missing), shared by every worker naming it; none: no result cache")
    cache_ttl: float = Field(
        7 * 24 * 3600.0, ge=0, description="seconds a cached item is kept, when this worker "
                                           "creates the bucket (0: for ever)")
    cache_max_bytes: int = Field(
        1 << 30, ge=-1, description="size of the bucket, when this worker creates it (-1: "
                                    "unbounded); a full bucket drops its oldest items")

    @field_validator("max_added_padding", mode="before")
    @classmethod
    def _tokens_or_auto(cls, value):
        # One message naming both forms, rather than one error per member of the union.
        if value is None or value == "auto" or (
                isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise ValueError(f"--max-added-padding {value!r}: give a number of tokens (0 or more) "
                         f"or auto")

    @field_validator("adapter")
    @classmethod
    def _adapters(cls, value):
        from poolwire.models.adapters import parse_adapter

        names = [parse_adapter(spec)[0] for spec in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"--adapter names {', '.join(twice)} more than once: give each "
                             f"adapter its own name")
        return value

    @field_validator("hybrid_weights")
    @classmethod
    def _weights(cls, value):
        from poolwire.models.m3 import parse_hybrid_weights

        parse_hybrid_weights(value)
        return value

    @property
    def adapters(self) -> dict[str, Path]:
        """--adapter NAME=DIR as {NAME: DIR}."""
        from poolwire.models.adapters import parse_adapter

        return dict(parse_adapter(spec) for spec in self.adapter)

    @property
    def hybrid(self) -> tuple[float, float, float]:
        from poolwire.models.m3 import parse_hybrid_weights

        return parse_hybrid_weights(self.hybrid_weights)

    @model_validator(mode="before")
    @classmethod
    def _through_pooler_config(cls, data):
        """Merge --pooler-config into --task & co., refusing a value given both ways that
        disagrees, and validate the result as one PoolerConfig."""
        if not isinstance(data, dict):
            return data
        return merge_pooler_config(data)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        # Explicit values, then POOLWIRE_*, then NATS_URL-style names (the CLI, when given, is
        # put above all of these by pydantic-settings itself).
        return init_settings, env_settings, _PlainNatsEnv(settings_cls)

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()


POOLER_FIELDS = tuple(PoolerConfig.model_fields)


def _one_field(name: str, value):
    """A single value as PoolerConfig reads it (so "true" from an option equals True)."""
    try:
        return getattr(PoolerConfig.model_validate(
            {name: value, **({"chunked_processing": True} if name == "max_embed_len" else {})}), name)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        raise ValueError(errors()[0]["msg"] if errors else str(exc)) from None


def merge_pooler_config(data: dict) -> dict:
    data = dict(data)
    nested = data.get("pooler_config")
    if isinstance(nested, PoolerConfig):
        nested = nested.model_dump(exclude_unset=True)
    elif isinstance(nested, str):
        import json

        try:
            nested = json.loads(nested)
        except ValueError:
            raise ValueError(f"--pooler-config {nested!r} is not a JSON object: give e.g. "
                             f"'{{\"task\": \"embed\"}}', or --pooler-config.task embed") from None
    if nested is not None and not isinstance(nested, dict):
        raise ValueError(f"--pooler-config {nested!r} is not a JSON object: give e.g. "
                         f"'{{\"task\": \"embed\"}}', or --pooler-config.task embed")
    nested = vllm_spelling(dict(nested or {}))
    unknown = sorted(set(nested) - set(POOLER_FIELDS))
    if unknown:
        raise ValueError(f"--pooler-config has no {', '.join(unknown)}: its keys are "
                         f"{', '.join(POOLER_FIELDS)}")
    for name, value in nested.items():
        if value is None:
            continue
        if data.get(name) is not None and _one_field(name, data[name]) != _one_field(name, value):
            flag = name.replace("_", "-")
            raise PydanticCustomError(
                "pooler_config_conflict",
                "--{flag} {own} (or {env}) conflicts with --pooler-config.{flag} {value} (or "
                "--pooler-config JSON, POOLWIRE_POOLER_CONFIG): they name the same setting; "
                "give one of them, or the same value",
                {"flag": flag, "own": data[name], "env": ENV_PREFIX + name.upper(),
                 "value": value})
        data[name] = value
    given = {n: data[n] for n in POOLER_FIELDS if data.get(n) is not None}
    data["pooler_config"] = PoolerConfig.model_validate(given)
    return data
