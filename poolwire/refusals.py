"""Requests the NATS server refused by permission: fail them at once, in one line.

A user's permissions (a server config's `permissions`, or the `pub`/`sub` of a user JWT in a
credentials file) may not allow a subject. nats-server then drops the publish or subscription
and sends `-ERR 'Permissions Violation for Publish to "S"'` (or `... for Subscription to ...`),
keeping the connection open. nats-py 2.16 hands that only to `error_cb`: a request to S would
wait out its whole timeout and then read like an overloaded worker, and a refused reply
subscription leaves every later request without replies. `Refusals` (one per connection, fed
by poolwire.nats_connect's error_cb) interrupts the requests it concerns instead: it cancels
the waiting task, and `watch` turns that cancellation into PermissionRefusedError. Watching
costs about 10 us a request on this (loaded, 2-core) machine; racing each request against a
refusal future in a task of its own cost about 70 us, a fifth of a request's round trip.

nats-py lowercases the server's error text, subjects included, so subjects are compared
lowercased; a subject that differs from an allowed one only in case is the one ambiguity."""

import asyncio
import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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


@dataclass(eq=False)
class _Waiter:
    task: asyncio.Task
    subject: str                        # as the request sent it (the error text is lowercased)
    error: PermissionRefusedError | None = None

    def refuse(self, error: PermissionRefusedError) -> None:
        if self.error is None:
            self.error = error
            self.task.cancel()


class Refusals:
    """The permission refusals of one connection, for the requests waiting on them."""

    def __init__(self, reply_prefix: str = "_INBOX") -> None:
        self.reply_prefix = reply_prefix
        # Once the reply subscription is refused, no request of this connection gets a reply
        # (nats-py subscribes once and keeps using it): later requests fail at once too.
        self.reply_refused: str | None = None
        self._publish: dict[str, set[_Waiter]] = {}  # by subject, lowercased
        self._subscribe: dict[str, set[_Waiter]] = {}  # subscriptions watched, by subject
        self._waiting: set[_Waiter] = set()

    def notify(self, text: str) -> bool:
        """Feed one server error text; True when a waiting request will raise it."""
        violation = parse_violation(text)
        if violation is None:
            return False
        kind, subject = violation
        if kind == "publish":
            waiting = self._publish.get(subject, set())
            for w in waiting:
                w.refuse(PermissionRefusedError(
                    f"the NATS server refused this user publishing to {w.subject!r} "
                    f"(permissions violation); use credentials allowed to publish there "
                    f"({_FIX_CREDENTIALS}) or ask the operator to allow it"))
            return bool(waiting)
        if waiting := self._subscribe.get(subject, set()):
            for w in waiting:
                w.refuse(PermissionRefusedError(
                    f"the NATS server refused this user subscribing to {w.subject!r} "
                    f"(permissions violation); use credentials allowed to subscribe there "
                    f"({_FIX_CREDENTIALS}) or ask the operator to allow it"))
            return True
        if subject.startswith(self.reply_prefix.lower() + "."):
            self.reply_refused = subject
            for w in self._waiting:
                w.refuse(self.reply_error())
            return bool(self._waiting)
        return False

    def reply_error(self) -> PermissionRefusedError:
        return PermissionRefusedError(
            f"the NATS server refused this user subscribing to its reply subjects under "
            f"{self.reply_prefix!r} (permissions violation); set --nats-inbox-prefix / "
            f"POOLWIRE_NATS_INBOX_PREFIX (PoolingClient's inbox_prefix) to a prefix the user may "
            f"subscribe to, or ask the operator to allow {self.reply_prefix}.>")

    @contextlib.contextmanager
    def watch(self, subject: str, subscription: bool = False) -> Iterator[None]:
        """While inside (awaiting a publish to `subject` and its reply, with no `yield` of an
        async generator in between), a refusal of `subject` or of the reply subscription
        raises PermissionRefusedError at the await. `subscription`: a refused subscription to
        `subject` (rather than a publish) is what raises, as for `poolwire events`."""
        if self.reply_refused is not None:
            raise self.reply_error()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Refusals.watch needs a running asyncio task")
        w = _Waiter(task, subject)
        key = subject.lower()
        by_subject = self._subscribe if subscription else self._publish
        by_subject.setdefault(key, set()).add(w)
        self._waiting.add(w)
        try:
            yield
        except asyncio.CancelledError:
            if w.error is None:
                raise  # cancelled by someone else
            task.uncancel()
            raise w.error from None
        finally:
            self._waiting.discard(w)
            waiting = by_subject.get(key)
            if waiting is not None:
                waiting.discard(w)
                if not waiting:
                    del by_subject[key]


@contextlib.contextmanager
def watch(nc: Any, subject: str, subscription: bool = False) -> Iterator[None]:
    """Watch `subject` on a poolwire connection; on any other connection (one the caller made
    with nats-py itself) requests just wait for their timeout as before."""
    refusals = getattr(nc, "refusals", None)
    if refusals is None:
        yield
        return
    with refusals.watch(subject, subscription):
        yield
