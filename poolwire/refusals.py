"""Requests the NATS server refused by permission: fail them at once, in one line.

A user's permissions (a server config's `permissions`, or the `pub`/`sub` of a user JWT in a
credentials file) may not allow a subject. nats-server then drops the publish or subscription
and sends `-ERR 'Permissions Violation for Publish to "S"'` (or `... for Subscription to ...`),
keeping the connection open. nats-py 2.16 hands that only to `error_cb`: a request to S would
wait out its whole timeout and then read like an overloaded worker, and a refused reply
subscription leaves every later request without replies. `Refusals` (one per connection, fed
by poolwire.nats_connect's error_cb) wakes the requests it concerns instead.

nats-py lowercases the server's error text, subjects included, so subjects are compared
lowercased; a subject that differs from an allowed one only in case is the one ambiguity."""

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"',
                        re.IGNORECASE)
_FIX_CREDENTIALS = ("--nats-creds / NATS_CREDS, --nats-nkey / NATS_NKEY, --nats-user / "
                    "NATS_USER")


class PermissionRefusedError(Exception):
    """The NATS server refused this connection a subject it needs; str() is one line."""


def parse_violation(text: str) -> tuple[str, str] | None:
    """('publish' or 'subscription', the subject lowercased) of a permissions -ERR, else None."""
    m = _VIOLATION.search(text)
    return (m.group(1).lower(), m.group(2).lower()) if m else None


class Refusals:
    """The permission refusals of one connection, for the requests waiting on them."""

    def __init__(self, reply_prefix: str = "_INBOX") -> None:
        self.reply_prefix = reply_prefix
        # Once the reply subscription is refused, no request of this connection gets a reply
        # (nats-py subscribes once and keeps using it): later requests fail at once too.
        self.reply_refused: str | None = None
        # subject lowercased -> {future of a waiting request: the subject as it sent it}
        self._publish: dict[str, dict[asyncio.Future, str]] = {}
        self._replies: set[asyncio.Future] = set()

    def notify(self, text: str) -> bool:
        """Feed one server error text; True when a waiting request will raise it."""
        violation = parse_violation(text)
        if violation is None:
            return False
        kind, subject = violation
        if kind == "publish":
            waiting = self._publish.get(subject, {})
            for future, sent_to in waiting.items():
                if not future.done():
                    future.set_exception(PermissionRefusedError(
                        f"the NATS server refused this user publishing to {sent_to!r} "
                        f"(permissions violation); use credentials allowed to publish there "
                        f"({_FIX_CREDENTIALS}) or ask the operator to allow it"))
            return bool(waiting)
        if subject.startswith(self.reply_prefix.lower() + "."):
            self.reply_refused = subject
            for future in self._replies:
                if not future.done():
                    future.set_exception(self.reply_error())
            return bool(self._replies)
        return False

    def reply_error(self) -> PermissionRefusedError:
        return PermissionRefusedError(
            f"the NATS server refused this user subscribing to its reply subjects under "
            f"{self.reply_prefix!r} (permissions violation); set --nats-inbox-prefix / "
            f"POOLWIRE_NATS_INBOX_PREFIX (PoolingClient's inbox_prefix) to a prefix the user may "
            f"subscribe to, or ask the operator to allow {self.reply_prefix}.>")

    @contextlib.contextmanager
    def watch(self, subject: str) -> Iterator["Watch"]:
        """While inside, a refusal of `subject` or of the reply subscription fails `race`."""
        if self.reply_refused is not None:
            raise self.reply_error()
        future = asyncio.get_running_loop().create_future()
        key = subject.lower()
        self._publish.setdefault(key, {})[future] = subject
        self._replies.add(future)
        try:
            yield Watch(future)
        finally:
            self._replies.discard(future)
            waiting = self._publish.get(key)
            if waiting is not None:
                waiting.pop(future, None)
                if not waiting:
                    del self._publish[key]
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: no "exception was never retrieved" warning
            else:
                future.cancel()


class Watch:
    def __init__(self, refused: asyncio.Future | None) -> None:
        self._refused = refused

    async def race(self, awaitable: Awaitable[T]) -> T:
        """The result of `awaitable`, unless the server refuses the watched subject first."""
        if self._refused is None:
            return await awaitable
        task = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({task, self._refused}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise self._refused.exception()


@contextlib.contextmanager
def watch(nc: Any, subject: str) -> Iterator[Watch]:
    """Watch `subject` on a poolwire connection; on any other connection (one the caller made
    with nats-py itself) requests just wait for their timeout as before."""
    refusals = getattr(nc, "refusals", None)
    if refusals is None:
        yield Watch(None)
        return
    with refusals.watch(subject) as w:
        yield w
