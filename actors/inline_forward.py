"""When a forward pass runs on the event loop's own thread instead of the forward thread.

Handing a batch to the forward thread and its result back costs two thread wake-ups (about
0.1 ms on an idle 2-core machine, more on a busy one), which is a tenth of what a lone short
request adds over in-process encode. A lone small batch gains nothing from the thread: with
nothing else queued or computing there is nothing for the loop to overlap with it. So it runs
inline, bounded in size so the loop never stalls for more than one short forward pass."""

# Padded tokens (batch x longest) of the largest batch run inline: one or a few short texts,
# a few milliseconds of MiniLM on a CPU.
INLINE_MAX_PADDED_TOKENS = 64


def runs_inline(padded_tokens: int, in_forward: int, queued: int) -> bool:
    """Whether this batch runs on the loop thread: the model is idle (`in_forward` batches
    computing), nothing else waits (`queued` sequences), and the batch is small."""
    return in_forward == 0 and queued == 0 and padded_tokens <= INLINE_MAX_PADDED_TOKENS
