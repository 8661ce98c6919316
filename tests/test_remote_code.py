"""Issue 25: a model folder that names its own code (auto_map) runs only with
--trust-remote-code / PoolingModel(trust_remote_code=True); without it, it is refused at start in
one line, whatever standard input holds, and transformers never asks on it."""

import asyncio
import json
import os
import subprocess
import sys
import time

import nats
import numpy as np
import pytest
import torch

from poolwire import PoolerConfig, PoolingModel
from poolwire.models.model import bundled_model_dir
from poolwire.models.remote_code import (RemoteCodeRefusedError, check_remote_code,
                                         remote_code_files)
from tests.helpers import close, rows
from tests.model_zoo import _bert
from tests.procs import worker_env

TEXTS = ["a folder's own code", "runs only when the operator says so"]

# The folder's own model: BERT whose hidden states it changes, so its embeddings differ from
# what transformers' BertModel would give (equal results prove this file ran).
MODELING = '''
from transformers import BertModel


class CustomModel(BertModel):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.last_hidden_state = out.last_hidden_state.flip(-1) * 3.0 + 0.5
        return out
'''


@pytest.fixture(scope="module")
def remote_dir(tmp_path_factory):
    from transformers import AutoTokenizer, BertModel

    folder = tmp_path_factory.mktemp("remote-code") / "custom-bert"
    torch.manual_seed(7)
    BertModel(_bert()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(folder)
    (folder / "modeling_custom.py").write_text(MODELING)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["CustomModel"], auto_map={"AutoModel": "modeling_custom.CustomModel"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def reference(remote_dir):
    """The folder's own code run by transformers directly: CLS, normalised (poolwire's default
    for a plain transformers folder)."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(remote_dir, trust_remote_code=True).eval()
    assert type(model).__name__ == "CustomModel"
    tok = AutoTokenizer.from_pretrained(remote_dir, trust_remote_code=True)
    with torch.no_grad():
        hidden = model(**tok(TEXTS, padding=True, return_tensors="pt")).last_hidden_state
    return torch.nn.functional.normalize(hidden[:, 0], dim=-1).numpy()


def test_auto_map_names_the_files_it_would_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {
        "AutoConfig": "configuration_x.XConfig", "AutoModel": "other/repo--modeling_x.XModel"}}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {
        "AutoTokenizer": ["tokenization_x.XTokenizer", None]}}))
    assert remote_code_files(tmp_path) == {
        "config.json": ["configuration_x.py", "other/repo:modeling_x.py"],
        "tokenizer_config.json": ["tokenization_x.py"]}
    with pytest.raises(RemoteCodeRefusedError) as refused:
        check_remote_code(tmp_path, trusted=False)
    line = str(refused.value)
    assert "\n" not in line and str(tmp_path) in line and "--trust-remote-code" in line
    assert "tokenization_x.py" in line and "configuration_x.py" in line
    assert check_remote_code(tmp_path, trusted=True) == (
        "configuration_x.py", "other/repo:modeling_x.py", "tokenization_x.py")
    assert check_remote_code(bundled_model_dir(), trusted=False) == ()


def _serve_args(folder, *extra, url="nats://127.0.0.1:1"):
    # By default an unreachable NATS URL: a refused folder fails before any connection is tried.
    return [sys.executable, "-m", "poolwire", "serve", "--model", str(folder), "--backend",
            "torch", "--device", "cpu", "--nats-url", url, *extra]


def test_refused_in_one_line_whatever_stdin_holds(remote_dir, tmp_path):
    """Closed, empty, full of `y`, or open and silent: the same one-line refusal, exit 2, and
    standard input is never read (transformers' prompt would read it, or wait 15 s on it)."""
    yes = tmp_path / "yes.txt"
    yes.write_text("y\n" * 10_000)
    with yes.open("rb") as yes_file:
        stdins = {"closed": subprocess.DEVNULL, "empty": subprocess.PIPE,
                  "yes": yes_file, "silent": subprocess.PIPE}
        procs = {name: subprocess.Popen(_serve_args(remote_dir), stdin=stdin,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=worker_env(), cwd=tmp_path)
                 for name, stdin in stdins.items()}
        procs["empty"].stdin.close()
        started = time.monotonic()
        outs = {}
        try:
            outs["closed"] = procs["closed"].communicate(timeout=120)
            baseline = time.monotonic() - started
            for name in ("empty", "yes", "silent"):
                # The same start-up work as the closed case, started together: a prompt waiting
                # on the silent pipe would add its 15 s here. (communicate() would close the
                # silent pipe; the refusal is far below a pipe's buffer.)
                procs[name].wait(timeout=max(1.0, baseline + 10.0 - (time.monotonic() - started)))
                outs[name] = (procs[name].stdout.read(), procs[name].stderr.read())
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            procs["silent"].stdin.close()
        # The `y` file's offset is shared with the child: anything read would have moved it.
        assert os.lseek(yes_file.fileno(), 0, os.SEEK_CUR) == 0
    for name, (stdout, stderr) in outs.items():
        assert procs[name].returncode == 2, (name, stderr)
        lines = stderr.decode().strip().splitlines()
        assert len(lines) == 1, (name, stderr.decode())
        line = lines[0]
        assert line.startswith("poolwire: ") and str(remote_dir) in line, line
        assert "modeling_custom.py" in line and "--trust-remote-code" in line, line
        assert b"custom code" not in stdout + stderr and b"[y/N]" not in stdout + stderr


async def test_served_with_the_flag_equal_to_the_folders_own_code(remote_dir, reference,
                                                                   nats_server, tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *_serve_args(remote_dir, "--trust-remote-code", "--prefix", "rc.pooling",
                     "--state-dir", str(tmp_path / "state"), url=nats_server.url),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd=tmp_path, env=worker_env())
    lines = []
    try:
        async def ready():
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise AssertionError("worker exited:\n" + "".join(lines))
                lines.append(line)
                if line.startswith("poolwire: serving"):
                    return
        await asyncio.wait_for(ready(), 120)
        assert any(line.startswith("poolwire: --trust-remote-code: running the code of "
                                   f"{remote_dir} (modeling_custom.py)") for line in lines), lines
        nc = await nats.connect(nats_server.url)
        try:
            msg = await nc.request("rc.pooling.embed", json.dumps({"input": TEXTS}).encode(),
                                   timeout=30)
        finally:
            await nc.close()
        reply = json.loads(msg.data)
        assert "error" not in reply, reply
        close(np.stack(rows(reply)), reference)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.communicate(), 60)


def test_offline_refuses_and_serves_the_same_way(remote_dir, reference, tmp_path):
    with pytest.raises(RemoteCodeRefusedError, match="modeling_custom.py.*--trust-remote-code"):
        PoolingModel(str(remote_dir), device="cpu", backend="torch", state_dir=tmp_path)
    for kwargs in ({"trust_remote_code": True},
                   {"pooler_config": PoolerConfig(trust_remote_code=True)}):
        model = PoolingModel(str(remote_dir), device="cpu", backend="torch", state_dir=tmp_path,
                             **kwargs)
        assert model.model.remote_code == ("modeling_custom.py",)
        np.testing.assert_allclose(np.asarray(model.embed(TEXTS)), reference, atol=1e-5)
    with pytest.raises(ValueError, match="disagree"):
        PoolingModel(str(remote_dir), trust_remote_code=False,
                     pooler_config=PoolerConfig(trust_remote_code=True))
