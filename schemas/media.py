"""The elements of PROTOCOL 1.3 "Images (multimodal models)": an input element, a side of a
score pair, a query or a document may be a plain string, `{"text": ...}`, `{"image": <bytes>}`
(MessagePack bin, or a base64 string in a JSON body) or `{"image_ref": {"bucket", "name"}}`
(an object in the NATS object store). Wire types only: decoding the image is the engine's
business, off the event loop (models/images.py)."""

from collections.abc import Iterator
from typing import Annotated, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBytes, StrictStr

_FROZEN = ConfigDict(extra="forbid", frozen=True)


class TextElement(BaseModel):
    """`{"text": "..."}`: a text, as a plain string is."""

    model_config = _FROZEN
    text: StrictStr


class ImageElement(BaseModel):
    """`{"image": <bytes>}`: an encoded PNG, JPEG, WebP or GIF file; a string is base64 (JSON)."""

    model_config = _FROZEN
    image: Union[StrictBytes, StrictStr] = Field(
        description="the encoded image file: MessagePack bin, or base64 in a JSON body")


class ObjectRef(BaseModel):
    model_config = _FROZEN
    bucket: Annotated[StrictStr, Field(min_length=1)]
    name: Annotated[StrictStr, Field(min_length=1)]


class ImageRefElement(BaseModel):
    """`{"image_ref": {"bucket": B, "name": N}}`: an image in the NATS object store."""

    model_config = _FROZEN
    image_ref: ObjectRef


Element = Union[StrictStr, TextElement, ImageElement, ImageRefElement]
ImageLike = (ImageElement, ImageRefElement)

# The request fields that may hold elements, in the protocol's order.
ELEMENT_FIELDS = ("input", "text_1", "text_2", "query", "documents")


def is_image(value) -> bool:
    return isinstance(value, ImageLike)


def text_of(value) -> str | None:
    """The text of a plain string or a TextElement; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, TextElement):
        return value.text
    return None


def elements_of(request) -> Iterator[tuple[str, int | None, object]]:
    """(field, index or None where the field is one element, value) for every element of a
    request's element fields; token-id input is not elements."""
    for name in ELEMENT_FIELDS:
        value = getattr(request, name, None)
        if value is None:
            continue
        if isinstance(value, list):
            if value and isinstance(value[0], (int, list)):
                continue  # token ids
            for i, element in enumerate(value):
                yield name, i, element
        else:
            yield name, None, value


def has_elements(request) -> bool:
    """Whether any element is an image or a `{"text"}` element (not only plain strings).
    Asked of every request twice (model_fields.py): a loop, not elements_of's generator."""
    for name in ELEMENT_FIELDS:
        value = getattr(request, name, None)
        if value is None or isinstance(value, str):
            continue
        if not isinstance(value, list):
            return True
        if value and isinstance(value[0], (int, list)):
            continue  # token ids
        if not all(isinstance(v, str) for v in value):
            return True
    return False


def has_images(request) -> bool:
    return any(is_image(v) for _, _, v in elements_of(request))


def empty_element(value) -> bool:
    """`{"text": ""}` and `{"image": b""}` are empty inputs, as `""` is."""
    if isinstance(value, TextElement):
        return value.text == ""
    if isinstance(value, ImageElement):
        return len(value.image) == 0
    return False
