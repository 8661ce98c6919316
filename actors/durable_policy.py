"""What a durable intake does with a job (pure): how many messages to pull, and what a job's
error means for its JetStream message (PROTOCOL.md "Durable mode")."""

import random
from enum import Enum
from typing import Any

import msgpack

from poolwire.actors.framing import header_bytes
from poolwire.schemas.errors import ErrorCode

# A dead letter's error message, when the record must shrink to fit max_payload.
DEAD_MESSAGE_CHARS = 200

# Errors that a later delivery may not meet again: the forward pass failed (a device fault, a
# batch that ran out of memory), or the worker had no room after all.
TRANSIENT = frozenset({ErrorCode.INTERNAL, ErrorCode.OVERLOADED})


class Outcome(str, Enum):
    REJECT = "reject"  # answer the error frame and terminate: no delivery would do better
    RETRY = "retry"    # no frame; nak so that a later delivery (maybe another worker) tries again
    DEAD = "dead"      # dead-letter to P.dead.<task>, answer the error frame, terminate


def on_error(code: ErrorCode, deliveries: int, max_deliveries: int) -> Outcome:
    """A transient error is retried until the job has had `max_deliveries` deliveries; every
    other error is the job's own (bad fields, too long, deadline passed) and is final."""
    if code not in TRANSIENT:
        return Outcome.REJECT
    return Outcome.RETRY if deliveries < max_deliveries else Outcome.DEAD


def exhausted(deliveries: int, max_deliveries: int) -> bool:
    """A delivery past the bound: every earlier one ended without an answer (the workers that
    took it died or never finished it), so it is dead-lettered without computing it again."""
    return deliveries > max_deliveries


def compute_alone(deliveries: int, max_deliveries: int) -> bool:
    """Whether a delivery runs in a batch of its own, where it can fail only itself. The first
    redelivery is batched as usual: it is most often a job whose worker died, and after a worker
    death hundreds come back at once. From the third delivery on, and always on the last one,
    it runs alone, so a job batched with a poison job is never dead-lettered for it."""
    return deliveries > 1 and (deliveries >= 3 or deliveries >= max_deliveries)


def retry_delay(deliveries: int, base_s: float, rng: random.Random = random._inst) -> float:
    """Seconds before a failed job is delivered again: growing with each delivery, and jittered
    so that a poison job and the jobs that shared its failed batch come back at different times
    and are not batched together again."""
    return base_s * deliveries * rng.uniform(0.5, 1.5)


def pull_size(in_flight: int, capacity: int, queued_tokens: int, max_queued_tokens: int,
              batch: int) -> int:
    """How many messages to pull now: none while the engine's queue is half full (admission
    would answer `overloaded`, and a pulled job should be computed soon, not wait in memory
    while its ack timer runs), else up to `batch` within the worker's in-flight capacity."""
    if queued_tokens * 2 >= max_queued_tokens:
        return 0
    return max(0, min(batch, capacity - in_flight))


def dead_letter(record: dict[str, Any], job: bytes, headers: dict[str, str] | None,
                max_payload: int, stream: str, seq: int) -> tuple[bytes, dict[str, str] | None]:
    """The body and headers of a dead letter, `{**record, job}`, made to fit max_payload: a dead
    letter that cannot be stored sends its job round again on every delivery, without end. So
    a job too big to carry along is left out (`job` null, `job_bytes`, and its `stream` and
    `seq`: a pipeline's document stays in its stream, a durable job's is gone once
    terminated), then the error's message is cut, then the job's headers are dropped."""
    def fits(body: bytes, hdrs: dict[str, str] | None) -> bool:
        return len(body) + header_bytes(hdrs) <= max_payload

    body = msgpack.packb({**record, "job": job}, use_bin_type=True)
    if fits(body, headers):
        return body, headers
    record = {**record, "job": None, "job_bytes": len(job), "stream": stream, "seq": seq}
    body = msgpack.packb(record, use_bin_type=True)
    if not fits(body, headers):
        error = dict(record.get("error") or {})
        message = str(error.get("message", ""))
        if len(message) > DEAD_MESSAGE_CHARS:
            error["message"] = (message[:DEAD_MESSAGE_CHARS]
                                + f"...(shortened from {len(message)} chars)")
        record = {**record, "error": {k: error[k] for k in ("code", "message") if k in error}}
        body = msgpack.packb(record, use_bin_type=True)
    return (body, headers) if fits(body, headers) else (body, None)
