"""The self-check's I/O: probes through the server to a subject only this worker subscribes
to, the heartbeat file for `poolwire health`, and the recovery the pure SelfCheck
(actors/selfcheck.py) decides on: a forced reconnect, or giving up so the process exits
non-zero and its supervisor replaces it."""

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from poolwire.actors.health import write_heartbeat
from poolwire.actors.selfcheck import Action, Link, SelfCheck

log = logging.getLogger(__name__)


def probe_subject(prefix: str, probe_id: str) -> str:
    """Under the worker's own prefix, so the permissions that let a worker use `P.>` cover it;
    two tokens past the prefix, so the request subscription `P.*` never sees it."""
    return f"{prefix}.probe.{probe_id}"


def link_of(nc) -> Link:
    if nc.is_closed:
        return Link.CLOSED
    if nc.is_reconnecting or not nc.is_connected:
        return Link.RECONNECTING
    return Link.CONNECTED


class Watchdog:
    def __init__(self, nc, prefix: str, check: SelfCheck, on_fatal: Callable[[str], None],
                 health_file: Path | None = None, identity: dict | None = None) -> None:
        self._nc = nc
        self.check = check
        self.subject = probe_subject(prefix, uuid.uuid4().hex)
        # Only probes carrying this process's nonce count: anyone allowed to publish under the
        # prefix could otherwise make a deaf worker look alive.
        self._nonce = uuid.uuid4().hex.encode()
        self._on_fatal = on_fatal
        self._health_file = health_file
        self._identity = {"pid": os.getpid(), **(identity or {})}
        self._sub = None
        self.stopping = False
        self.last = None               # the latest Verdict
        self.reconnects_forced = 0

    async def start(self) -> None:
        self.check.started_at = time.monotonic()
        self._sub = await self._nc.subscribe(self.subject, cb=self._on_probe)

    async def _on_probe(self, msg) -> None:
        nonce, _, seq = msg.data.partition(b":")
        if nonce == self._nonce and seq.isdigit():
            self.check.answered(int(seq), time.monotonic())

    def link_changed(self) -> None:
        """From the connection's disconnected/reconnected callbacks."""
        self.check.link_changed(link_of(self._nc), time.monotonic())

    def closed(self) -> None:
        """From the connection's closed callback: unless we are stopping, this is fatal."""
        if not self.stopping:
            self.give_up("the NATS connection was closed for good")

    def give_up(self, reason: str) -> None:
        """Beyond what a reconnect can cure: report it, so the process exits non-zero."""
        if self.stopping:
            return
        self.stopping = True
        log.error("%s; exiting so that a supervisor replaces this worker", reason)
        self._write(False, reason)
        self._on_fatal(reason)

    def _write(self, healthy: bool, reason: str, stopped: bool = False) -> None:
        if self._health_file is None:
            return
        c = self.check
        record = {**self._identity, "healthy": healthy, "reason": reason, "stopped": stopped,
                  "updated": time.time(),
                  "stale_after_s": 3 * c.interval_s + c.timeout_s}
        try:
            write_heartbeat(self._health_file, record)
        except OSError as exc:
            log.warning("could not write the heartbeat %s: %s", self._health_file, exc)

    async def run(self) -> None:
        tick = min(0.25, self.check.interval_s / 2)
        last_write = 0.0
        while not self.stopping:
            now = time.monotonic()
            link = link_of(self._nc)
            self.check.received(self._nc.stats["in_msgs"], now)
            if link is Link.CONNECTED and (seq := self.check.next_probe(now)) is not None:
                try:
                    await self._nc.publish(self.subject, self._nonce + b":" + str(seq).encode())
                except Exception as exc:  # the link dropped since link_of(): the next tick sees it
                    log.debug("self-check probe not sent: %r", exc)
            verdict = self.check.verdict(link, now)
            changed = self.last is None or verdict.state != self.last.state
            if (changed or verdict.action is not Action.NONE) and not verdict.healthy:
                log.warning("self-check: %s", verdict.reason)  # once per change of state
            self.last = verdict
            if verdict.action is Action.RECONNECT:
                self.reconnects_forced += 1
                await self._nc.force_reconnect()
            elif verdict.action is Action.EXIT:
                self.give_up(f"{verdict.reason} (probes go to {self.subject}: the worker's "
                              f"NATS user must be allowed to publish and subscribe to it)")
                return
            if now - last_write >= self.check.interval_s or not verdict.healthy:
                self._write(verdict.healthy, verdict.reason)
                last_write = now
            await asyncio.sleep(tick)

    async def stop(self) -> None:
        self.stopping = True
        self._write(False, "stopping", stopped=True)
