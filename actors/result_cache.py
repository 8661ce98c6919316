"""The shared result cache (`--cache-bucket`): computed items kept in a JetStream key-value
bucket, so every worker that names the bucket serves what any of them computed, across
restarts.

The key of an item is a digest of everything that decides its numbers and of nothing else:
the model's files, how it is computed (backend, precision, dtype, device type), the task, every
request field that is not known to leave the numbers alone, and the item's input. Fields are
left out by name (`NOT_IN_KEY`), not taken in by name, so a field added to the protocol later
is part of the key until someone decides otherwise: a changed model or option can never hit.

Per item: a request whose items are partly cached computes only the others; hits skip
tokenizing and the forward pass, and their stored arrays and token counts make the same reply
a computation would. Only tasks whose item is one sequence's output (embed, classify) are
cached; token-level tasks (their items carry tokens, offsets, entities) and score (pairs) are
computed as before.

The cache never fails a request. A lookup is bounded by a short timeout; a bucket that is
unreachable, deleted, full or slow means computing as if there were no cache: one warning per
outage, the `poolwire_cache_errors` metric, and a pause before the bucket is tried again.
`key_of` and `fingerprint` are pure and tested alone; `ResultCache` is the I/O.
"""

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import msgpack
import numpy as np

from poolwire.models.model_source import LOCAL_REVISION
from poolwire.models.task_heads import Forward, PoolSpec, TaskPlan
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import Task

log = logging.getLogger(__name__)

CACHE_FORMAT = 1                  # part of every key: a change of what is stored misses
CACHED_TASKS = frozenset({Task.EMBED, Task.CLASSIFY})
# Request fields that never change an item's numbers: who asked, how the reply is framed or
# encoded (the cache keeps the float array before encoding), when and in which order it runs.
NOT_IN_KEY = frozenset({"input", "text_1", "text_2", "request_id", "stream", "deadline_ms",
                        "priority", "encoding_format", "embed_dtype", "cache"})
LOOKUP_TIMEOUT_S = 0.25           # a slow bucket costs a request at most this
SLOW_LOOKUPS = 3                  # lookups in a row past the timeout before the pause
STORE_TIMEOUT_S = 2.0
RETRY_AFTER_S = 5.0               # after a failure the bucket is left alone this long
MAX_PENDING_STORES = 256          # stores in flight; past it new results are not stored


@dataclass(frozen=True)
class Identity:
    """What, besides the request, decides the numbers: the same on every worker that would
    compute the same ones."""

    model_files: str   # fingerprint() of the model folder
    backend: str       # torch, openvino, ...
    precision: str     # exact or fast, as served
    dtype: str
    device: str        # the device type (cpu, cuda): kernels differ between them

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(
            [CACHE_FORMAT, self.model_files, self.backend, self.precision, self.dtype,
             self.device]).encode()).hexdigest()


def fingerprint(folder: Path, revision: str = LOCAL_REVISION) -> str:
    """The model's files: a hub revision names them; a local folder is hashed (every file's
    path and contents), so two copies of the same model agree and any edit differs."""
    if revision != LOCAL_REVISION:
        return f"revision:{revision}"
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue  # .cache/, .git/: not the model
        h.update(str(rel).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return "files:" + h.hexdigest()


def options_of(request: PoolingRequest) -> str:
    """The request fields that decide the numbers, as canonical JSON (one per request)."""
    return json.dumps(request.model_dump(mode="json", exclude=NOT_IN_KEY), sort_keys=True,
                      separators=(",", ":"))


def key_of(identity_digest: str, task: Task, options: str, item) -> str:
    """An item's key: a str (text) or a list of token ids, under the worker's identity, the
    task and the request's options. Hex: a valid KV key on every server."""
    kind, data = ("t", item) if isinstance(item, str) else ("i", list(item))
    h = hashlib.sha256()
    h.update(json.dumps([identity_digest, task.value, options, kind, data],
                        separators=(",", ":")).encode())
    return h.hexdigest()


def cacheable(task: Task, request: PoolingRequest) -> bool:
    return task in CACHED_TASKS and request.cache and request.input is not None


def items_of(request: PoolingRequest) -> tuple[list, bool]:
    """The request's items (texts or token-id lists) and whether it sent a batch (a list)."""
    value = request.input
    if isinstance(value, str):
        return [value], False
    if value and isinstance(value[0], int):
        return [value], False  # one sequence of token ids
    return list(value), True


def encode_value(value: np.ndarray, tokens: int) -> bytes:
    value = np.ascontiguousarray(value)
    return msgpack.packb({"d": value.dtype.str, "s": list(value.shape), "b": value.tobytes(),
                          "t": tokens}, use_bin_type=True)


def decode_value(data: bytes) -> tuple[np.ndarray, int]:
    m = msgpack.unpackb(data, raw=False)
    return np.frombuffer(m["b"], dtype=np.dtype(m["d"])).reshape(m["s"]), int(m["t"])


@dataclass
class Lookup:
    """One request against the cache: its items' keys, the hits, and the request to compute
    for the misses (None when every item hit)."""

    keys: list[str]
    hits: dict[int, tuple[np.ndarray, int]]  # item index -> (array, tokens)
    misses: list[int]                        # item indices to compute, in order
    request: PoolingRequest | None

    def plan(self, computed: TaskPlan | None) -> TaskPlan:
        """The whole request's plan: the misses' sequences (`computed`, planned from
        `request`; None when every item hit) and every item's tokens, so `usage` counts the
        hits as a computation would."""
        if computed is None:
            return TaskPlan([], PoolSpec(Forward.HIDDEN), item_tokens=self.item_tokens([]))
        return replace(computed, item_tokens=self.item_tokens([len(s) for s in computed.sequences]))

    def item_tokens(self, computed: list[int]) -> list[int]:
        """Tokens per item for `usage`: the stored counts of hits, `computed` for misses."""
        out = [0] * len(self.keys)
        for i, (_, tokens) in self.hits.items():
            out[i] = tokens
        for i, tokens in zip(self.misses, computed):
            out[i] = tokens
        return out


def split_request(request: PoolingRequest, misses: list[int], batch: bool) -> PoolingRequest:
    """The request with only the misses' inputs (a one-item request is its own)."""
    if not batch:
        return request
    items, _ = items_of(request)
    return request.model_copy(update={"input": [items[i] for i in misses]})


class ResultCache:
    """The bucket, its counters, and the one warning per outage."""

    def __init__(self, bucket: str, identity: Identity, ttl_s: float = 0.0,
                 max_bytes: int = -1, metrics=None) -> None:
        self.bucket = bucket
        self.identity = identity
        self._digest = identity.digest()
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._js = None
        self._kv = None
        self._down_until = 0.0     # monotonic; while in the future the bucket is not asked
        self._warned = False       # this outage was logged
        self._binding: asyncio.Task | None = None
        self._slow = 0             # lookups in a row that ran past LOOKUP_TIMEOUT_S
        self._stores: set[asyncio.Task] = set()
        self.hits = 0
        self.misses = 0
        self.bytes_written = 0
        self.lookup_seconds = 0.0
        self.errors = 0
        self.bypassed = 0          # items of requests that sent cache: false

    # ---- the bucket ----

    async def start(self, nc) -> None:
        self._js = nc.jetstream()
        await self._bind()

    async def _bind(self) -> bool:
        from nats.js.api import KeyValueConfig
        from nats.js.errors import BucketNotFoundError

        try:
            try:
                self._kv = await asyncio.wait_for(self._js.key_value(self.bucket), STORE_TIMEOUT_S)
            except BucketNotFoundError:
                self._kv = await asyncio.wait_for(self._js.create_key_value(KeyValueConfig(
                    bucket=self.bucket, history=1, ttl=self.ttl_s or None,
                    max_bytes=self.max_bytes)), STORE_TIMEOUT_S)
                log.info("created cache bucket %s (ttl %s s, max %s bytes)", self.bucket,
                         self.ttl_s or "none", self.max_bytes)
        except Exception as exc:
            self._failed("binding", exc)
            return False
        if self._warned:
            log.warning("cache bucket %s is back; results are cached again", self.bucket)
            self._warned = False
        return True

    def _failed(self, what: str, exc: BaseException, pause: bool = True) -> None:
        self.errors += 1
        if self._metrics is not None:
            self._metrics.cache_errors.inc()
        if pause:
            self._kv = None  # bound again after the pause: the bucket may have been re-created
            self._down_until = time.monotonic() + RETRY_AFTER_S
        if not self._warned:
            self._warned = True
            log.warning("cache bucket %s failed (%s: %r); computing without the cache, trying "
                        "it again every %.0f s (logged once per outage)", self.bucket, what, exc,
                        RETRY_AFTER_S)

    async def _usable(self) -> bool:
        """Whether to ask the bucket now. Binding again after an outage runs in the
        background: no request waits for a server that may still be away."""
        if self._kv is not None:
            return True
        if self._js is not None and self._binding is None and \
                time.monotonic() >= self._down_until:
            self._binding = asyncio.get_running_loop().create_task(self._bind())
            self._binding.add_done_callback(lambda _: setattr(self, "_binding", None))
        return False

    # ---- per request ----

    async def lookup(self, task: Task, request: PoolingRequest) -> Lookup | None:
        """The hits and misses of a request, or None when the cache does not apply to it
        (its task, `cache: false`, or the bucket is away: then it is computed as usual)."""
        if task not in CACHED_TASKS or request.input is None:
            return None
        if request.outputs is not None and list(request.outputs) != ["dense"]:
            return None  # a map of BGE-M3's outputs is not one array: computed every time
        items, batch = items_of(request)
        if not request.cache:
            self.bypassed += len(items)
            return None
        if not await self._usable():
            self._count(0, len(items), 0.0)
            return None
        options = options_of(request)
        keys = [key_of(self._digest, task, options, item) for item in items]
        started = time.perf_counter()
        try:
            found = await asyncio.wait_for(
                asyncio.gather(*(self._get(k) for k in keys)), LOOKUP_TIMEOUT_S)
        except Exception as exc:  # slow or away: compute everything
            # One slow lookup (a busy server) costs only that request; several in a row, or
            # any other failure, pause the cache.
            slow = isinstance(exc, asyncio.TimeoutError)
            self._slow = self._slow + 1 if slow else 0
            self._failed("lookup", exc, pause=not slow or self._slow >= SLOW_LOOKUPS)
            self._count(0, len(items), time.perf_counter() - started)
            return None
        self._slow = 0
        if self._warned:  # the next outage is logged again
            self._warned = False
            log.warning("cache bucket %s answers again", self.bucket)
        hits = {i: decode_value(v) for i, v in enumerate(found) if v is not None}
        misses = [i for i in range(len(items)) if i not in hits]
        self._count(len(hits), len(misses), time.perf_counter() - started)
        rest = None if not misses else split_request(request, misses, batch)
        return Lookup(keys, hits, misses, rest)

    async def _get(self, key: str) -> bytes | None:
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self._kv.get(key, validate_keys=False)
        except KeyNotFoundError:
            return None
        return entry.value or None

    def _count(self, hits: int, misses: int, seconds: float) -> None:
        self.hits += hits
        self.misses += misses
        self.lookup_seconds += seconds
        m = self._metrics
        if m is not None:
            if hits:
                m.cache_hits.inc(hits)
            if misses:
                m.cache_misses.inc(misses)
            m.cache_lookup_seconds.observe(seconds)

    def store(self, key: str, value: np.ndarray, tokens: int) -> None:
        """Keep a computed item, in the background: the reply never waits for the bucket."""
        if self._kv is None or len(self._stores) >= MAX_PENDING_STORES:
            return
        data = encode_value(value, tokens)
        task = asyncio.get_running_loop().create_task(self._put(key, data))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def _put(self, key: str, data: bytes) -> None:
        kv = self._kv
        if kv is None:
            return
        try:
            await asyncio.wait_for(kv.put(key, data, validate_keys=False), STORE_TIMEOUT_S)
        except Exception as exc:  # full (max_bytes with discard new), away, deleted
            if self._kv is kv:
                self._failed("store", exc)
            return
        self.bytes_written += len(data)
        if self._metrics is not None:
            self._metrics.cache_bytes_written.inc(len(data))

    def counters(self) -> dict:
        looked = self.hits + self.misses
        return {"bucket": self.bucket, "hits": self.hits, "misses": self.misses,
                "hit_rate": round(self.hits / looked, 4) if looked else 0.0,
                "bytes_written": self.bytes_written,
                "lookup_seconds": round(self.lookup_seconds, 6), "errors": self.errors,
                "bypassed": self.bypassed, "available": self._kv is not None}

    async def close(self, timeout: float = 2.0) -> None:
        """Let the stores in flight finish (briefly): what was computed is kept."""
        if self._binding is not None:
            self._binding.cancel()
        if self._stores:
            await asyncio.wait(set(self._stores), timeout=timeout)
        for task in list(self._stores):
            task.cancel()
