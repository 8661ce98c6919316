"""The in-process peers a CPU user would pick instead of poolwire, each a small spec: the
Sentence-Transformers backends besides torch float32 (`--configs peers`).

Sentence-Transformers' OpenVINO and ONNX backends need optimum-intel and optimum-onnx, which pip
resolves beside torch 2.13.0 to optimum-intel 1.27 and so to transformers < 4.58 and
sentence-transformers 5.7, while poolwire runs transformers 5.x. So the peers run in a
virtualenv of their own that the benchmark builds once from the package registry
(`.poolwire/bench-peers/venv`, reused while its requirement line is the same), sharing this
environment's torch through a path entry (the CPU build lies on disk; a second copy would be
downloaded as a CUDA build of several GB). Each peer runs in its own process there
(`bench/throughput.py --inprocess-child`) and reports JSON back, as the torch peer does."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# fastembed: Qdrant's ONNX Runtime embedder (bench/fastembed_peer.py); numpy beside it pins
# nothing, it is here for the converter of bench/llama_peer.py (llama.cpp's gguf writer).
REQUIREMENTS = ("sentence-transformers[openvino,onnx]>=5", "fastembed>=0.7")
REQUIREMENT = " ".join(REQUIREMENTS)  # the stamp: a changed line rebuilds the virtualenv
ENV_DIR = ROOT / ".poolwire" / "bench-peers"


@dataclass(frozen=True)
class Peer:
    key: str              # the row's key: inprocess-<key>
    label: str
    precision: str        # which poolwire mode it is the peer of: exact, fast, or "native"
    backend: str          # SentenceTransformer(backend=...)
    model_kwargs: dict = field(default_factory=dict)
    mode: str = "float32"  # the table's mode column

    def peer_of(self, cpu_has_bf16: bool) -> str:
        """OpenVINO's default hint is bf16 only where the CPU has it; elsewhere it is f32, and
        then a peer of the exact rows (the fast rows serve exact there too)."""
        if self.precision == "native":
            return "fast" if cpu_has_bf16 else "exact"
        return self.precision

    def kwargs_json(self) -> str:
        return json.dumps({"backend": self.backend, "model_kwargs": self.model_kwargs})


# The torch float32 peer is the benchmark's own `inprocess` row (precision exact).
PEERS = (
    Peer("st-openvino-f32", "in-process encode, backend openvino, f32 hint", "exact", "openvino",
         {"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}}),
    Peer("st-openvino", "in-process encode, backend openvino, default hint", "native", "openvino",
         mode="default hint"),
    Peer("st-onnx", "in-process encode, backend onnx (ONNX Runtime)", "exact", "onnx"),
    # model_kwargs {"path": the ONNX export} is filled in by the run (bench/fastembed_peer.py).
    Peer("fastembed", "in-process fastembed TextEmbedding.embed (ONNX Runtime)", "exact",
         "fastembed"),
)
# llama.cpp's llama-server is a peer too, out of process (bench/llama_peer.py): rows
# llama-server-<setup>, at each poolwire setup's concurrency.

# The smallest cosine to Sentence-Transformers' torch float32 embedding of any text that a peer
# may have and still be ranked, by the precision it computes in: a float32 peer that differs
# more embeds other tokens or another model (fastembed cutting MiniLM at 128 tokens read 0.91);
# a bfloat16 peer rounds every layer, so it gets the looser floor of the two.
PARITY_FLOOR = {"exact": 0.999, "fast": 0.995}


def parity_verdict(accuracy: dict, peer_of: str) -> str:
    """A peer's parity line (pure): ok, failed, or unchecked (no reference run here)."""
    floor = PARITY_FLOOR[peer_of]
    if "min_cosine" not in accuracy:
        return ("unchecked: no Sentence-Transformers float32 run to compare with (add inprocess "
                "to --configs); not ranked")
    low = accuracy["min_cosine"]
    if low >= floor:
        return f"ok: min cosine {low:.6f} >= {floor} ({peer_of} precision)"
    return (f"failed: min cosine {low:.6f} < {floor} ({peer_of} precision): its vectors are not "
            f"Sentence-Transformers', so its speed is not ranked")


def peer_python(log) -> str:
    """The peers' interpreter, building their virtualenv first when it is missing or was built
    for another requirement line."""
    python = ENV_DIR / "venv" / "bin" / "python"
    stamp = ENV_DIR / "installed.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == REQUIREMENT:
        return str(python)
    import torch

    log(f"peers: building their virtualenv in {ENV_DIR} ({REQUIREMENT}; a few minutes, once)")
    venv.EnvBuilder(with_pip=True, clear=True).create(ENV_DIR / "venv")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                              "'purelib'))"], capture_output=True, text=True,
                             check=True).stdout.strip()
    # Appended after the venv's own site-packages: its transformers and sentence-transformers win.
    Path(purelib, "torch-from-parent.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")
    out = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c",
                          str(ROOT / "constraints.txt"), *REQUIREMENTS], capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"pip could not build the peers' virtualenv:\n{out.stderr[-3000:]}")
    stamp.write_text(REQUIREMENT)
    return str(python)


def openvino_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin computes bf16 natively here (what its default hint picks)."""
    try:
        import openvino as ov
    except ImportError:
        return False
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def load_peer(model: str, kwargs_json: str, device: str):
    """In the peer's process: the SentenceTransformer with that backend, or fastembed's
    TextEmbedding behind the same two calls."""
    kwargs = json.loads(kwargs_json)
    if kwargs["backend"] == "fastembed":
        from bench.fastembed_peer import FastembedEncoder

        return FastembedEncoder(kwargs["model_kwargs"]["path"])
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model, device=device, backend=kwargs["backend"],
                               model_kwargs=kwargs["model_kwargs"] or None, trust_remote_code=False)


def versions() -> str:
    """The peer environment's versions, for the table's note."""
    import importlib.metadata as md

    names = ("sentence-transformers", "transformers", "openvino", "optimum-intel", "onnxruntime",
             "fastembed")
    found = []
    for name in names:
        try:
            found.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(found)


if __name__ == "__main__" and sys.argv[1:] == ["--versions"]:
    print(versions())
