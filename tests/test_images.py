"""The pure pieces of PROTOCOL 1.3 images: request elements, decoding with its errors, reading
a multimodal folder's layout, the pipeline's image field, usage.images in the closing frame."""

import base64
import json

import pytest
from PIL import Image

from poolwire.models.images import Where, decode_image, image_bytes
from poolwire.models.multimodal import find_multimodal
from poolwire.schemas.errors import PoolingError
from poolwire.schemas.media import (ImageElement, ImageRefElement, TextElement, elements_of,
                                   has_elements, has_images)
from poolwire.schemas.requests import parse_request
from poolwire.schemas.tasks import Task
from tests.multimodal_models import encoded

PNG = encoded(Image.new("RGBA", (30, 20), (1, 2, 3, 4)), "PNG")


def test_elements_parse_in_every_field_and_keep_their_order():
    r = parse_request(Task.EMBED, {"input": ["a", {"image": PNG}, {"text": "b"},
                                             {"image_ref": {"bucket": "p", "name": "x.png"}}]})
    assert [type(v) for v in r.input] == [str, ImageElement, TextElement, ImageRefElement]
    s = parse_request(Task.SCORE, {"query": {"image": "aGk="}, "documents": ["d", {"image": PNG}]})
    assert has_images(s) and isinstance(s.query, ImageElement)
    p = parse_request(Task.SCORE, {"text_1": {"text": "t"}, "text_2": [{"image": PNG}]})
    assert isinstance(p.text_1, TextElement) and has_images(p)
    assert not has_images(parse_request(Task.EMBED, {"input": ["only", "texts"]}))


@pytest.mark.parametrize("task, body", [
    (Task.EMBED, {"input": "plain"}),
    (Task.EMBED, {"input": ["plain", "texts"]}),
    (Task.EMBED, {"input": [3, 4]}),                                  # token ids are not elements
    (Task.EMBED, {"input": [[3, 4], [5]]}),
    (Task.EMBED, {"input": {"text": "one"}}),
    (Task.EMBED, {"input": ["a", "b", {"text": "last"}]}),            # not only the first looked at
    (Task.EMBED, {"input": [{"image": PNG}, "b"]}),
    (Task.SCORE, {"text_1": "q", "text_2": ["a", "b"]}),
    (Task.SCORE, {"text_1": "q", "text_2": ["a", {"text": "b"}]}),
    (Task.SCORE, {"query": "q", "documents": ["a", "b"]}),
    (Task.SCORE, {"query": {"text": "q"}, "documents": ["a"]}),
    (Task.SCORE, {"query": "q", "documents": ["a", {"image": PNG}]}),
])
def test_has_elements_is_whether_any_element_is_not_a_plain_string(task, body):
    request = parse_request(task, body)
    assert has_elements(request) == any(not isinstance(v, str) for _, _, v in elements_of(request))


@pytest.mark.parametrize("body", [
    {"input": [{"image": b""}]},                                  # empty, as "" is
    {"input": [{"text": ""}]},
    {"input": [{"image": PNG, "text": "both"}]},                  # one kind per element
    {"input": [{"image_ref": {"bucket": "b"}}]},                  # name missing
    {"input": [{"image_ref": {"bucket": "", "name": "n"}}]},
    {"input": [{"picture": PNG}]},
])
def test_malformed_elements_are_invalid_requests(body):
    with pytest.raises(PoolingError) as err:
        parse_request(Task.EMBED, body)
    assert err.value.code.value == "invalid_request" and err.value.extra["field"] == "input"


def test_decoding_refuses_what_it_cannot_use_naming_the_element():
    where = Where("documents", 3)
    assert decode_image(PNG, 600, where).size == (30, 20)
    assert image_bytes(base64.b64encode(PNG).decode(), where) == PNG
    for call, words in ((lambda: decode_image(b"GIF89a broken", 10**6, where), "not an image"),
                        (lambda: decode_image(PNG[:60], 10**6, where), "not an image"),
                        (lambda: decode_image(PNG, 599, where), "600 pixels"),
                        (lambda: image_bytes("***", where), "base64")):
        with pytest.raises(PoolingError) as err:
            call()
        assert words in err.value.message
        assert (err.value.extra["field"], err.value.extra["index"]) == ("documents", 3)
    ref = Where("input", 0, "photos", "a.png").error("gone")
    assert {k: ref.extra[k] for k in ("bucket", "name", "index")} == \
        {"bucket": "photos", "name": "a.png", "index": 0}


def test_multimodal_folders_are_recognised_by_their_files(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "siglip"}))
    assert find_multimodal(plain).model_type == "siglip"
    st = tmp_path / "st"
    (st / "0_CLIPModel").mkdir(parents=True)
    (st / "0_CLIPModel" / "config.json").write_text(json.dumps({"model_type": "clip"}))
    modules = [{"idx": 0, "name": "0", "path": "0_CLIPModel",
                "type": "sentence_transformers.models.CLIPModel"}]
    (st / "modules.json").write_text(json.dumps(modules))
    found = find_multimodal(st)
    assert (found.model_dir, found.st_folder, found.normalize) == (st / "0_CLIPModel", True, False)
    (st / "modules.json").write_text(json.dumps(
        modules + [{"idx": 1, "name": "1", "path": "1_Normalize",
                    "type": "sentence_transformers.models.Normalize"}]))
    assert find_multimodal(st).normalize
    (st / "modules.json").write_text(json.dumps(
        modules + [{"idx": 1, "name": "1", "path": "1_Dense",
                    "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ValueError, match="Dense"):
        find_multimodal(st)
    text = tmp_path / "text"
    text.mkdir()
    (text / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert find_multimodal(text) is None


def test_a_pipeline_document_with_its_image_field_is_an_image_request():
    from poolwire.actors.pipeline import PipelineSpec, request_for

    spec = PipelineSpec("S", "in", "out", "embed", image_field="photo")
    ref = {"bucket": "photos", "name": "42.jpg"}
    assert request_for({"text": "t", "photo": ref}, spec, "r1")["input"] == {"image_ref": ref}
    assert request_for({"photo": PNG}, spec, "r2")["input"] == {"image": PNG}
    assert request_for({"text": "t"}, spec, "r3")["input"] == "t"
    with pytest.raises(PoolingError, match="photo"):
        request_for({"photo": 42}, spec, "r4")


def test_usage_images_is_in_the_closing_frame_only_when_there_are_images():
    from poolwire.actors.framing import ReplyStyle, done_frame
    from poolwire.schemas.codec import WireFormat, decode

    style = ReplyStyle(WireFormat.JSON, False, "float32")
    with_images, _ = decode(done_frame("r", "m", "embed", 5, style, images=2))
    without, _ = decode(done_frame("r", "m", "embed", 5, style))
    assert with_images["usage"] == {"prompt_tokens": 5, "total_tokens": 5, "images": 2}
    assert "images" not in without["usage"]
