"""The peers of bench/throughput.py that poolwire is compared with (bench/peers.py,
bench/llama_peer.py, bench/fastembed_peer.py): their pure parts (the parity gate, the reply
parsing, the rows, the report's ranking) and llama-server's HTTP driving against a stand-in
server, so that nothing here needs llama.cpp built."""

import argparse
import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from bench import llama_peer
from bench.fastembed_peer import max_seq_length, set_truncation
from bench.llama_peer import LlamaServer, chunk, embed_all, llama_row, parse_embeddings, server_command
from bench.peers import PEERS, parity_verdict
from bench.setups import Setup
from bench.table import Report, Row


def test_parity_gate_ranks_a_peer_only_when_its_vectors_are_sentence_transformers():
    assert parity_verdict({"min_cosine": 0.9999991, "mean_cosine": 1.0}, "exact").startswith(
        "ok: min cosine 0.999999 >= 0.999")
    failed = parity_verdict({"min_cosine": 0.91, "mean_cosine": 0.99}, "exact")
    assert failed.startswith("failed: min cosine 0.910000 < 0.999")
    # bfloat16 peers round every layer: a looser floor, still far above a wrong truncation.
    assert parity_verdict({"min_cosine": 0.997}, "fast").startswith("ok")
    assert parity_verdict({"min_cosine": 0.997}, "exact").startswith("failed")
    assert parity_verdict({}, "exact").startswith("unchecked: no Sentence-Transformers")


def test_fastembed_is_a_peer_of_the_exact_rows():
    peer = next(p for p in PEERS if p.key == "fastembed")
    assert peer.backend == "fastembed" and peer.peer_of(cpu_has_bf16=True) == "exact"


def test_llama_replies_are_parsed_in_index_order_and_errors_named():
    body = json.dumps({"data": [{"index": 1, "embedding": [0.0, 1.0]},
                                {"index": 0, "embedding": [1.0, 0.0]}]})
    assert parse_embeddings(body, 2) == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="returned 2 embeddings for 3 inputs"):
        parse_embeddings(body, 3)
    with pytest.raises(ValueError, match="input is too large"):
        parse_embeddings(json.dumps({"error": {"code": 500, "message": "input is too large"}}), 1)
    with pytest.raises(ValueError, match="no JSON"):
        parse_embeddings(b"<html>", 1)
    with pytest.raises(ValueError, match="without a float embedding"):
        parse_embeddings(json.dumps({"data": [{"index": 0}]}), 1)


def test_server_command_binds_loopback_with_a_slot_per_request_in_flight():
    cmd = server_command("llama-server", "m.gguf", 8123, 64, 2)
    def args(flag):
        return cmd[cmd.index(flag) + 1]

    assert "--embeddings" in cmd and args("--host") == "127.0.0.1" and args("--port") == "8123"
    assert args("--parallel") == "64" and args("--ctx-size") == str(64 * 512)
    assert int(args("--ubatch-size")) >= 512 and args("--pooling") == "mean"


def test_llama_rows_carry_the_setups_shape_and_its_short_text_latencies():
    texts = ["A short one.", " ".join(["word"] * 80), "Another short one."]
    requests = chunk(texts, 1)
    assert requests == [[t] for t in texts] and chunk(texts, 2) == [texts[:2], texts[2:]]
    row = llama_row(Setup("c1", 1, 1, 1), texts, [5, 90, 6], 2.0, [1.0, 9.0, 2.0], requests,
                    50.0, {"worker_other": 1.5})
    assert row.key == "llama-server-c1" and row.single and row.peer_of == "exact"
    assert row.setup.endswith("concurrency 1, 1 text/request")
    assert row.short_latencies_ms == [1.0, 2.0] and row.texts_per_s == 1.5 and row.tokens == 101
    wide = llama_row(Setup("4x32", 4, 1, 32), texts, [5, 90, 6], 1.0, [3.0], [texts], None, {})
    assert not wide.single and wide.setup.endswith("concurrency 4, 32 texts/request")
    assert wide.short_latencies_ms == []


def _row(key, texts_per_s, mode="float32", peer_of="", parity="", single=False):
    r = Row(key, key, 10, 100, 10 / texts_per_s, [1.0], None, peer_of=peer_of, parity=parity,
            single=single, short_latencies_ms=[2.0] if single else [])
    r.mode = mode
    return r


def test_a_peer_that_fails_parity_is_shown_but_never_ranked():
    ok = parity_verdict({"min_cosine": 0.99999}, "exact")
    bad = parity_verdict({"min_cosine": 0.9}, "exact")
    report = Report("cmd", 10, 0, [
        _row("inprocess", 10.0, peer_of="exact"),
        _row("inprocess-fastembed", 50.0, peer_of="exact", parity=bad),
        _row("inprocess-st-onnx", 20.0, peer_of="exact", parity=ok),
        _row("llama-server-c1", 40.0, peer_of="exact", parity=ok, single=True),
        _row("c64", 24.0, "exact")], "machine",
        skipped=["llama-server: RuntimeError: building llama-server needs cmake"])
    # The fastest ranked peer of exact precision: ST ONNX, not the faster failed fastembed, nor
    # the one-request-at-a-time llama-server row.
    assert report.headline() == ("headline: c64 (exact) 24.0 texts/s = 1.20x the fastest "
                                 "in-process peer of exact precision, inprocess-st-onnx (20.0)")
    assert "inprocess-fastembed" not in report.throughput_comparison()
    text = report.markdown()
    assert "| 5.00x (not ranked: parity failed:) |" in text
    assert f"parity: inprocess-fastembed {bad}" in text.splitlines()
    assert "peer not set up here: llama-server: RuntimeError: building llama-server needs cmake" \
        in text.splitlines()
    assert report.to_json()["skipped"] == ["llama-server: RuntimeError: building llama-server "
                                           "needs cmake"]


def test_fastembed_export_truncates_where_sentence_transformers_does(tmp_path):
    assert max_seq_length(tmp_path) is None
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    assert max_seq_length(tmp_path) == 256
    # What transformers saves for MiniLM: fastembed cuts at the smaller of the two keys.
    (tmp_path / "tokenizer_config.json").write_text(
        '{"model_max_length": 512, "max_length": 128, "pad_token": "[PAD]"}')
    set_truncation(tmp_path, 256)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == {"model_max_length": 256, "max_length": 256, "pad_token": "[PAD]"}


def test_the_run_goes_on_when_the_peers_cannot_be_set_up(monkeypatch, tmp_path):
    import bench.peers
    from bench.inprocess import run_peers

    def no_venv(log):
        raise RuntimeError("pip could not build the peers' virtualenv:\nno network")

    monkeypatch.setattr(bench.peers, "peer_python", no_venv)
    skipped = []
    args = argparse.Namespace(model=None)
    assert run_peers(args, lambda texts: [1] * len(texts), tmp_path, None, (), skipped) == []
    assert skipped == ["every peer: their virtualenv could not be built: RuntimeError: no network"]


# A stand-in for llama-server: the flags it is started with, /health, and /v1/embeddings in
# OpenAI's shape (each text's vector is [its length, 1]), on the threads of http.server.
FAKE_SERVER = textwrap.dedent("""\
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--embeddings" in argv

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass
        def _send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._send(200, {"status": "ok"})
        def do_POST(self):
            texts = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
            if "boom" in texts:
                return self._send(500, {"error": {"message": "input is too large"}})
            data = [{"index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(texts)]
            self._send(200, {"data": data[::-1]})

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """)


@pytest.fixture(scope="module")
def fake_binary(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "llama-server"
    path.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.timeout(60)
def test_llama_server_is_driven_over_http_at_the_setups_concurrency_and_stopped(fake_binary,
                                                                               tmp_path):
    server = LlamaServer(fake_binary, tmp_path / "m.gguf", 4, 2, tmp_path / "server.log")
    server.start(timeout=30)
    try:
        requests = [["a" * n] for n in range(1, 10)] + [["xy", "xyz"]]
        seen = []
        vectors, latencies = embed_all(server.port, requests, 4, 10, seen.append)
        assert vectors == [[[float(n), 1.0]] for n in range(1, 10)] + [[[2.0, 1.0], [3.0, 1.0]]]
        assert sorted(seen) == list(range(10)) and all(ms > 0 for ms in latencies)
        with pytest.raises(RuntimeError, match="llama-server: ValueError: .*input is too large"):
            embed_all(server.port, [["fine"], ["boom"]], 2, 10)
    finally:
        server.stop()
    assert server.proc.poll() is not None
    with pytest.raises(OSError):
        os.kill(server.proc.pid, 0)


def test_a_missing_build_is_reported_not_started_with_no_peer_builds(monkeypatch, tmp_path):
    monkeypatch.setattr(llama_peer, "CACHE", tmp_path)
    with pytest.raises(RuntimeError, match="not built yet .* --no-peer-builds"):
        llama_peer.server_binary(lambda msg: None, may_build=False)
    assert not any(Path(tmp_path).iterdir())
