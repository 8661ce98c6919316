"""The actor runtime: bounded mailboxes, and a supervisor that restarts a crashed actor after
it has answered the message that crashed it."""

import asyncio

import pytest

from poolwire.actors.runtime import Actor, MailboxFull, Supervisor

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


async def test_a_crash_is_answered_logged_once_and_the_actor_restarts(caplog):
    actor, supervisor = Recorder(), Supervisor(restart_delay=0)
    supervisor.start_actor(actor)
    for message in ["a", "boom", "b", "boom", "last"]:
        actor.tell(message)
    await asyncio.wait_for(actor.done.wait(), 5)
    await supervisor.stop()
    assert actor.handled == ["a", "b", "last"]
    assert actor.failed == [("boom", "boom"), ("boom", "boom")]
    assert actor.restarted == 2 and supervisor.restarts == {"recorder": 2}
    tracebacks = [r for r in caplog.records if "crashed and is restarted" in r.getMessage()]
    assert len(tracebacks) == 1  # the same traceback is logged in full only once


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
