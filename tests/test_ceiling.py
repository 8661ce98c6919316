"""bench/ceiling.py: the FLOP count it divides by, and one small run end to end."""

import re

import pytest
from transformers import AutoConfig

from bench.ceiling import EncoderShape, main
from poolwire.models.model import bundled_model_dir


def test_flops_of_minilm_by_hand():
    shape = EncoderShape.of(AutoConfig.from_pretrained(bundled_model_dir()))
    assert shape == EncoderShape(layers=6, hidden=384, intermediate=1536)
    # One 10-token sequence: per layer and token, the four 384x384 projections and the two
    # 384x1536 feed-forward matmuls (2 FLOPs a multiply-add), plus QK^T and AV over 10 tokens.
    linears = 2 * (4 * 384 * 384 + 2 * 384 * 1536)
    attention = 2 * 2 * 10 * 384
    assert shape.flops(10) == 6 * 10 * (linears + attention)
    assert shape.flops(20) > 2 * shape.flops(10)  # attention grows with the square


@pytest.mark.timeout(120)
def test_small_run_prints_every_precision_and_a_finite_ceiling(capsys):
    assert main(["--texts", "16", "--batch-size", "8", "--seconds", "0.05", "--rows", "64"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^\| (float32|bfloat16|float16) \|.*\| ([0-9.]+)x \|$", out, re.M))
    assert set(rows) == {"float32", "bfloat16", "float16"}
    assert all(float(v) > 0 for v in rows.values())
    assert re.search(r"useful GFLOP/s \(\d+% of", out)
