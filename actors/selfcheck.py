"""When is a worker deaf, and what does it do about it: the pure decision of the end-to-end
self-check (values in, values out; the clock is an argument). The I/O around it is
actors/watchdog.py.

The worker publishes a probe to a subject only it subscribes to, every `interval_s`. A probe
travels through the server and back through the client's read loop and the subscription, so
its return proves the whole receive path works; a probe not back within `timeout_s` while the
client says it is connected means the worker is deaf, whatever the cause. While the client is
disconnected (the server is down, nats-py is reconnecting) no probe can come back and nothing
a worker does helps: that is reported, not acted on.

A probe can also be late because the worker is busy: under a burst of thousands of requests it
waits in the socket behind them. So a late probe counts as deaf only when nothing else arrived
either since it was due (the receive path is stuck), or when it is later than `busy_limit_s`
however much else arrives (a lost subscription amid other traffic).

Deaf: force a reconnect (nats-py then replays every subscription: requests, discovery, the
probe), at most `max_reconnects` times in a row; still deaf after that, or a connection closed
for good (not by our own stop): exit non-zero so a supervisor replaces the process.
"""

from dataclasses import dataclass, field
from enum import Enum


class Link(str, Enum):
    """The client library's view of the connection."""
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


class Action(str, Enum):
    NONE = "none"
    RECONNECT = "reconnect"
    EXIT = "exit"


@dataclass(frozen=True)
class Verdict:
    action: Action
    healthy: bool
    reason: str       # one line, for logs and `poolwire health`
    state: str = ""   # ok, starting, disconnected, deaf, closed: what a change is logged on


@dataclass
class SelfCheck:
    interval_s: float = 1.0
    timeout_s: float = 3.0
    max_reconnects: int = 2
    busy_limit_s: float = 30.0
    started_at: float = 0.0
    last_progress: float | None = None        # when the client last read any message
    _received: int = -1
    _last_look: float | None = None
    last_ok: float | None = None              # when a probe last came back
    down_since: float | None = None           # when the client last lost the connection
    reconnects_forced: int = 0                # forced reconnects since the last probe came back
    _outstanding: dict[int, float] = field(default_factory=dict)   # seq -> sent at
    _next_seq: int = 0

    def next_probe(self, now: float) -> int | None:
        """The sequence number of a probe to send now, or None when one was sent within
        `interval_s` and is still out."""
        if self._outstanding and now - max(self._outstanding.values()) < self.interval_s:
            return None
        seq = self._next_seq
        self._next_seq += 1
        self._outstanding[seq] = now
        return seq

    def answered(self, seq: int, now: float) -> None:
        if self._outstanding.pop(seq, None) is None:
            return  # a probe from before a reconnect, or a repeat: proves nothing new
        # Earlier probes still out were lost on the way; this one proves the path works now.
        self._outstanding = {s: t for s, t in self._outstanding.items() if s > seq}
        self.last_ok = now
        self.reconnects_forced = 0

    def received(self, count: int, now: float) -> None:
        """The client's count of messages read so far (nats-py's stats["in_msgs"])."""
        if count != self._received:
            self._received = count
            self.last_progress = now

    def link_changed(self, link: Link, now: float) -> None:
        """A disconnect or reconnect: probes sent on the old connection never come back."""
        self._outstanding.clear()
        if link is Link.RECONNECTING:
            self.down_since = self.down_since or now
        elif link is Link.CONNECTED:
            self.down_since = None

    def verdict(self, link: Link, now: float) -> Verdict:
        """Asked every fraction of `interval_s`. A longer gap since the last call means the
        process itself was stalled (event loop blocked, CPU starved): probes could not be read
        then, so that time is not counted against them."""
        gap = now - self._last_look if self._last_look is not None else 0.0
        self._last_look = now
        if gap > self.interval_s:
            self._outstanding = {s: t + gap for s, t in self._outstanding.items()}
            if self.last_progress is not None:
                self.last_progress += gap
        if link is Link.CLOSED:
            return Verdict(Action.EXIT, False, "the NATS connection was closed for good", "closed")
        if link is Link.RECONNECTING:
            since = now - (self.down_since if self.down_since is not None else now)
            return Verdict(Action.NONE, False,
                           f"disconnected from NATS for {since:.1f} s; reconnecting", "disconnected")
        oldest = min(self._outstanding.values(), default=None)
        late = oldest is not None and now - oldest >= self.timeout_s
        progress = self.last_progress is not None and now - self.last_progress < self.timeout_s
        if late and progress and now - oldest < self.busy_limit_s:
            return Verdict(Action.NONE, True,
                           f"busy: self-check probe {now - oldest:.1f} s late while messages "
                           f"keep arriving", "busy")
        if not late:
            if self.last_ok is None:
                return Verdict(Action.NONE, now - self.started_at < self.timeout_s,
                               "waiting for the first self-check probe", "starting")
            return Verdict(Action.NONE, True,
                           f"ok: self-check probe answered {now - self.last_ok:.1f} s ago", "ok")
        silent = now - (self.last_ok if self.last_ok is not None else self.started_at)
        if self.reconnects_forced < self.max_reconnects:
            self.reconnects_forced += 1
            self._outstanding.clear()
            return Verdict(Action.RECONNECT, False,
                           f"deaf: no self-check probe came back for {silent:.1f} s; forcing "
                           f"reconnect {self.reconnects_forced} of {self.max_reconnects}", "deaf")
        return Verdict(Action.EXIT, False,
                       f"deaf: no self-check probe came back for {silent:.1f} s, even after "
                       f"{self.max_reconnects} reconnects", "deaf")
