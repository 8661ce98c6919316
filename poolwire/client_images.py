"""Images a PoolingClient sends (PROTOCOL 1.3): an element given as bytes or a path
(`pathlib.Path`; a str is always a text) becomes `{"image": <bytes>}`, or, when the file is too
big for one message, an object the client puts in a NATS object store bucket it names and
sends as `{"image_ref": {"bucket", "name"}}`, deleting it once the reply is in."""

import logging
import os
import uuid
from pathlib import Path

import nats.errors
import nats.js.errors
from nats.js.api import ObjectMeta, ObjectMetaOptions

from poolwire.schemas.media import ELEMENT_FIELDS

log = logging.getLogger(__name__)

DEFAULT_IMAGE_BUCKET = "poolwire-images"
# Room in a message for everything but the image: the other fields, the MessagePack framing
# and the headers.
_MESSAGE_ROOM = 16 * 1024


def _image_data(value) -> bytes | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Path) or (isinstance(value, os.PathLike) and not isinstance(value, str)):
        return Path(value).read_bytes()
    return None


class ImageUploads:
    """The objects one request put in the object store, deleted by `clean` after its reply."""

    def __init__(self, nc, bucket: str) -> None:
        self._nc = nc
        self._bucket = bucket
        self._store = None
        self.names: list[str] = []

    async def lift(self, body: dict) -> dict:
        out = dict(body)
        for field in ELEMENT_FIELDS:
            value = out.get(field)
            if isinstance(value, (list, tuple)):
                out[field] = [await self._element(v) for v in value]
            elif value is not None:
                out[field] = await self._element(value)
        return out

    async def _element(self, value):
        data = _image_data(value)
        if data is None:
            return value
        if len(data) + _MESSAGE_ROOM <= self._nc.max_payload:
            return {"image": data}
        store = await self._object_store()
        name = f"{uuid.uuid4().hex}"
        # nats-py's default chunk (128 KiB) is over a small max_payload: chunks that fit it.
        chunk = min(128 * 1024, self._nc.max_payload - _MESSAGE_ROOM)
        await store.put(name, data, meta=ObjectMeta(
            name=name, options=ObjectMetaOptions(max_chunk_size=chunk)))
        self.names.append(name)
        return {"image_ref": {"bucket": self._bucket, "name": name}}

    async def _object_store(self):
        if self._store is None:
            js = self._nc.jetstream()
            try:
                self._store = await js.object_store(self._bucket)
            except nats.js.errors.BucketNotFoundError:
                self._store = await js.create_object_store(self._bucket)
        return self._store

    async def clean(self) -> None:
        for name in self.names:
            try:
                await self._store.delete(name)
            except (nats.js.errors.Error, nats.errors.Error) as exc:
                log.warning("could not delete image %s from bucket %s (%r); it stays there",
                            name, self._bucket, exc)
        self.names.clear()
