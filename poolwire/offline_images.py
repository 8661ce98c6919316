"""Images for the offline `PoolingModel` (PROTOCOL 1.3 in this process): an input, a score side,
a query or a document may be a `PIL.Image` or an encoded file's bytes beside texts. A PIL image
goes to the model's processor as it is (encoding it to a file first would change a JPEG's
pixels); bytes are decoded as a worker decodes them."""

from poolwire.models.images import Where, prepare_image, preprocess
from poolwire.schemas.media import ELEMENT_FIELDS, ImageRefElement, elements_of, is_image

_PLACEHOLDER = b"PIL.Image"  # stands in for a PIL image while the request is validated


def _is_pil(value) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(value, Image.Image)


def lift_images(body: dict) -> tuple[dict, dict]:
    """(the body with PIL images and bytes as image elements, the PIL images by (field, index))."""
    pils: dict = {}

    def element(value, field: str, index: int | None):
        if _is_pil(value):
            pils[(field, index)] = value
            return {"image": _PLACEHOLDER}
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {"image": bytes(value)}
        return value

    out = dict(body)
    for field in ELEMENT_FIELDS:
        value = out.get(field)
        if isinstance(value, (list, tuple)):
            out[field] = [element(v, field, i) for i, v in enumerate(value)]
        elif value is not None:
            out[field] = element(value, field, None)
    return out, pils


def prepare_images(request, towers, pils: dict, max_pixels: int) -> dict:
    """Every image element of a validated request preprocessed, by (field, index)."""
    images = {}
    for field, index, value in elements_of(request):
        if not is_image(value):
            continue
        where = Where(field, index)
        if (field, index) in pils:
            images[(field, index)] = preprocess(pils[(field, index)], towers, where)
        elif isinstance(value, ImageRefElement):
            ref = value.image_ref
            raise Where(field, index, ref.bucket, ref.name).error(
                "image_ref reads the NATS object store, which PoolingModel does not use: pass "
                "the image's bytes or a PIL.Image")
        else:
            images[(field, index)] = prepare_image(value.image, towers, max_pixels, where)
    return images
