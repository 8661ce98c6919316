"""Where a worker's time goes, per stage, for `$SRV.STATS` and the benchmark."""

import gc
import time
from dataclasses import dataclass, field

STAGES = ("decode", "validate", "tokenize", "plan", "forward", "pool", "encode", "publish")


@dataclass
class StageStats:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    batches: int = 0
    sequences: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] += seconds

    def timed(self, stage: str) -> "_Timed":
        """`with stats.timed(stage):` adds the block's seconds to the stage."""
        return _Timed(self.seconds, stage)

    def snapshot(self) -> dict:
        padded = self.padded_tokens or 1
        return {
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
            "batches": self.batches,
            "sequences": self.sequences,
            "mean_batch_size": round(self.sequences / self.batches, 2) if self.batches else 0.0,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "padding_waste": round(1 - self.real_tokens / padded, 4) if self.padded_tokens else 0.0,
        }


class _Timed:
    """A plain class rather than @contextmanager: the generator behind that costs a few
    microseconds a block, and the hot path times several blocks per request
    (bench/service_cost.py)."""

    __slots__ = ("_seconds", "_stage", "_started")

    def __init__(self, seconds: dict[str, float], stage: str) -> None:
        self._seconds = seconds
        self._stage = stage

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self._seconds[self._stage] += time.perf_counter() - self._started


class CollectorTime:
    """How often the garbage collector ran in this process and how long it held it, by
    generation: time no stage of the worker owns, yet the event loop's (a full collection over
    torch's and transformers' objects held it for 0.2 to 0.35 s before `poolwire serve` froze
    them: cli.freeze_startup_heap). Counted from `gc.callbacks` between install and remove."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def snapshot(self) -> dict:
        return {"collections": list(self.collections),
                "seconds": [round(s, 6) for s in self.seconds]}
