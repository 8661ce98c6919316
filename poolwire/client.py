"""PoolingClient: an async client for poolwire workers over NATS (PROTOCOL.md)."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgpack

from poolwire.nats_connect import NatsOptions, close_quietly, connect
from poolwire.schemas.codec import decode


class PoolingServiceError(Exception):
    """An error frame from a worker: `code`, `message` and the code's extra keys."""

    def __init__(self, request_id: str, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.request_id = request_id
        self.code = error.get("code")
        self.error = error


def _check(frame: dict[str, Any]) -> dict[str, Any]:
    if "error" in frame:
        raise PoolingServiceError(frame.get("request_id", ""), frame["error"])
    return frame


class PoolingClient:
    """`async with PoolingClient(url) as c: reply = await c.embed(["hello"])`.

    Given a URL (several comma-separated for a cluster) it opens its own connection, with the
    keyword options of poolwire.nats_connect.NatsOptions: creds, nkey, user, password, token,
    ca, cert, key, inbox_prefix, connect_timeout_s, reconnect_wait_s. An unreachable server or
    refused credentials raise NatsConnectError (one line) within connect_timeout_s."""

    def __init__(self, nc_or_url: Any = "nats://127.0.0.1:4222", prefix: str = "pooling",
                 timeout: float = 30.0, **connect_options: Any) -> None:
        self._nc_or_url = nc_or_url
        self._own = isinstance(nc_or_url, str)
        self._connect_options = NatsOptions.from_values(nc_or_url, **connect_options) \
            if self._own else None
        self.nc = None if self._own else nc_or_url
        self.prefix = prefix
        self.timeout = timeout

    async def __aenter__(self) -> "PoolingClient":
        if self.nc is None:
            self.nc = await connect(self._connect_options)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own and self.nc is not None:
            await close_quietly(self.nc)
            self.nc = None

    async def request(self, task: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One-message request; returns the reply map, raises PoolingServiceError on errors."""
        body = {k: v for k, v in body.items() if v is not None}
        msg = await self.nc.request(f"{self.prefix}.{task}", msgpack.packb(body, use_bin_type=True),
                                    timeout=timeout or self.timeout)
        frame, _ = decode(msg.data)
        return _check(frame)

    async def stream(self, task: str, body: dict[str, Any],
                     timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield item frames, then the final `done` frame; raises on an error frame."""
        body = {k: v for k, v in body.items() if v is not None} | {"stream": True}
        body.setdefault("request_id", uuid.uuid4().hex)
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        try:
            await self.nc.publish(f"{self.prefix}.{task}", msgpack.packb(body, use_bin_type=True),
                                  reply=inbox)
            while True:
                msg = await sub.next_msg(timeout=timeout or self.timeout)
                frame, _ = decode(msg.data)
                yield _check(frame)
                if frame.get("done"):
                    return
        finally:
            await sub.unsubscribe()

    async def embed(self, input, **options) -> dict[str, Any]:
        return await self.request("embed", {"input": input, **options})

    async def token_embed(self, input, **options) -> dict[str, Any]:
        return await self.request("token_embed", {"input": input, **options})

    async def classify(self, input, **options) -> dict[str, Any]:
        return await self.request("classify", {"input": input, **options})

    async def token_classify(self, input, **options) -> dict[str, Any]:
        return await self.request("token_classify", {"input": input, **options})

    async def score(self, text_1, text_2, **options) -> dict[str, Any]:
        return await self.request("score", {"text_1": text_1, "text_2": text_2, **options})
