"""Messages between the actors of one worker (DESIGN.md's actor graph)."""

import time
from dataclasses import dataclass, field

from poolwire.schemas.codec import WireFormat
from poolwire.schemas.events import DeprecationEvent
from poolwire.schemas.requests import PoolingRequest
from poolwire.schemas.tasks import Task


@dataclass(frozen=True)
class ReplyReserve:
    """Room a one-message reply must leave for what its intake adds before storing it (a
    pipeline result's `doc_id` and source headers), so that the engine's size checks refuse
    with payload_too_large what could otherwise be computed but never stored."""

    headers: dict[str, str]
    body_bytes: int                # added to the encoded reply, at most
    remedy: str | None = None      # what to do instead, where the usual remedies do not apply


# Not frozen=True: a frozen dataclass's __init__ sets every field through object.__setattr__
# (1.2 us against 0.23 for 11 fields, Python 3.11), and these are made per request on the
# hot path. Hashed by value as frozen ones are, and never assigned once made.
@dataclass(unsafe_hash=True)
class Incoming:
    """A decoded body from IngestActor to ValidatorActor; the task is not yet checked."""

    reply: str
    task_name: str
    body: dict
    fmt: WireFormat
    request_id: str
    received_at: float = field(default_factory=time.monotonic)  # when NATS handed it over
    # Computed in a batch of its own, where it can fail only itself: a durable job delivered
    # again after failing (durable_policy.compute_alone).
    solo: bool = False
    reserve: ReplyReserve | None = None
    trace: object = None  # its trace context (actors/tracing.py), set by its intake


# Not frozen, as Incoming.
@dataclass(unsafe_hash=True)
class Job:
    """A validated request from ValidatorActor to EngineActor."""

    request: PoolingRequest
    task: Task
    reply: str
    fmt: WireFormat
    request_id: str
    received_at: float
    # Deprecated-task requests: the reply's `warnings` and every frame's Pooling-Deprecation header.
    warnings: tuple[str, ...] = ()
    headers: dict[str, str] | None = None
    # Built by the validator, published by the engine once the request is admitted: PROTOCOL.md
    # wants an event for every deprecated request "that passed validation and was accepted",
    # and input_too_long / overloaded are only known after tokenizing.
    deprecation: DeprecationEvent | None = None
    solo: bool = False  # see Incoming.solo
    reserve: ReplyReserve | None = None
    trace: object = None  # see Incoming.trace; its headers are in `headers` too

    @property
    def deadline(self) -> float | None:
        """Monotonic time after which queued work is dropped, from `deadline_ms`."""
        if self.request.deadline_ms is None:
            return None
        return self.received_at + self.request.deadline_ms / 1000.0
