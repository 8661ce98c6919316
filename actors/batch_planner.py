"""The batch planner (pure): which queued sequences go into the next micro-batch.

Rules, in order:
- the head of the batch is the queued item with the lowest `priority`, then the oldest; so an
  item is overtaken only by better-priority work and never waits behind newer items of its own
  priority forever (long ones included);
- the rest of the batch is filled with items of the head's forward kind whose lengths are
  closest to the head's, same priority first, while the padded size (items x longest length)
  stays within `max_batch_tokens` and the count within `max_batch_size`; an item joins only if
  it adds at most `max_added_padding` padding tokens to the batch. On a CPU a forward pass costs
  about 3.5 ms plus 0.12 ms per padded token (MiniLM, measured), so a padding token wasted costs
  as much as a 30th of a whole extra batch: tight batches beat big ones, and padding is what
  made unsorted batching 4x slower (issue 5). The worker sets the budget from its own device's
  measured costs (actors/batch_cost.py);
- items whose deadline passed are taken out (`expired`) and never planned.

Items are kept in length buckets so that planning costs O(batch + buckets), not O(queue)."""

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class QueuedItem:
    tokens: int
    priority: int = 0
    deadline: float | None = None
    group: str = ""           # items of one batch share this (the forward kind)
    payload: Any = None
    seq_no: int = field(default=-1)  # arrival order, set by the planner
    planned: bool = False     # batched, expired or discarded: lazily dropped from the indexes


class BatchPlanner:
    def __init__(self, max_batch_tokens: int, max_batch_size: int, max_added_padding: int = 16,
                 bucket_width: int = 8) -> None:
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError(f"max_batch_tokens ({max_batch_tokens}) and max_batch_size "
                             f"({max_batch_size}) must be at least 1")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_added_padding = max_added_padding
        self._width = bucket_width
        self._arrivals = itertools.count()
        self._order: list[tuple[int, int, QueuedItem]] = []       # (priority, seq_no, item)
        self._deadlines: list[tuple[float, int, QueuedItem]] = []  # (deadline, seq_no, item)
        # (group, priority) -> bucket index -> items in arrival order
        self._buckets: dict[tuple[str, int], dict[int, deque[QueuedItem]]] = {}
        self._count = 0
        self.queued_tokens = 0

    def __len__(self) -> int:
        return self._count

    def add(self, item: QueuedItem) -> None:
        item.seq_no = next(self._arrivals)
        heapq.heappush(self._order, (item.priority, item.seq_no, item))
        if item.deadline is not None:
            heapq.heappush(self._deadlines, (item.deadline, item.seq_no, item))
        buckets = self._buckets.setdefault((item.group, item.priority), {})
        buckets.setdefault(item.tokens // self._width, deque()).append(item)
        self._count += 1
        self.queued_tokens += item.tokens

    def _take(self, item: QueuedItem) -> None:
        item.planned = True
        self._count -= 1
        self.queued_tokens -= item.tokens

    def expired(self, now: float) -> list[QueuedItem]:
        """Take out and return every queued item whose deadline is before `now`."""
        out = []
        while self._deadlines and self._deadlines[0][0] < now:
            _, _, item = heapq.heappop(self._deadlines)
            if not item.planned:
                self._take(item)
                out.append(item)
        return out

    def next_deadline(self) -> float | None:
        while self._deadlines and self._deadlines[0][2].planned:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def discard(self, item: QueuedItem) -> None:
        """Take out a queued item that must not run (its request already failed); O(1), the
        indexes drop it lazily."""
        if not item.planned:
            self._take(item)

    def next_batch(self) -> list[QueuedItem]:
        """The next micro-batch, head first; empty when nothing is queued."""
        while self._order and self._order[0][2].planned:
            heapq.heappop(self._order)
        if not self._order:
            return []
        _, _, head = heapq.heappop(self._order)
        self._take(head)
        batch, longest = [head], head.tokens
        priorities = sorted(p for g, p in self._buckets if g == head.group)
        priorities.sort(key=lambda p: p != head.priority)  # the head's own priority first
        def may_fit(key: int) -> bool:  # sees the batch as it grows (late binding)
            return self._bucket_may_fit(key, longest, len(batch))

        for priority in priorities:
            for item in self._closest(head.group, priority, head.tokens // self._width, may_fit):
                if len(batch) >= self.max_batch_size:
                    return batch
                new_longest = max(longest, item.tokens)
                padded = new_longest * (len(batch) + 1)
                added_padding = padded - longest * len(batch) - item.tokens
                if padded > self.max_batch_tokens or added_padding > self.max_added_padding:
                    continue
                self._take(item)
                batch.append(item)
                longest = new_longest
        return batch

    def _bucket_may_fit(self, key: int, longest: int, count: int) -> bool:
        """Whether any item of bucket `key` could join a batch of `count` items padded to
        `longest`; skipping hopeless buckets keeps planning cheap when the queue is long."""
        low, high = key * self._width, (key + 1) * self._width - 1
        if low > longest:  # every item of the bucket lengthens the batch
            return ((low - longest) * count <= self.max_added_padding
                    and low * (count + 1) <= self.max_batch_tokens)
        if high < longest:  # every item of the bucket is shorter than the batch
            return longest - high <= self.max_added_padding
        return True

    def _closest(self, group: str, priority: int, centre: int, may_fit):
        """Live items of (group, priority), bucket by bucket outward from `centre`, skipping
        buckets that `may_fit` rules out; within a bucket, oldest first. Spent entries are
        dropped as they are met."""
        buckets = self._buckets.get((group, priority), {})
        keys = sorted(buckets, key=lambda k: (abs(k - centre), k))
        for key in keys:
            bucket = buckets[key]
            if not may_fit(key):
                continue
            for item in list(bucket):
                if item.planned:
                    continue
                yield item
            while bucket and bucket[0].planned:
                bucket.popleft()
            if not bucket:
                del buckets[key]
        if not buckets:
            self._buckets.pop((group, priority), None)


# The longest batch the event loop computes itself (the backend's own estimate of its time on
# one thread), rather than handing it to the forward thread and waiting to be woken with the
# result. Those two wake-ups between threads cost 0.3 to 0.5 ms a request one at a time on
# this 2-core VM (more than the near-zero model's whole pass: bench/service_cost.py --shapes
# 1x1, docs/PERFORMANCE.md), and a loop that waits for the result has nothing else to do. A
# request arriving meanwhile waits at most about this long; a real model's batches (MiniLM:
# milliseconds) never qualify, and no batch does where the backend does not know its time.
LOOP_BATCH_S = 0.0005


def computes_on_loop(seconds_alone: float | None, engine_idle: bool) -> bool:
    """Whether the engine computes a batch on its event loop: only when nothing else is in
    flight, queued or on its way (`engine_idle`), and the backend knows the batch to take at
    most LOOP_BATCH_S on one thread (`seconds_alone`, None: unknown)."""
    return engine_idle and seconds_alone is not None and seconds_alone <= LOOP_BATCH_S
