"""Images for a multimodal model (PROTOCOL 1.3): decoding an encoded file with Pillow and
preprocessing it with the folder's own image processor, one image at a time, so that its pixels
never depend on what it is batched with. Blocking work: the engine runs it in a thread pool,
never on the event loop. Values in, values (or PoolingError) out."""

import base64
import binascii
import io
import warnings
from dataclasses import dataclass

import torch

from poolwire.schemas.errors import PoolingError, invalid

# Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS), the default of
# `--max-image-pixels`; spelled out so that settings need not import Pillow.
PILLOW_MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)


@dataclass(frozen=True)
class Where:
    """Where an element sits in its request, for the error that names it (PROTOCOL 1.3)."""

    field: str
    index: int | None = None
    bucket: str | None = None
    name: str | None = None

    def error(self, message: str) -> PoolingError:
        at = f"{self.field}[{self.index}]" if self.index is not None else self.field
        ref = f" (object {self.name!r} of bucket {self.bucket!r})" if self.bucket else ""
        err = invalid(f"{at}{ref}: {message}", field=self.field)
        for key in ("index", "bucket", "name"):
            value = getattr(self, key)
            if value is not None:
                err.extra[key] = value
        return err


@dataclass(frozen=True)
class ImageInput:
    """One preprocessed image, queued like a token sequence: its length is what it costs the
    batch planner and admission (its patch tokens)."""

    inputs: dict[str, torch.Tensor]  # the processor's outputs, without the batch dimension
    tokens: int

    def __len__(self) -> int:
        return self.tokens


def image_bytes(value: bytes | str, where: Where) -> bytes:
    """The file's bytes: MessagePack bin as it is, a (JSON) string as base64."""
    if isinstance(value, bytes):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise where.error("the image is a string that is not valid base64; send the file's "
                          "bytes (MessagePack bin) or their base64 (JSON)") from None


def decode_image(data: bytes, max_pixels: int, where: Where):
    """The image as Pillow decodes it: the first frame of an animation, no EXIF rotation and no
    conversion (the processor converts, as Sentence-Transformers' encode of a PIL image does).
    The pixel count is checked from the header, before the pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Our own limit is checked below; Pillow's warning about its default would only
            # repeat it in the log.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise where.error(f"the image has {width} x {height} = {width * height} pixels, "
                                  f"over this worker's limit of {max_pixels} (--max-image-pixels);"
                                  f" send a smaller image")
            image.load()
    except PoolingError:
        raise
    except Image.DecompressionBombError as exc:
        raise where.error(f"the image is too large to decode ({exc}); send a smaller image") \
            from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise where.error(f"the bytes are not an image Pillow can decode ({exc}); send a PNG, "
                          f"JPEG, WebP or GIF file") from None
    return image


def preprocess(image, towers, where: Where) -> ImageInput:
    """The folder's image processor on one image (resize, crop, rescale, normalise)."""
    try:
        inputs = towers.preprocess(image)
    except Exception as exc:  # the processor's own refusal of this image (mode, shape)
        raise where.error(f"the model's image processor could not take this image "
                          f"({type(exc).__name__}: {exc}); send an RGB or grayscale image") \
            from None
    return ImageInput(inputs, towers.image_tokens)


def prepare_image(value, towers, max_pixels: int, where: Where) -> ImageInput:
    """Bytes (or base64) -> decoded -> preprocessed; PoolingError(invalid_request) naming
    `where` when any step refuses it."""
    data = image_bytes(value, where)
    return preprocess(decode_image(data, max_pixels, where), towers, where)
