"""A small actor runtime: an actor owns its state and a bounded asyncio mailbox, and a
supervisor restarts an actor or loop that crashed. A handler that raises on one message is that
message's failure, not the actor's: the actor answers it (`on_failure`) and takes the next
message at once. Only a loop that itself crashes reaches the supervisor, whose growing restart
delay is for loops that crash again and again. A crash never takes the process down."""

import asyncio
import logging
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


class MailboxFull(Exception):
    """The actor's bounded mailbox is full: the sender must answer `overloaded`."""


class Actor(ABC):
    """Subclasses implement `receive`; `on_failure` answers a message whose handling raised."""

    name = "actor"

    def __init__(self, mailbox_size: int) -> None:
        self._mailbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=mailbox_size)
        self._busy = 0
        self.failures = 0  # messages whose handler raised (each answered by on_failure)
        self._crash_log = CrashLog()

    def tell(self, message: Any) -> None:
        """Hand a message over without waiting; raises MailboxFull when the mailbox is full."""
        try:
            self._mailbox.put_nowait(message)
        except asyncio.QueueFull:
            raise MailboxFull(self.name) from None

    @property
    def backlog(self) -> int:
        """Messages queued or being handled; zero means this actor is idle."""
        return self._mailbox.qsize() + self._busy

    @abstractmethod
    async def receive(self, message: Any) -> None:
        """Handle one message; the actor's state is touched only from here."""

    async def on_failure(self, message: Any, exc: BaseException) -> None:
        """Answer for a message whose handling raised; the default drops nothing it can't."""

    def on_restart(self) -> None:
        """Reset state that may be inconsistent after a handler raised or the actor crashed.
        The mailbox survives."""

    async def run(self) -> None:
        while True:
            message = await self._mailbox.get()
            self._busy += 1
            try:
                await self.receive(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self.answer_failure(message, exc)
            finally:
                self._busy -= 1

    async def answer_failure(self, message: Any, exc: BaseException) -> None:
        """A message whose handling raised: counted, logged once per distinct traceback, and
        answered. For an actor that handles several messages at once (one message standing
        for several jobs), per job."""
        self.failures += 1
        self._crash_log.record(f"{self.name} failed on one message and carries on", exc)
        self.on_restart()
        # If answering fails too, the actor itself is broken: that reaches the supervisor.
        await self.on_failure(message, exc)


class CrashLog:
    """Logs each distinct traceback in full once, and a one-line count for repeats, so a crash
    loop (or a client sending the same bad message all day) does not flood the log."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def record(self, what: str, exc: BaseException) -> None:
        trace = "".join(traceback.format_exception(exc))
        count = self._seen.get(trace, 0) + 1
        self._seen[trace] = count
        if count == 1:
            log.error("%s:\n%s", what, trace)
        else:
            log.warning("%s (same traceback as before, %d times): %r", what, count, exc)


def restart_delay(consecutive: int, base: float, cap: float) -> float:
    """Seconds to wait before restarting a loop that crashed `consecutive` times in a row
    without a healthy run between: none for the first crash (a one-off costs nothing), then
    base, 2 x base, ... up to cap, so a loop that crashes on every start does not spin."""
    if consecutive <= 1:
        return 0.0
    return min(cap, base * 2 ** (consecutive - 2))


class Supervisor:
    """Runs actors (and plain background loops) as tasks and restarts any that raise."""

    # A loop that ran this long before crashing counts as having been healthy.
    HEALTHY_RUN_S = 1.0

    def __init__(self, restart_delay: float = 0.05, max_restart_delay: float = 5.0) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self._crash_log = CrashLog()
        self._restart_delay = restart_delay
        self._max_restart_delay = max_restart_delay
        self.restarts: dict[str, int] = {}

    def start_actor(self, actor: Actor) -> None:
        self.start_loop(actor.name, actor.run, on_restart=actor.on_restart)

    def start_loop(self, name: str, loop: Callable[[], Awaitable[None]],
                   on_restart: Callable[[], None] | None = None) -> None:
        if name in self._tasks:
            raise ValueError(f"a task named {name!r} is already supervised")
        self._tasks[name] = asyncio.create_task(self._keep_running(name, loop, on_restart), name=name)

    async def _keep_running(self, name, loop, on_restart) -> None:
        consecutive = 0
        while True:
            started = time.monotonic()
            try:
                await loop()
                return  # a loop that returns has finished its work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.restarts[name] = self.restarts.get(name, 0) + 1
                healthy = time.monotonic() - started >= self.HEALTHY_RUN_S
                consecutive = 1 if healthy else consecutive + 1
                self._crash_log.record(f"{name} crashed and is restarted", exc)
                if on_restart is not None:
                    on_restart()
                await asyncio.sleep(restart_delay(consecutive, self._restart_delay,
                                                  self._max_restart_delay))

    async def stop(self) -> None:
        """Cancel every supervised task and wait for them to finish."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
