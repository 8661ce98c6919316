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

# How long a worker keeps trying to store an answer (a result, an error result, a dead letter)
# before it lets the message go round again: a JetStream leader election takes 8 to 17 s on a
# loaded machine (RELIABILITY.md), so this outlasts several in a row.
STORE_RETRY_S = 60.0
STORE_RETRY_FIRST_S = 0.25
STORE_RETRY_MAX_S = 4.0

# The time span a message must have spent in its stream before deliveries that ended without
# an answer (its workers died, or its acks were lost) can dead-letter it: 20 elections long.
POISON_SPAN_S = 300.0


class Outcome(str, Enum):
    REJECT = "reject"  # answer the error frame and terminate: no delivery would do better
    RETRY = "retry"    # no frame; nak so that a later delivery (maybe another worker) tries again
    DEAD = "dead"      # dead-letter to P.dead.<task>, answer the error frame, terminate


def counts_as_failure(code: ErrorCode) -> bool:
    """Whether an error is the document's own failure, counted toward dead-lettering: `internal`
    is what the engine answers when the forward pass (or the planning of its batch) raised, the
    one fault a document brings with it. `overloaded` is the worker's state, not the document's;
    a lost connection, a store without a leader or a drain never reach `on_error` (the intake
    retries those itself, see `store_retry_delay`)."""
    return code is ErrorCode.INTERNAL


def on_error(code: ErrorCode, failures: int | None, max_deliveries: int) -> Outcome:
    """What a job's error means. Errors other than transient ones are the job's own (bad fields,
    too long, deadline passed) and final. A transient error is retried; it dead-letters the job
    only once `failures`, the deliveries whose computation failed (this one included, counted
    across workers in a JetStream KV bucket), reach `max_deliveries`. JetStream's delivery
    count is not used: it also counts deliveries ended by dead workers, lost acks and leader
    elections, and a run of those would dead-letter a healthy document. `failures` None means
    the count could not be recorded (the bucket had no leader): retried, not counted."""
    if code not in TRANSIENT:
        return Outcome.REJECT
    if not counts_as_failure(code) or failures is None:
        return Outcome.RETRY
    return Outcome.RETRY if failures < max_deliveries else Outcome.DEAD


def exhausted(deliveries: int, age_s: float, max_deliveries: int,
              span_s: float = POISON_SPAN_S) -> bool:
    """A delivery dead-lettered without computing it: more than `max_deliveries` deliveries, and
    the message first stored at least `span_s` ago (JetStream's message timestamp).

    Why both: a document that kills the worker computing it (a crash in native code, memory
    exhausted) leaves no failure behind, only deliveries that ended without an answer, and must
    still end. But such deliveries are also what infrastructure faults make: a SIGKILLed worker
    hands back all it held, a node kill loses acks and stalls the stream's leader for 8 to 17 s,
    and a document can meet several of those in a row. A count alone is reached by a run of
    faults; a span of 20 elections is not, because every fault that ends a delivery also hands
    the document to a worker again within seconds (ack_wait, a nak's delay), and a healthy one
    is then answered. Time spent waiting in a backlog counts toward the span, which is why the
    count is kept as well."""
    return deliveries > max_deliveries and age_s >= span_s


def store_retry_delay(attempt: int, elapsed_s: float, limit_s: float = STORE_RETRY_S) -> float | None:
    """Seconds before the `attempt`-th retry of a store that failed (a results, dead-letter or
    KV stream without a leader, a lost connection), or None once `limit_s` has passed: then the
    message is naked and delivered again later, which does not count against the document.
    Doubling from 0.25 s to 4 s, so a store is retried about 20 times within the minute."""
    if elapsed_s >= limit_s:
        return None
    return min(STORE_RETRY_MAX_S, STORE_RETRY_FIRST_S * 2 ** (attempt - 1), limit_s - elapsed_s)


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


def publishable(subject: str) -> bool:
    """Whether a reply can be published to `subject`: NATS's rules for a publish subject, dot
    separated tokens, none empty, no white space, no wildcard token (`*`, `>`). nats-py
    refuses to publish to some that break them and the server to others, so a job whose
    Pooling-Reply-To breaks them could never be answered: it was computed on every delivery
    and its failed reply ended the pull loop (an audit)."""
    if not subject or any(c.isspace() for c in subject):
        return False
    return all(token and token not in ("*", ">") for token in subject.split("."))


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
