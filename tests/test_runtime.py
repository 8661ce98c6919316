"""The actor runtime: bounded mailboxes, actors that answer a message whose handler raised and
carry on, and a supervisor that restarts a crashed loop with a growing delay."""

import asyncio

import pytest

from poolwire.actors.runtime import Actor, MailboxFull, Supervisor, restart_delay

pytestmark = pytest.mark.timeout(30)


class Recorder(Actor):
    name = "recorder"

    def __init__(self, size=8):
        super().__init__(size)
        self.handled, self.failed, self.restarted = [], [], 0
        self.done = asyncio.Event()

    async def receive(self, message):
        if message == "boom":
            raise RuntimeError("boom")
        self.handled.append(message)
        if message == "last":
            self.done.set()

    async def on_failure(self, message, exc):
        self.failed.append((message, str(exc)))

    def on_restart(self):
        self.restarted += 1


async def test_a_handler_exception_is_answered_and_the_actor_carries_on_at_once(caplog):
    """One bad message is that message's failure: 50 of them are answered, the actor is never
    restarted (so no restart delay is paid) and the traceback is logged in full once."""
    actor = Recorder(size=128)
    supervisor = Supervisor(restart_delay=60)  # a restart would blow the test's timeout
    supervisor.start_actor(actor)
    messages = ["a"] + ["boom"] * 50 + ["b", "last"]
    for message in messages:
        actor.tell(message)
    await asyncio.wait_for(actor.done.wait(), 5)
    await supervisor.stop()
    assert actor.handled == ["a", "b", "last"]
    assert actor.failed == [("boom", "boom")] * 50 and actor.failures == 50
    assert supervisor.restarts == {}
    tracebacks = [r for r in caplog.records if "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1  # the same traceback is logged in full only once


class BrokenAnswers(Recorder):
    name = "broken"

    async def on_failure(self, message, exc):
        raise RuntimeError("cannot answer")


async def test_an_actor_that_cannot_answer_a_failure_is_restarted_by_the_supervisor():
    actor, supervisor = BrokenAnswers(), Supervisor(restart_delay=0)
    supervisor.start_actor(actor)
    for message in ["boom", "a", "last"]:
        actor.tell(message)
    await asyncio.wait_for(actor.done.wait(), 5)
    await supervisor.stop()
    assert actor.handled == ["a", "last"]
    assert supervisor.restarts == {"broken": 1}


def test_restart_delay_is_free_once_then_grows_to_its_cap():
    delays = [restart_delay(n, base=0.05, cap=1.0) for n in range(1, 9)]
    assert delays == [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


async def test_a_full_mailbox_refuses_at_once():
    actor = Recorder(size=2)
    actor.tell(1)
    actor.tell(2)
    with pytest.raises(MailboxFull):
        actor.tell(3)
    assert actor.backlog == 2


async def test_a_crashing_background_loop_is_restarted():
    runs = []
    finished = asyncio.Event()

    async def loop():
        runs.append(len(runs))
        if len(runs) < 3:
            raise ValueError(f"run {len(runs)}")
        finished.set()

    supervisor = Supervisor(restart_delay=0)
    supervisor.start_loop("flaky", loop)
    await asyncio.wait_for(finished.wait(), 5)
    await supervisor.stop()
    assert runs == [0, 1, 2]


def test_collector_time_counts_collections_only_while_installed():
    import gc

    from poolwire.actors.stats import CollectorTime

    collector = CollectorTime()
    gc.collect()
    assert collector.snapshot() == {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
    collector.install()
    collector.install()  # once only: a second install does not count twice
    try:
        gc.collect(0)
        gc.collect()
    finally:
        collector.remove()
    counted = collector.snapshot()
    assert counted["collections"][0] >= 1 and counted["collections"][2] >= 1
    assert counted["seconds"][2] > 0 and all(s >= 0 for s in counted["seconds"])
    gc.collect()  # removed: no longer counted
    assert collector.snapshot() == counted
    collector.remove()  # removing twice is harmless
