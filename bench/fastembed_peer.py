"""Qdrant's fastembed (ONNX Runtime) as an in-process peer, offline.

fastembed's TextEmbedding("sentence-transformers/all-MiniLM-L6-v2") downloads Qdrant's ONNX
export from a hub; here nothing can be downloaded, so the benchmark exports the model it serves
to the layout that registered model expects (model.onnx, tokenizer.json, tokenizer_config.json,
config.json, special_tokens_map.json in one folder) with optimum's ONNX exporter, once, in the
peers' virtualenv, and hands the folder to fastembed as `specific_model_path`: fastembed then
runs its own code path (its tokenizer settings, mean pooling, normalization) on our weights.

    python -m bench.fastembed_peer export MODEL_DIR OUT_DIR   # in the peers' virtualenv
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

# fastembed's registered description of the model it serves (mean pooling, normalized, 384).
FASTEMBED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
EXPORT_FILES = ("model.onnx", "tokenizer.json", "tokenizer_config.json", "config.json",
                "special_tokens_map.json")


EXPORT_VERSION = 2  # 2: max_length too (set_truncation); an older export is made anew


def export_is_complete(out: Path) -> bool:
    stamp = out / "exported.json"
    return (all((out / name).is_file() for name in EXPORT_FILES) and stamp.is_file()
            and json.loads(stamp.read_text()).get("version") == EXPORT_VERSION)


def max_seq_length(model_dir: Path) -> int | None:
    """Sentence-Transformers' truncation length (sentence_bert_config.json), which fastembed does
    not read: it truncates at tokenizer_config.json's model_max_length instead."""
    path = model_dir / "sentence_bert_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_seq_length")
    return int(value) if value else None


def set_truncation(folder: Path, limit: int) -> None:
    """Truncate where Sentence-Transformers does. fastembed cuts at the smaller of
    tokenizer_config.json's model_max_length and max_length, and transformers saves MiniLM's
    with max_length 128 (the length it was trained at, from its tokenizer.json): left so, the
    passages over 128 tokens read a cosine of 0.90 to Sentence-Transformers' vectors."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["model_max_length"] = limit
    if "max_length" in config:
        config["max_length"] = limit
    path.write_text(json.dumps(config, indent=2))


def export(model_dir: Path, out: Path) -> None:
    """In the peers' virtualenv: the transformer as ONNX (last_hidden_state, which fastembed
    pools) plus the tokenizer files, truncating where Sentence-Transformers does so that both
    embed the same tokens."""
    from optimum.exporters.onnx import main_export

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    main_export(str(model_dir), output=str(tmp), task="feature-extraction",
                library_name="transformers", do_validation=False)
    limit = max_seq_length(model_dir)
    if limit is not None:
        set_truncation(tmp, limit)
    missing = [name for name in EXPORT_FILES if not (tmp / name).is_file()]
    if missing:
        raise RuntimeError(f"the ONNX export of {model_dir} lacks {', '.join(missing)}")
    (tmp / "exported.json").write_text(json.dumps({"from": str(model_dir), "max_seq_length": limit,
                                                      "version": EXPORT_VERSION}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


class FastembedEncoder:
    """fastembed's TextEmbedding behind the two calls the in-process child makes of a
    SentenceTransformer: encode(texts, batch_size) and a hook after each batch. fastembed
    batches a list in order (no length sorting), so calling it one batch at a time runs the
    same batches it would run on the whole list, and lets the child time each one."""

    def __init__(self, path: str, threads: int | None = None) -> None:
        from fastembed import TextEmbedding

        self.model = TextEmbedding(FASTEMBED_MODEL, specific_model_path=path, threads=threads,
                                   local_files_only=True)
        self._hooks = []

    def register_forward_hook(self, hook):
        self._hooks.append(hook)
        encoder = self

        class Handle:
            def remove(self):
                encoder._hooks.remove(hook)

        return Handle()

    def encode(self, texts: list[str], batch_size: int = 32, show_progress_bar: bool = False):
        import numpy as np

        out = []
        for start in range(0, len(texts), batch_size):
            batch = texts[start:start + batch_size]
            out.extend(self.model.embed(batch, batch_size=batch_size))
            for hook in self._hooks:
                hook(self, batch, None)
        return np.asarray(out, dtype=np.float32)


def ensure_export(python: str, model_dir: Path, out: Path, log) -> Path:
    """The exported folder, made by the peers' interpreter when missing (about a minute)."""
    import subprocess

    from bench.children import ROOT, child_env

    if export_is_complete(out):
        return out
    log(f"fastembed: exporting {model_dir} to ONNX in {out} (once)")
    t0 = time.monotonic()
    done = subprocess.run([python, "-m", "bench.fastembed_peer", "export", str(model_dir), str(out)],
                          cwd=str(ROOT), env=child_env(), capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0 or not export_is_complete(out):
        raise RuntimeError(f"the ONNX export failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    log(f"fastembed: exported in {time.monotonic() - t0:.0f} s")
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "export":
        export(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit("usage: python -m bench.fastembed_peer export MODEL_DIR OUT_DIR")
