"""Issue 29 (PROTOCOL 1.3 images): tiny CLIP and SigLIP models, saved as users find them, serve
texts and images in one space through a worker, offline and through a durable pipeline, equal to
Sentence-Transformers' encode (ST CLIP folder) and transformers' get_text_features /
get_image_features (plain folders) to 1e-4; images larger than max_payload go through the
object store; bad images are invalid_request naming their element and the worker goes on."""

import base64
import io
import json
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from PIL import Image

from poolwire.models.model import bundled_model_dir, load_model
from tests.multimodal_models import (clip_folder, encoded, siglip2_folder, siglip_folder,
                                     st_clip_folder, test_images)

pytestmark = pytest.mark.timeout(300)

TEXTS = ["a photo of a red cat", "scanned invoice"]
IMAGES = test_images()
ORDER = ["rgba.png", "gray.jpg", "big.png", "small.webp"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def mm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multimodal")
    tok = bundled_model_dir()
    clip = clip_folder(root / "clip", tok)
    return {"clip": clip, "siglip": siglip_folder(root / "siglip", tok),
            "st_clip": st_clip_folder(root / "st-clip", clip),
            "siglip2": siglip2_folder(root / "siglip2", tok)}


@pytest.fixture(scope="module")
def mm_models(mm_dirs):
    return {name: load_model(path) for name, path in mm_dirs.items()}


def _pil(name: str) -> Image.Image:
    return Image.open(io.BytesIO(IMAGES[name]))


def _reference(folder: Path, name: str) -> dict[str, np.ndarray]:
    """Each text and image alone, as the reference library computes it, by text or file name."""
    out = {}
    if name == "st_clip":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")
        for text in TEXTS:
            out[text] = st.encode([text])[0]  # no Normalize module: not normalised
        for key in ORDER:
            out[key] = st.encode([_pil(key)])[0]
        return out
    from transformers import (AutoImageProcessor, AutoTokenizer, CLIPModel, Siglip2Model,
                              SiglipModel)

    cls = {"clip": CLIPModel, "siglip": SiglipModel, "siglip2": Siglip2Model}[name]
    model = cls.from_pretrained(folder).eval()
    tokenizer, images = AutoTokenizer.from_pretrained(folder), \
        AutoImageProcessor.from_pretrained(folder)
    padding = {"padding": "max_length"} if name != "clip" else {}  # as the model cards do

    def unit(v):
        v = getattr(v, "pooler_output", v)[0]
        return torch.nn.functional.normalize(v, dim=-1).numpy()

    with torch.no_grad():
        for text in TEXTS:
            out[text] = unit(model.get_text_features(
                **tokenizer([text], return_tensors="pt", **padding)))
        for key in ORDER:
            if name == "siglip2" and key in ("rgba.png", "gray.jpg"):
                continue  # its processor converts no mode to RGB (an invalid_request, tested)
            out[key] = unit(model.get_image_features(
                **images(images=[_pil(key)], return_tensors="pt")))
    return out


@pytest.fixture(scope="module")
def references(mm_dirs):
    return {name: _reference(path, name) for name, path in mm_dirs.items()}


def _close(got, want):
    got = np.asarray(got, np.float32)
    assert got.shape == want.shape and np.abs(got - want).max() <= ATOL, np.abs(got - want).max()


@pytest.mark.parametrize("name", ["clip", "siglip", "st_clip"])
async def test_texts_and_images_through_a_worker_equal_the_reference(
        name, mm_models, references, start_worker, nc, prefix):
    mixed = [TEXTS[0], *({"image": IMAGES[k]} for k in ORDER), {"text": TEXTS[1]}]
    async with start_worker(mm_models[name]) as worker:
        assert worker.describe()["modalities"] == "text,image"
        assert worker.describe()["embedding_size"] == str(mm_models[name].embedding_size)
        msg = await nc.request(f"{prefix}.embed", msgpack.packb({"input": mixed}), timeout=60)
        reply = msgpack.unpackb(msg.data)
        # JSON: the image as base64; one element as the whole input.
        one = await nc.request(f"{prefix}.embed", json.dumps(
            {"input": {"image": base64.b64encode(IMAGES["gray.jpg"]).decode()}}).encode(),
            timeout=60)
        token_embed = msgpack.unpackb((await nc.request(
            f"{prefix}.token_embed", msgpack.packb({"input": "x"}), timeout=30)).data)
    ref = references[name]
    keys = [TEXTS[0], *ORDER, TEXTS[1]]
    assert [d["index"] for d in reply["data"]] == list(range(len(keys)))  # order kept
    for item, key in zip(reply["data"], keys):
        _close(item["data"], ref[key])
    tok = mm_models[name].tokenizer
    assert reply["usage"]["images"] == len(ORDER)
    assert reply["usage"]["prompt_tokens"] == sum(len(tok(t)["input_ids"]) for t in TEXTS)
    _close(json.loads(one.data)["data"][0]["data"], ref["gray.jpg"])
    assert token_embed["error"]["code"] == "unsupported_task"
    assert token_embed["error"]["supported_tasks"] == ["embed", "score"]


async def test_a_text_query_ranks_image_documents_by_the_reference_cosine(
        mm_models, references, start_worker, nc, prefix):
    ref = references["siglip"]
    docs = [{"image": IMAGES[k]} for k in ORDER] + [TEXTS[1]]
    want = [float(np.dot(ref[TEXTS[0]], ref[k])) for k in [*ORDER, TEXTS[1]]]
    async with start_worker(mm_models["siglip"]):
        reply = msgpack.unpackb((await nc.request(f"{prefix}.score", msgpack.packb(
            {"query": TEXTS[0], "documents": docs, "return_documents": True}), timeout=60)).data)
        pair = msgpack.unpackb((await nc.request(f"{prefix}.score", msgpack.packb(
            {"text_1": {"image": IMAGES["big.png"]}, "text_2": [TEXTS[0], TEXTS[1]]}),
            timeout=60)).data)
    assert [d["index"] for d in reply["data"]] == sorted(range(len(want)), key=lambda i: -want[i])
    for item in reply["data"]:
        assert abs(item["data"] - want[item["index"]]) <= ATOL
        # return_documents echoes text documents only
        assert item.get("document") == (TEXTS[1] if item["index"] == len(ORDER) else None)
    assert reply["usage"]["images"] == len(ORDER)
    for item, text in zip(pair["data"], TEXTS):
        assert abs(item["data"] - float(np.dot(ref["big.png"], ref[text]))) <= ATOL
    assert pair["usage"]["images"] == 1  # one image element, computed once


@pytest.mark.parametrize("name", ["clip", "siglip", "st_clip", "siglip2"])
def test_offline_embeds_pil_images_and_bytes_beside_texts(name, mm_dirs, references):
    from poolwire import PoolingModel
    from poolwire.offline_errors import InvalidRequestError

    model = PoolingModel(str(mm_dirs[name]), device="cpu", backend="torch")
    # SigLIP 2's processor takes RGB only: a grayscale or RGBA file is refused (below).
    pil, raw = ("small.webp", "big.png") if name == "siglip2" else ("rgba.png", "gray.jpg")
    result = model.embed([TEXTS[0], _pil(pil), IMAGES[raw], _pil("big.png")])
    for row, key in zip(np.asarray(result), [TEXTS[0], pil, raw, "big.png"]):
        _close(row, references[name][key])
    assert result.usage["images"] == 3
    if name == "siglip2":  # what its processor refuses is the element's invalid_request
        with pytest.raises(InvalidRequestError, match=r"input\[1\]"):
            model.embed(["x", IMAGES["rgba.png"]])


async def test_bad_images_are_invalid_requests_naming_their_element(
        mm_models, start_worker, nc, prefix):
    huge = encoded(Image.new("RGB", (64, 64)), "PNG")
    async with start_worker(mm_models["clip"], max_image_pixels=48 * 48):
        answers = []
        for body in ({"input": ["ok", {"image": b"not an image at all"}]},
                     {"input": [{"image": IMAGES["small.webp"]}, {"image": huge}]},
                     {"input": [{"image": IMAGES["gray.jpg"]}, "x",
                                {"image_ref": {"bucket": "nobucket", "name": "cat.png"}}]},
                     {"query": {"image": b"\x89PNG broken"}, "documents": ["a"]},
                     {"input": [{"image": "not base64!"}]}):
            task = "score" if "query" in body else "embed"
            answers.append(msgpack.unpackb((await nc.request(
                f"{prefix}.{task}", msgpack.packb(body), timeout=30)).data)["error"])
        after = msgpack.unpackb((await nc.request(
            f"{prefix}.embed", msgpack.packb({"input": [{"image": IMAGES["small.webp"]}]}),
            timeout=30)).data)
    assert all(a["code"] == "invalid_request" for a in answers), answers
    assert (answers[0]["field"], answers[0]["index"]) == ("input", 1)
    assert (answers[1]["index"], "over this worker's limit of 2304") == \
        (1, answers[1]["message"].split("pixels, ")[1].split(" (")[0])
    assert {k: answers[2][k] for k in ("field", "index", "bucket", "name")} == \
        {"field": "input", "index": 2, "bucket": "nobucket", "name": "cat.png"}
    assert answers[3]["field"] == "query" and "index" not in answers[3]
    assert answers[4]["index"] == 0 and "base64" in answers[4]["message"]
    assert len(after["data"]) == 1 and after["usage"]["images"] == 1


async def test_an_image_on_a_text_only_model_is_refused_with_its_index(
        minilm, start_worker, nc, prefix):
    async with start_worker(minilm, backend="torch") as worker:
        assert worker.describe()["modalities"] == "text"
        bad = msgpack.unpackb((await nc.request(f"{prefix}.embed", msgpack.packb(
            {"input": ["a", {"image": IMAGES["big.png"]}]}), timeout=30)).data)
        good = msgpack.unpackb((await nc.request(f"{prefix}.embed", msgpack.packb(
            {"input": ["a", {"text": "b"}]}), timeout=30)).data)
    assert (bad["error"]["code"], bad["error"]["field"], bad["error"]["index"]) == \
        ("invalid_request", "input", 1)
    assert len(good["data"]) == 2


async def test_an_image_over_max_payload_goes_through_the_object_store(
        mm_models, references, start_worker, prefix, tmp_path):
    """A server whose max_payload is smaller than the file: the client puts the image in its
    bucket, sends the reference, and deletes the object after the reply."""
    from poolwire.actors.nats_server import NatsServer
    from poolwire.client import PoolingClient

    big = Image.fromarray(np.random.default_rng(3).integers(0, 256, (160, 160, 3), np.uint8))
    path = tmp_path / "photo.png"
    big.save(path)
    assert path.stat().st_size > 64 * 1024
    ref = references["clip"]
    with torch.no_grad():
        from transformers import AutoProcessor, CLIPModel

        folder = mm_models["clip"].path
        want = CLIPModel.from_pretrained(folder).eval().get_image_features(
            **AutoProcessor.from_pretrained(folder)(images=[Image.open(path)],
                                                    return_tensors="pt"))
        want = torch.nn.functional.normalize(getattr(want, "pooler_output", want)[0], dim=-1)
    with NatsServer(max_payload=64 * 1024) as server:
        async with start_worker(mm_models["clip"], url=server.url):
            async with PoolingClient(server.url, prefix=prefix, image_bucket="photos") as client:
                reply = await client.embed([TEXTS[0], path])
                left = await _objects(await client.nc.jetstream().object_store("photos"))
    _close(reply["data"][0]["data"], ref[TEXTS[0]])
    _close(reply["data"][1]["data"], want.numpy())
    assert reply["usage"]["images"] == 1
    assert left == []


async def _objects(store) -> list[str]:
    import nats.js.errors

    try:
        return [o.name for o in await store.list(ignore_deletes=True)]
    except nats.js.errors.NotFoundError:  # nats-py lists an empty bucket as not found
        return []


async def test_a_durable_pipeline_embeds_photos_from_the_object_store(
        mm_models, references, start_worker, nc, prefix):
    """Product documents whose photos are in the object store (`--pipeline-image-field`), and
    one with its text only, embedded end to end."""
    from nats.js.api import StreamConfig

    root = prefix.replace(".", "_")
    js = nc.jetstream()
    store = await js.create_object_store(f"{root}_photos")
    await store.put("p1.png", IMAGES["rgba.png"])
    await js.add_stream(StreamConfig(name=f"{root}_DOCS", subjects=[f"{root}.in.>"]))
    await js.add_stream(StreamConfig(name=f"{root}_OUT", subjects=[f"{root}.out.>"]))
    results = await nc.subscribe(f"{root}.out.>")
    try:
        async with start_worker(mm_models["st_clip"], pipeline_stream=f"{root}_DOCS",
                                pipeline_input=f"{root}.in", pipeline_output=f"{root}.out",
                                pipeline_id_field="id", pipeline_image_field="photo",
                                durable_ack_wait_s=5.0):
            await js.publish(f"{root}.in.1", msgpack.packb(
                {"id": "p1", "text": "ignored", "photo": {"bucket": f"{root}_photos",
                                                          "name": "p1.png"}}))
            await js.publish(f"{root}.in.2", msgpack.packb(
                {"id": "p2", "photo": IMAGES["gray.jpg"]}))
            await js.publish(f"{root}.in.3", msgpack.packb({"id": "p3", "text": TEXTS[1]}))
            got = {}
            for _ in range(3):
                msg = await results.next_msg(timeout=60)
                result = msgpack.unpackb(msg.data)
                got[result["doc_id"]] = result
    finally:
        for stream in (f"{root}_DOCS", f"{root}_OUT"):
            await js.delete_stream(stream)
        await js.delete_object_store(f"{root}_photos")
    ref = references["st_clip"]
    _close(got["p1"]["data"][0]["data"], ref["rgba.png"])
    _close(got["p2"]["data"][0]["data"], ref["gray.jpg"])
    _close(got["p3"]["data"][0]["data"], ref[TEXTS[1]])
    assert got["p1"]["usage"]["images"] == 1 and "images" not in got["p3"]["usage"]


def test_the_default_pixel_limit_is_pillows():
    from poolwire.models.images import PILLOW_MAX_IMAGE_PIXELS
    from poolwire.settings import WorkerSettings

    assert WorkerSettings().max_image_pixels == PILLOW_MAX_IMAGE_PIXELS == Image.MAX_IMAGE_PIXELS

