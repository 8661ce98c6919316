"""PoolingClient: an async client for poolwire workers over NATS (PROTOCOL.md)."""

import asyncio
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import nats.errors
import nats.js.errors
from opentelemetry import propagate

from poolwire.cli_nats import CLIENT_CONNECTION_OPTIONS
from poolwire.client_images import DEFAULT_IMAGE_BUCKET, ImageUploads
from poolwire.nats_connect import NatsOptions, close_quietly, connect
from poolwire.refusals import watch
from poolwire.schemas.codec import decode
from poolwire.whole_reply import assemble_stream, merge_replies, split_body


class PoolingServiceError(Exception):
    """An error frame from a worker: `code`, `message` and the code's extra keys."""

    def __init__(self, request_id: str, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.request_id = request_id
        self.code = error.get("code")
        self.error = error


class JobNotStoredError(Exception):
    """A durable job that no JetStream stream stored, even after retrying the publish."""


def _check(frame: dict[str, Any]) -> dict[str, Any]:
    if "error" in frame:
        raise PoolingServiceError(frame.get("request_id", ""), frame["error"])
    return frame


DEFAULT_URL = "nats://127.0.0.1:4222"


def environment_options(given: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """NATS_URL, NATS_CREDS, NATS_USER, ...: the variables the CLI reads (the same table,
    poolwire/cli_nats.py), each used only where the caller gave no value of its own."""
    url, options = None, dict(given)
    for option, env, _ in CLIENT_CONNECTION_OPTIONS:
        value = os.environ.get(env)
        if not value:
            continue
        name = option.removeprefix("--nats-").replace("-", "_")
        if name == "url":
            url = value
        elif options.get(name) is None:
            options[name] = value
    return url, options


def trace_headers(headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """The caller's current span context as W3C headers (the OpenTelemetry API's global
    propagator: nothing when the caller has no span, or no SDK is configured)."""
    out = dict(headers or {})
    propagate.inject(out)
    return out or None


# Request ids of answered durable jobs remembered to tell a repeated frame from a stray one;
# bounded so a long-lived client does not grow without end.
_ANSWERED_KEPT = 100_000


class PoolingClient:
    """`async with PoolingClient(url) as c: reply = await c.embed(["hello"])`.

    Given a URL (several comma-separated for a cluster) it opens its own connection, with the
    keyword options of poolwire.nats_connect.NatsOptions: creds, nkey, user, password, token,
    ca, cert, key, inbox_prefix, connect_timeout_s, reconnect_wait_s. An option not given is
    read from its variable as the CLI does (NATS_CREDS, NATS_USER, NATS_PASSWORD, ...; the URL
    from NATS_URL when none is given), unless `use_env=False`. An unreachable server or
    refused credentials raise NatsConnectError (one line) within connect_timeout_s.

    When the caller has a current OpenTelemetry span, every request and job carries its
    context (`traceparent`), so a tracing worker continues the caller's trace."""

    def __init__(self, nc_or_url: Any = None, prefix: str = "pooling",
                 timeout: float = 30.0, use_env: bool = True,
                 image_bucket: str = DEFAULT_IMAGE_BUCKET, **connect_options: Any) -> None:
        if nc_or_url is None or isinstance(nc_or_url, str):
            env_url, options = environment_options(connect_options) if use_env \
                else (None, connect_options)
            connect_options = options
            nc_or_url = nc_or_url or env_url or DEFAULT_URL
        self._nc_or_url = nc_or_url
        self._own = isinstance(nc_or_url, str)
        self._connect_options = NatsOptions.from_values(nc_or_url, **connect_options) \
            if self._own else None
        self.nc = None if self._own else nc_or_url
        self.prefix = prefix
        self.timeout = timeout
        # Where images too big for one message go (PROTOCOL 1.3 image_ref); created if absent.
        self.image_bucket = image_bucket
        # Durable jobs (`submit`): one inbox for all of them, frames matched by request_id.
        self._jobs_inbox: str | None = None
        self._jobs_sub = None
        self._waiting: dict[str, asyncio.Future] = {}
        self._answered: OrderedDict[str, None] = OrderedDict()
        self.job_frames = 0          # final frames received for durable jobs, repeats included
        self.duplicates_dropped = 0  # of those, repeats of an answered job (at-least-once)
        self.publish_retries = 0     # JetStream publishes tried again (e.g. a leader election)
        self.resubmitted = 0         # durable jobs published again after resubmit_after_s

    async def __aenter__(self) -> "PoolingClient":
        if self.nc is None:
            self.nc = await connect(self._connect_options)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._jobs_sub is not None:
            try:
                await self._jobs_sub.unsubscribe()
            except nats.errors.Error:
                pass  # the connection is already gone
            self._jobs_sub = None
        if self._own and self.nc is not None:
            await close_quietly(self.nc)
            self.nc = None

    async def request(self, task: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One request; returns the whole reply map, raises PoolingServiceError on errors.
        Big inputs never fail for their size: a request over max_payload is sent in parts (by
        its items), and a reply over it (`payload_too_large`, refused before any compute)
        comes as a stream; either way the answer has the one-reply shape."""
        body = {k: v for k, v in body.items() if v is not None}
        uploads = ImageUploads(self.nc, self.image_bucket)
        try:
            return await self._request(task, await uploads.lift(body), timeout)
        finally:
            await uploads.clean()

    async def _request(self, task: str, body: dict[str, Any],
                       timeout: float | None) -> dict[str, Any]:
        parts = split_body(task, body, self.nc.max_payload)
        if len(parts) == 1:
            return await self._one(task, body, timeout)
        request_id = body.get("request_id") or uuid.uuid4().hex
        replies = await asyncio.gather(*(
            self._one(task, {**part, "request_id": f"{request_id}.{k}"}, timeout)
            for k, (_, part) in enumerate(parts)))
        return merge_replies([(start, r) for (start, _), r in zip(parts, replies)], request_id)

    async def _one(self, task: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        subject = f"{self.prefix}.{task}"
        with watch(self.nc, subject):  # a subject the user may not publish to fails at once
            msg = await self.nc.request(subject, msgpack.packb(body, use_bin_type=True),
                                        timeout=timeout or self.timeout, headers=trace_headers())
        frame, _ = decode(msg.data)
        error = frame.get("error")
        if error and error.get("code") == "payload_too_large" and not body.get("stream"):
            request_id = body.get("request_id") or uuid.uuid4().hex
            frames = [f async for f in self.stream(task, {**body, "request_id": request_id}, timeout)]
            return assemble_stream(frames, request_id, ranked="query" in body)
        return _check(frame)

    async def stream(self, task: str, body: dict[str, Any],
                     timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield item frames, then the final `done` frame; raises on an error frame."""
        body = {k: v for k, v in body.items() if v is not None} | {"stream": True}
        body.setdefault("request_id", uuid.uuid4().hex)
        subject = f"{self.prefix}.{task}"
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        try:
            # Only the first wait can be refused: a frame back means the server took the publish.
            with watch(self.nc, subject):
                await self.nc.publish(subject, msgpack.packb(body, use_bin_type=True), reply=inbox,
                                      headers=trace_headers())
                msg = await sub.next_msg(timeout=timeout or self.timeout)
            while True:
                frame, _ = decode(msg.data)
                yield _check(frame)
                if frame.get("done"):
                    return
                msg = await sub.next_msg(timeout=timeout or self.timeout)
        finally:
            await sub.unsubscribe()

    async def submit(self, task: str, body: dict[str, Any], timeout: float | None = None,
                     publish_retry_s: float = 10.0,
                     resubmit_after_s: float | None = None) -> dict[str, Any]:
        """A durable job (PROTOCOL.md "Durable mode"): published through JetStream to
        `P.jobs.<task>`, kept until a worker answered it, so it survives worker deaths and
        restarts. Returns the one-message reply; raises PoolingServiceError on an error frame.
        Delivery is at least once: repeated frames of an answered job are dropped by request_id
        (counted in `duplicates_dropped`). Publishing is retried for `publish_retry_s` seconds,
        which covers a stream leader election (about 4.3 s measured, NATS.md section 7).

        The answer itself travels by core NATS to this client's inbox, at most once: a reply
        published while this connection is between servers (its server killed, say) is lost,
        and the worker, which published it, acks the job. `resubmit_after_s` publishes the job
        again after that long without an answer, under a new `Nats-Msg-Id` (the stream would
        drop the same id as a duplicate), so it is computed again; set it above the longest a
        job may legitimately wait, since every resubmission is computed."""
        body = {k: v for k, v in body.items() if v is not None}
        if body.get("stream"):
            raise ValueError("submit returns one reply message; drop `stream` (a durable job's "
                             "frames are not streamed through submit)")
        request_id = body.setdefault("request_id", uuid.uuid4().hex)
        await self._ensure_jobs_inbox()
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        data = msgpack.packb(body, use_bin_type=True)
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            msg_id, attempt = request_id, 0
            while True:
                await self._publish_job(task, data, msg_id, publish_retry_s)
                left = deadline - time.monotonic()
                wait = left if resubmit_after_s is None else min(left, resubmit_after_s)
                try:
                    frame = await asyncio.wait_for(asyncio.shield(future), max(wait, 0.0))
                    break
                except asyncio.TimeoutError:
                    if time.monotonic() >= deadline:
                        raise
                attempt += 1
                msg_id = f"{request_id}:{attempt}"
                self.resubmitted += 1
        finally:
            self._waiting.pop(request_id, None)
        return _check(frame)

    async def _ensure_jobs_inbox(self) -> None:
        if self._jobs_sub is None:
            self._jobs_inbox = self.nc.new_inbox()
            self._jobs_sub = await self.nc.subscribe(self._jobs_inbox, cb=self._on_job_frame)

    async def _on_job_frame(self, msg) -> None:
        try:
            frame, _ = decode(msg.data)
        except Exception:  # not a poolwire frame: nothing waits for it
            return
        request_id = frame.get("request_id")
        self.job_frames += 1
        future = self._waiting.get(request_id)
        if future is None or future.done():
            if request_id in self._answered:
                self.duplicates_dropped += 1
            return
        future.set_result(frame)
        self._answered[request_id] = None
        if len(self._answered) > _ANSWERED_KEPT:
            self._answered.popitem(last=False)

    async def _publish_job(self, task: str, data: bytes, msg_id: str, retry_s: float) -> None:
        subject = f"{self.prefix}.jobs.{task}"
        headers = trace_headers({"Pooling-Reply-To": self._jobs_inbox, "Nats-Msg-Id": msg_id})
        js = self.nc.jetstream()
        deadline = time.monotonic() + retry_s
        while True:
            try:
                with watch(self.nc, subject):  # not retried: it would be refused again
                    await js.publish(subject, data, headers=headers, timeout=2.0)
                return
            except (nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError,
                    nats.errors.TimeoutError, nats.errors.NoRespondersError,
                    nats.errors.ConnectionReconnectingError) as exc:
                # The same id is sent again, so a publish that was stored after all is not
                # stored twice (the stream de-duplicates by Nats-Msg-Id).
                if time.monotonic() >= deadline:
                    raise JobNotStoredError(
                        f"no JetStream stream took {subject} within {retry_s} s ({exc!r}); "
                        f"start a worker with --durable (it creates the stream) or check the "
                        f"NATS cluster") from exc
                self.publish_retries += 1
                await asyncio.sleep(0.2)

    async def embed(self, input, **options) -> dict[str, Any]:
        """Texts, and on a multimodal model images: bytes of an image file or its
        `pathlib.Path` (too big for a message, it goes through the object store)."""
        return await self.request("embed", {"input": input, **options})

    async def token_embed(self, input, **options) -> dict[str, Any]:
        return await self.request("token_embed", {"input": input, **options})

    async def classify(self, input, **options) -> dict[str, Any]:
        return await self.request("classify", {"input": input, **options})

    async def token_classify(self, input, **options) -> dict[str, Any]:
        return await self.request("token_classify", {"input": input, **options})

    async def score(self, text_1, text_2, **options) -> dict[str, Any]:
        return await self.request("score", {"text_1": text_1, "text_2": text_2, **options})

    async def rerank(self, query: str, documents: list[str], top_n: int | None = None,
                     return_documents: bool | None = None, **options) -> dict[str, Any]:
        """The rerank form of score (PROTOCOL 1.2): `data` holds the documents ranked by score,
        highest first, each `{index, data}` (`index` its position in `documents`, `document`
        too with return_documents), cut to top_n."""
        return await self.request("score", {"query": query, "documents": list(documents),
                                            "top_n": top_n, "return_documents": return_documents,
                                            **options})
