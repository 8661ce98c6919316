"""When a batch runs on the event loop's thread instead of the forward thread: only a small
batch, only while the model is idle and nothing else waits."""

from poolwire.actors.inline_forward import INLINE_MAX_PADDED_TOKENS, runs_inline


def test_a_lone_small_batch_runs_inline():
    assert runs_inline(12, in_forward=0, queued=0)
    assert runs_inline(INLINE_MAX_PADDED_TOKENS, in_forward=0, queued=0)


def test_a_large_batch_goes_to_the_forward_thread():
    assert not runs_inline(INLINE_MAX_PADDED_TOKENS + 1, in_forward=0, queued=0)


def test_a_busy_model_or_waiting_work_keeps_the_loop_free():
    assert not runs_inline(12, in_forward=1, queued=0)   # never two threads on the model
    assert not runs_inline(12, in_forward=0, queued=3)   # the loop has more to plan meanwhile
