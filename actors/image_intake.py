"""The images of a request on a multimodal model, made ready before it is planned: references
read from the NATS object store (nats-py's object store API), then every image decoded and
preprocessed in a thread pool (models/images.py), never on the event loop. A refusal names its
element (`field`, `index`, `bucket`, `name`) and costs no model time."""

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import nats.errors
import nats.js.errors

from poolwire.models.images import ImageInput, Where, prepare_image
from poolwire.schemas.media import ImageRefElement, elements_of, is_image

log = logging.getLogger(__name__)


class ImageIntake:
    def __init__(self, towers, max_pixels: int, nc=None, threads: int | None = None) -> None:
        self._towers = towers
        self.max_pixels = max_pixels
        self._nc = nc
        self._js = nc.jetstream() if nc is not None else None
        self._stores: dict = {}  # bucket -> ObjectStore, bound once
        # Decoding and resizing hold the GIL only in part (Pillow releases it in its codecs and
        # resampling), so a small pool keeps up with the forward thread; one thread per two
        # cores, since on a CPU the forward pass wants the cores too.
        threads = threads or max(1, min(4, (os.cpu_count() or 2) // 2))
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="poolwire-images")

    async def prepare(self, request) -> dict[tuple[str, int | None], ImageInput]:
        """Every image element's ImageInput by (field, index); raises the PoolingError of the
        first element (in request order) that cannot be used."""
        loop = asyncio.get_running_loop()
        places, work = [], []
        for field, index, value in elements_of(request):
            if not is_image(value):
                continue
            places.append((field, index))
            work.append(self._one(loop, field, index, value))
        results = await asyncio.gather(*work, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return dict(zip(places, results))

    async def _one(self, loop, field: str, index: int | None, value) -> ImageInput:
        if isinstance(value, ImageRefElement):
            ref = value.image_ref
            where = Where(field, index, ref.bucket, ref.name)
            data = await self.fetch(ref.bucket, ref.name, where)
        else:
            where, data = Where(field, index), value.image
        return await loop.run_in_executor(self._pool, prepare_image, data, self._towers,
                                          self.max_pixels, where)

    async def fetch(self, bucket: str, name: str, where: Where) -> bytes:
        if self._js is None:
            raise where.error("image_ref needs the NATS object store, and this model is not "
                              "served over NATS here: send the image's bytes")
        try:
            store = self._stores.get(bucket)
            if store is None:
                store = await self._js.object_store(bucket)
                self._stores[bucket] = store
            return (await store.get(name)).data
        except nats.js.errors.BucketNotFoundError:
            raise where.error(f"there is no object store bucket {bucket!r}; put the image in an "
                              f"existing bucket or send its bytes") from None
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
            raise where.error(f"bucket {bucket!r} has no object {name!r}; put it there before "
                              f"the request, or send the image's bytes") from None
        except nats.js.errors.InvalidBucketNameError:
            raise where.error(f"{bucket!r} is not a valid object store bucket name") from None
        except (nats.js.errors.Error, nats.errors.Error, asyncio.TimeoutError) as exc:
            self._stores.pop(bucket, None)
            raise where.error(f"the object could not be read from the object store ({exc!r}); "
                              f"retry, or send the image's bytes") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

