"""A small actor runtime: an actor owns its state and a bounded asyncio mailbox, and a
supervisor restarts an actor whose handler raised. A crash never takes the process down and
never loses the message that caused it: the actor answers it (`on_failure`) before restarting."""

import asyncio
import logging
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
        """Reset state that may be inconsistent after a crash. The mailbox survives."""

    async def run(self) -> None:
        while True:
            message = await self._mailbox.get()
            self._busy += 1
            try:
                await self.receive(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                try:
                    await self.on_failure(message, exc)
                finally:
                    raise
            finally:
                self._busy -= 1


class Supervisor:
    """Runs actors (and plain background loops) as tasks and restarts any that raise, logging
    each distinct traceback once so a crash loop does not flood the log."""

    def __init__(self, restart_delay: float = 0.05) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self._seen: set[str] = set()
        self._restart_delay = restart_delay
        self.restarts: dict[str, int] = {}

    def start_actor(self, actor: Actor) -> None:
        self.start_loop(actor.name, actor.run, on_restart=actor.on_restart)

    def start_loop(self, name: str, loop: Callable[[], Awaitable[None]],
                   on_restart: Callable[[], None] | None = None) -> None:
        if name in self._tasks:
            raise ValueError(f"a task named {name!r} is already supervised")
        self._tasks[name] = asyncio.create_task(self._keep_running(name, loop, on_restart), name=name)

    async def _keep_running(self, name, loop, on_restart) -> None:
        while True:
            try:
                await loop()
                return  # a loop that returns has finished its work
            except asyncio.CancelledError:
                raise
            except Exception:
                trace = traceback.format_exc()
                self.restarts[name] = self.restarts.get(name, 0) + 1
                if trace not in self._seen:
                    self._seen.add(trace)
                    log.error("%s crashed and is restarted:\n%s", name, trace)
                else:
                    log.warning("%s crashed again (same traceback); restart %d",
                                name, self.restarts[name])
                if on_restart is not None:
                    on_restart()
                await asyncio.sleep(self._restart_delay)

    async def stop(self) -> None:
        """Cancel every supervised task and wait for them to finish."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
