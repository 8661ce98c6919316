"""OpenVINO post-training int8 (NNCF), measured against the modes poolwire serves: is it close
enough (minimum cosine >= 0.999 to torch float32 over the benchmark workload) and faster than
the fastest other mode on this CPU? Numbers to compare, in one process, one run:

    python bench/int8.py --texts 500

Calibration uses sentences of this repository's manual, README.md and then docs/*.md by
name (prose the benchmark workload, bench/workload.py, never contains; the figures in
docs/PERFORMANCE.md were calibrated when that prose was all in README.md). Every mode runs the same sorted batches of --batch-size
through the same pooling (mean, normalised, as all-MiniLM-L6-v2 pools), so only the forward
pass differs. NNCF is a tool of this measurement, not a dependency of poolwire."""

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import numpy as np  # noqa: E402
import torch  # noqa: E402

MIN_COSINE = 0.999


def calibration_texts(limit: int) -> list[str]:
    root = _HERE.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in pages)
    text = re.sub(r"`[^`]*`|\|[^\n]*|#+ |\*", " ", text)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)]
    return [s for s in sentences if 6 <= len(s.split()) <= 120][:limit]


def batches(tokenizer, texts: list[str], size: int, max_length: int):
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        yield rows, enc


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    m = mask[..., None].float()
    pooled = (hidden.float() * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def encode(run, tokenizer, texts, size, max_length) -> tuple[np.ndarray, float]:
    out = [None] * len(texts)
    started = time.perf_counter()
    for rows, enc in batches(tokenizer, texts, size, max_length):
        vectors = mean_pool(run(enc), enc["attention_mask"])
        for row, v in zip(rows, vectors):
            out[row] = v
    return np.stack(out), time.perf_counter() - started


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--calibration", type=int, default=300, help="calibration sentences")
    args = p.parse_args(argv)

    import nncf
    import openvino as ov

    from bench.workload import mixed_texts
    from poolwire.models.model import bundled_model_dir, load_model
    from poolwire.models.openvino_backend import OpenVinoBackend
    from poolwire.models.precision import choose_openvino_precision

    model = load_model(bundled_model_dir())
    tok, length = model.tokenizer, model.max_length
    cache = Path(tempfile.mkdtemp(prefix="poolwire-int8-"))
    f32 = OpenVinoBackend(model, choose_openvino_precision("exact", "float32", []), cache)
    ir = next((cache / "ir").glob("*/hidden.xml"))
    core = ov.Core()

    calib = calibration_texts(args.calibration)
    feeds = [{"input_ids": enc["input_ids"].numpy(), "attention_mask": enc["attention_mask"].numpy(),
              "token_type_ids": enc["token_type_ids"].numpy()}
             for _, enc in batches(tok, calib, 8, length)]
    started = time.perf_counter()
    quantized = nncf.quantize(core.read_model(ir), nncf.Dataset(feeds),
                              model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds))
    quantize_s = time.perf_counter() - started
    int8 = core.compile_model(quantized, "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    int8_request = int8.create_infer_request()

    def torch_run(enc):
        with torch.inference_mode():
            return model.encoder_hidden(enc["input_ids"], enc["attention_mask"],
                                        enc["token_type_ids"])

    def ov_f32(enc):
        return f32.run("hidden", enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])

    def ov_int8(enc):
        feed = {k: enc[k].numpy() for k in ("input_ids", "attention_mask", "token_type_ids")}
        return torch.from_numpy(int8_request.infer(feed)[0])

    texts = mixed_texts(args.texts, seed=0)  # the benchmark's workload (bench/throughput.py)
    warm = mixed_texts(64, seed=1)
    results = {}
    for name, run in (("torch float32", torch_run), ("OpenVINO f32", ov_f32),
                      ("OpenVINO int8 (NNCF)", ov_int8)):
        encode(run, tok, warm, args.batch_size, length)
        results[name] = encode(run, tok, texts, args.batch_size, length)
    reference = results["torch float32"][0]
    print(f"{args.texts} workload texts, batches of {args.batch_size}, {len(calib)} calibration "
          f"sentences ({quantize_s:.1f} s to quantize); OpenVINO {ov.get_version()}, "
          f"NNCF {nncf.__version__}\n")
    print("| mode | texts/s | vs torch float32 | vs OpenVINO f32 | min cosine | mean cosine |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base, f32_rate = None, None
    for name, (vectors, seconds) in results.items():
        rate = args.texts / seconds
        base = base or rate
        f32_rate = rate if name == "OpenVINO f32" else f32_rate
        cos = (vectors * reference).sum(1)
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | "
              f"{'' if f32_rate is None else f'{rate / f32_rate:.2f}x'} | {cos.min():.6f} | "
              f"{cos.mean():.6f} |")
    cos = (results["OpenVINO int8 (NNCF)"][0] * reference).sum(1).min()
    verdict = "meets" if cos >= MIN_COSINE else "misses"
    print(f"\nint8 {verdict} the minimum cosine of {MIN_COSINE} ({cos:.6f}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
