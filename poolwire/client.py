"""PoolingClient: an async client for poolwire workers over NATS (PROTOCOL.md)."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import nats

from poolwire.schemas.codec import decode
from poolwire.whole_reply import assemble_stream, merge_replies, split_body


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
    """`async with PoolingClient(url) as c: reply = await c.embed(["hello"])`."""

    def __init__(self, nc_or_url: Any = "nats://127.0.0.1:4222", prefix: str = "pooling",
                 timeout: float = 30.0) -> None:
        self._nc_or_url = nc_or_url
        self._own = isinstance(nc_or_url, str)
        self.nc = None if self._own else nc_or_url
        self.prefix = prefix
        self.timeout = timeout

    async def __aenter__(self) -> "PoolingClient":
        if self.nc is None:
            self.nc = await nats.connect(self._nc_or_url)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own and self.nc is not None:
            await self.nc.close()
            self.nc = None

    async def request(self, task: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One request; returns the whole reply map, raises PoolingServiceError on errors.
        Big inputs never fail for their size: a request over max_payload is sent in parts (by
        its items), and a reply over it (`payload_too_large`, refused before any compute)
        comes as a stream; either way the answer has the one-reply shape."""
        body = {k: v for k, v in body.items() if v is not None}
        parts = split_body(task, body, self.nc.max_payload)
        if len(parts) == 1:
            return await self._one(task, body, timeout)
        request_id = body.get("request_id") or uuid.uuid4().hex
        replies = await asyncio.gather(*(
            self._one(task, {**part, "request_id": f"{request_id}.{k}"}, timeout)
            for k, (_, part) in enumerate(parts)))
        return merge_replies([(start, r) for (start, _), r in zip(parts, replies)], request_id)

    async def _one(self, task: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        msg = await self.nc.request(f"{self.prefix}.{task}", msgpack.packb(body, use_bin_type=True),
                                    timeout=timeout or self.timeout)
        frame, _ = decode(msg.data)
        error = frame.get("error")
        if error and error.get("code") == "payload_too_large" and not body.get("stream"):
            request_id = body.get("request_id") or uuid.uuid4().hex
            frames = [f async for f in self.stream(task, {**body, "request_id": request_id}, timeout)]
            return assemble_stream(frames, request_id)
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
