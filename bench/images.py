"""`bench/images.py`: images/s embedded by a poolwire worker through NATS (one request per
`--per-request` images, the encoded files as MessagePack bin) against in-process
Sentence-Transformers `encode` of the same images on the same model, in the same run, printed
as a ratio with the smallest cosine between the two sides' vectors.

    python bench/images.py                        # 64 images, 5 timed runs each side
    python bench/images.py --images 32 --reps 3 --layers 12

The model is a CLIP of ViT-B/32's geometry (224-pixel images, 32-pixel patches, width 768,
`--layers` image layers, 12 heads; a small text tower) with seeded random weights, saved as a
Sentence-Transformers CLIP folder (`0_CLIPModel/`, as sentence-transformers/clip-ViT-B-32 ships
it) with the bundled MiniLM tokenizer: no download, and the forward passes cost what that
geometry costs. The images are JPEGs of 320x240 to 800x600 pixels made from a seed (gradients
and noise), so both sides decode and resize real files. Both sides run float32 on this
process's threads, warmed up first, their timed runs alternating so load from elsewhere falls
on both alike. Numbers to compare, never assertions: the ratio, measured in one run, is what
to read.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from bench.arguments import count  # noqa: E402
from bench.progress import log  # noqa: E402 - after the path fix, when run as a script

PREFIX = "bench.images"
SEED = 29


def build_st_clip(dest: Path, layers: int) -> Path:
    """A Sentence-Transformers CLIP folder of ViT-B/32's image geometry, seeded weights."""
    import torch
    from transformers import (AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel,
                              CLIPProcessor)

    from poolwire.models.model import bundled_model_dir

    tok = AutoTokenizer.from_pretrained(bundled_model_dir(), model_max_length=77)
    torch.manual_seed(SEED)
    config = CLIPConfig(
        text_config=dict(vocab_size=tok.vocab_size, hidden_size=256, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
                         eos_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=layers,
                           num_attention_heads=12, image_size=224, patch_size=32),
        projection_dim=512)
    module = dest / "0_CLIPModel"
    CLIPModel(config).eval().save_pretrained(module)
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tok).save_pretrained(module)
    (dest / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_CLIPModel",
         "type": "sentence_transformers.models.CLIPModel"}]))
    return dest


def make_images(n: int) -> list[bytes]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEED)
    sizes = [(320, 240), (640, 480), (800, 600), (480, 640)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        x = np.linspace(0, 255, w)[None, :, None]
        y = np.linspace(0, 255, h)[:, None, None]
        base = (x * rng.random(3) + y * rng.random(3)) / 2
        pixels = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, "JPEG", quality=85)
        out.append(buf.getvalue())
    return out


async def run_both(folder: Path, images: list[bytes], per_request: int, reps: int,
                   warmup: int, batch_size: int):
    import nats
    import numpy as np
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    from poolwire.actors.nats_server import NatsServer
    from poolwire.actors.worker import Worker
    from poolwire.client import PoolingClient
    from poolwire.models.model import load_model
    from poolwire.settings import WorkerSettings

    peer = SentenceTransformer(str(folder), device="cpu")
    model = load_model(folder)

    def st_encode():
        return peer.encode([Image.open(io.BytesIO(b)) for b in images], batch_size=batch_size)

    async def ours(client):
        replies = await asyncio.gather(*(
            client.embed(images[i:i + per_request])
            for i in range(0, len(images), per_request)))
        return np.asarray([d["data"] for r in replies for d in r["data"]], np.float32)

    with NatsServer() as server:
        worker = Worker(WorkerSettings(prefix=PREFIX, precision="exact", backend="torch"), model)
        await worker.start(server.url)
        nc = await nats.connect(server.url)
        try:
            client = PoolingClient(nc, prefix=PREFIX, timeout=600)
            for _ in range(warmup):
                st_encode()
                await ours(client)
            peer_s, ours_s = [], []
            for _ in range(reps):
                started = time.perf_counter()
                want = st_encode()
                peer_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                got = await ours(client)
                ours_s.append(time.perf_counter() - started)
        finally:
            await nc.close()
            await worker.stop()
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    return peer_s, ours_s, float((want * got).sum(axis=1).min())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=count, default=64, help="images per timed run")
    p.add_argument("--per-request", type=count, default=16, help="images per NATS request")
    p.add_argument("--reps", type=count, default=5, help="timed runs on each side")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first, on each side")
    p.add_argument("--batch-size", type=int, default=32, help="encode's batch_size")
    p.add_argument("--layers", type=count, default=12, help="image tower layers (ViT-B/32: 12)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.machine import describe

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    images = make_images(args.images)
    with tempfile.TemporaryDirectory(prefix="poolwire-images-") as tmp:
        folder = build_st_clip(Path(tmp) / "clip", args.layers)
        log(f"Sentence-Transformers encode in-process and poolwire embed over NATS, "
            f"alternating: {args.images} images x {args.reps} each")
        peer_s, ours_s, min_cos = asyncio.run(run_both(
            folder, images, args.per_request, args.reps, args.warmup, args.batch_size))
    peer_rate = args.images / statistics.median(peer_s)
    ours_rate = args.images / statistics.median(ours_s)
    print("| setup | images | p50 s | images/s | vs encode |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| Sentence-Transformers encode (in-process) | {args.images} | "
          f"{statistics.median(peer_s):.2f} | {peer_rate:.1f} | 1.00x |")
    print(f"| poolwire embed (NATS, {args.per_request} per request) | {args.images} | "
          f"{statistics.median(ours_s):.2f} | {ours_rate:.1f} | {ours_rate / peer_rate:.2f}x |")
    print()
    load = os.getloadavg()
    print(f"`python bench/images.py {shlex.join(argv if argv is not None else sys.argv[1:])}` "
          f"on {describe()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.")
    print(f"Smallest cosine between the two sides' vectors: {min_cos:.6f}.")
    if args.json:
        args.json.write_text(json.dumps({"encode_images_per_s": peer_rate,
                                         "poolwire_images_per_s": ours_rate,
                                         "ratio": ours_rate / peer_rate, "min_cosine": min_cos,
                                         "load": load}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
