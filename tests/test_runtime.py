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


class Batched(Recorder):
    """Takes what is queued together and records each take, as the engine does."""

    name = "batched"
    take_at_once = 4

    def __init__(self, size=64, fail_prepare=False):
        super().__init__(size)
        self.takes, self.fail_prepare = [], fail_prepare

    async def before_each_take(self, messages):
        self.takes.append(list(messages))
        if self.fail_prepare:
            raise RuntimeError("prepare failed")


async def test_messages_taken_together_are_each_received_in_order():
    actor, supervisor = Batched(), Supervisor(restart_delay=0)
    for message in ["a", "b", "c", "d", "e", "last"]:
        actor.tell(message)
    assert actor.backlog == 6
    supervisor.start_actor(actor)
    await asyncio.wait_for(actor.done.wait(), 5)
    assert actor.handled == ["a", "b", "c", "d", "e", "last"]
    assert actor.takes == [["a", "b", "c", "d"], ["e", "last"]]  # at most take_at_once
    await asyncio.sleep(0)
    assert actor.backlog == 0
    await supervisor.stop()


async def test_a_failed_preparation_is_logged_and_every_message_still_received(caplog):
    actor, supervisor = Batched(fail_prepare=True), Supervisor(restart_delay=0)
    for message in ["a", "boom", "last"]:
        actor.tell(message)
    supervisor.start_actor(actor)
    await asyncio.wait_for(actor.done.wait(), 5)
    await supervisor.stop()
    assert actor.handled == ["a", "last"] and actor.failed == [("boom", "boom")]
    assert any("prepare failed" in r.getMessage() or "preparing" in r.getMessage()
               for r in caplog.records)


class BrokenBatched(Batched):
    name = "broken-batched"

    async def on_failure(self, message, exc):
        raise RuntimeError("cannot answer")


async def test_messages_taken_but_not_received_survive_a_crash_of_the_loop():
    """The loop crashes on the second of four messages taken together: the restarted loop
    receives the two left, nothing taken is lost and the backlog never undercounts."""
    actor, supervisor = BrokenBatched(), Supervisor(restart_delay=0)
    for message in ["a", "boom", "b", "last"]:
        actor.tell(message)
    supervisor.start_actor(actor)
    await asyncio.wait_for(actor.done.wait(), 5)
    await supervisor.stop()
    assert actor.handled == ["a", "b", "last"]
    assert supervisor.restarts == {"broken-batched": 1}
    assert actor.takes == [["a", "boom", "b", "last"]]  # the held two were not taken again
