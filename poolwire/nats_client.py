"""nats-py's Client with workarounds for the faults that leave a nats-py 2.16 connection deaf
(NATS.md section 9; RELIABILITY.md "Lost connections and a deaf worker" describes them as
upstream bugs). Both hooks are private methods of nats-py: the tests in
tests/test_deaf_e2e.py send the real faulty traffic, so an upgrade that changes them fails there.
"""

import asyncio
import logging

from nats.aio.client import Client
from nats.errors import ProtocolError

log = logging.getLogger(__name__)

# -ERR texts after which the server keeps the connection open; any other -ERR is followed by
# the server closing it (nats-server's client.go), so reconnecting is the right answer.
_KEEPS_CONNECTION = ("permissions violation",)
# An authorization failure repeats on every reconnect: let nats-py close as it always did, so
# the owner sees a closed connection and reports it.
_AUTH = "authorization violation"


class ResilientClient(Client):
    """A nats-py Client that reconnects where nats-py 2.16 goes deaf."""

    async def _read_loop(self) -> None:
        await super()._read_loop()
        me = asyncio.current_task()
        if me is not None and (me.cancelling() or self._reading_task is not me):
            # Stopped by a reconnect or a close (nats-py swallows the CancelledError), which
            # may already have started the next connection and its own read loop.
            return
        # nats-py 2.16's read loop ends without a reconnect when parsing raises anything but
        # ProtocolError/OSError (invalid UTF-8 in a subject, reply subject or header status line;
        # a bare `NATS/1.0` header block): it logs "nats: encountered error" and returns with
        # the status still CONNECTED, so nothing is read again until the stale-ping check fires
        # minutes later. The loop also returns when a reconnect or close cancelled it, and then
        # the status is no longer CONNECTED.
        if self._status == Client.CONNECTED:
            log.warning("the NATS read loop ended on undecodable traffic; reconnecting")
            await self._process_op_err(ProtocolError())

    async def _process_err(self, err_msg: str) -> None:
        text = err_msg.strip().strip("'").lower()
        if any(k in text for k in _KEEPS_CONNECTION) or _AUTH in text or self.is_connecting:
            await super()._process_err(err_msg)
            return
        # nats-py 2.16 closes the client for good on any other -ERR, e.g. 'Maximum Payload
        # Violation' after a message whose headers pushed it over max_payload (its own check
        # counts only the body). The server drops the connection anyway; reconnect instead.
        log.warning("NATS server error %s; reconnecting", err_msg.strip())
        self._err = ProtocolError(err_msg.strip())
        await self._process_op_err(self._err)
