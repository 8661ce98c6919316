"""Packaging: the built wheel installs only `poolwire` (beside Hugging Face's own top-level
`kernels`), and a worker without Triton serves the same embeddings through the PyTorch
references."""

import asyncio
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import msgpack
import numpy as np
import pytest

from tests.helpers import wait_until_answering

ROOT = Path(__file__).resolve().parent.parent
HF_KERNELS = "kernels==0.17.2"  # the hub-kernels package transformers integrates


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout}\n{out.stderr}"
    return out


def test_the_checkout_comes_after_the_installed_packages_on_sys_path():
    """`python -m pytest` from the checkout put its root first, where its kernels/ stood for
    Hugging Face's `kernels` and transformers 5.25 failed to import (bench/__init__.py)."""
    entries = [Path(p or ".").resolve() for p in sys.path]
    site = [i for i, p in enumerate(entries) if p.name == "site-packages"]
    roots = [i for i, p in enumerate(entries) if p == ROOT]
    assert site and roots and min(roots) > max(site), sys.path


def test_a_bench_child_imports_sentence_transformers_from_the_checkout():
    """Bench children run as `python -m bench.<name>` from the checkout's root, which puts the
    root first; importing bench moves it behind the installed packages."""
    out = run(sys.executable, "-c", "import bench, sentence_transformers, kernels; "
              "print(kernels.__file__)", cwd=ROOT)
    assert "site-packages" in Path(out.stdout.strip()).parts, out.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_installs_only_poolwire_beside_hugging_faces_kernels(tmp_path):
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path / "dist"),
        str(ROOT))
    wheel = next((tmp_path / "dist").glob("poolwire-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    # Dependencies (torch, transformers, ...) come from this test's own environment through a
    # path entry, so the fresh environment installs only the two packages under test. A plain
    # path entry does not run that environment's .pth files, so our editable install stays out.
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    Path(purelib, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = (python, "-m", "pip", "install", "--quiet", "--no-deps")
    run(*pip, str(wheel))
    run(*pip, HF_KERNELS)  # installed after poolwire: it used to overwrite our kernels/__init__.py

    check = textwrap.dedent(f"""
        import importlib.metadata, importlib.util, sys
        import kernels, poolwire, poolwire.kernels, poolwire.actors.engine, poolwire.models.forward, poolwire.schemas.codec
        assert kernels.__file__.startswith({purelib!r}), kernels.__file__
        assert not hasattr(kernels, "seq_pool"), "kernels is poolwire's, not Hugging Face's"
        assert callable(poolwire.kernels.seq_pool) and poolwire.PoolingClient
        files = importlib.metadata.distribution("poolwire").files
        tops = {{f.parts[0] for f in files}}
        assert tops <= {{"poolwire", "poolwire-{wheel.name.split('-')[1]}.dist-info", "..", "bin"}}, tops
        for name in ("actors", "models", "schemas"):
            assert importlib.util.find_spec(name) is None, name
        print("ok")
    """)
    assert run(python, "-c", check, cwd=tmp_path).stdout.strip() == "ok"
    # Removing Hugging Face's package leaves poolwire whole.
    run(python, "-m", "pip", "uninstall", "--quiet", "--yes", "kernels")
    run(python, "-c", "import poolwire.kernels, poolwire.models.forward", cwd=tmp_path)


# Runs `poolwire serve` with the triton and openvino modules unimportable, as on a machine
# without their wheels.
NO_TRITON = ("import sys; sys.modules['triton'] = None; sys.modules['openvino'] = None; "
             "from poolwire.cli import main; sys.exit(main())")


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_worker_without_triton_or_openvino_serves_the_same_embeddings(
        minilm, nats_server, nc, prefix):
    from poolwire.kernels import seq_pool_reference

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = await asyncio.create_subprocess_exec(
        # -P: `-c` puts the working directory (the checkout) first, where its kernels/ would
        # stand for Hugging Face's `kernels` (bench/__init__.py).
        sys.executable, "-P", "-c", NO_TRITON, "serve", "--nats-url", nats_server.url, "--prefix", prefix,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        await wait_until_answering(nats_server.url, prefix, timeout=120)
        texts = ["a worker without triton", "still pools", "the same vectors"]
        reply = msgpack.unpackb((await nc.request(
            f"{prefix}.embed", msgpack.packb({"input": texts}), timeout=60)).data)
        got = np.array([item["data"] for item in reply["data"]])
    finally:
        if proc.returncode is None:
            proc.terminate()
        output = (await asyncio.wait_for(proc.communicate(), 60))[0].decode()
    assert "pooling kernels: NumPy (Triton is not installed)" in output
    assert "poolwire: backend torch (auto chose torch: openvino is not installed" in output

    import torch

    enc = minilm.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = minilm.module(**enc).last_hidden_state
    want = seq_pool_reference(hidden, enc["attention_mask"].sum(1), "mean", normalize=True)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-5)
