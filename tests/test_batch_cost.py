"""The forward-pass cost model and the padding budget it sets (actors/batch_cost.py): the fit
and the budget alone, then a real measurement on MiniLM and a worker that uses it."""

import json
import math

import pytest

from poolwire.actors.batch_cost import (AUTO, CPU_BUDGET, MIN_BUDGET, OPENVINO_BF16_BUDGET,
                                        OPENVINO_CPU_BUDGET, BatchCost, batch_cost_of,
                                        budget_rule, fit_batch_cost, measure_batch_cost)
from poolwire.models.backend import TorchBackend
from poolwire.models.precision import EXACT, choose_precision


def test_fit_recovers_a_line():
    samples = [(t, 0.0035 + 0.00012 * t) for t in (16, 64, 256, 512)]
    cost = fit_batch_cost(samples)
    assert cost.fixed_s == pytest.approx(0.0035)
    assert cost.per_token_s == pytest.approx(0.00012)
    assert cost.padding_budget(8192) == 29  # 3.5 ms / 0.12 ms


def test_fit_is_least_squares_over_noisy_samples():
    samples = [(16, 0.0060), (64, 0.0100), (256, 0.0330), (512, 0.0640)]
    cost = fit_batch_cost(samples)
    # The residuals of a least-squares line sum to zero and are orthogonal to the sizes.
    residuals = [s - cost.fixed_s - cost.per_token_s * t for t, s in samples]
    assert sum(residuals) == pytest.approx(0, abs=1e-12)
    assert sum(r * t for r, (t, _) in zip(residuals, samples)) == pytest.approx(0, abs=1e-10)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two sizes"):
        fit_batch_cost([(64, 0.01), (64, 0.011)])


def test_budget_when_tokens_look_free_fills_batches():
    # A GPU below saturation: the time barely grows with size, or noise makes it fall.
    cost = fit_batch_cost([(16, 0.0021), (64, 0.0020), (256, 0.0021), (512, 0.0019)])
    assert cost.per_token_s == 0
    assert cost.padding_budget(8192) == 8192


def test_budget_when_the_fixed_cost_is_nothing_still_lets_equal_lengths_batch():
    cost = fit_batch_cost([(16, 0.0001), (512, 0.0600)])  # the line crosses below zero
    assert cost.fixed_s == 0
    assert cost.padding_budget(8192) == MIN_BUDGET


@pytest.mark.parametrize("fixed_ms, per_token_ms, limit, budget", [
    (3.5, 0.12, 8192, 29),     # float32 on this machine's CPU
    (3.5, 0.06, 8192, 58),     # bfloat16 autocast halves the per-token cost
    (2.0, 0.00001, 8192, 8192),  # a GPU: capped at max_batch_tokens
    (2.0, 0.00001, 512, 512),
])
def test_budget_is_the_padding_that_costs_one_pass(fixed_ms, per_token_ms, limit, budget):
    assert BatchCost(fixed_ms / 1e3, per_token_ms / 1e3).padding_budget(limit) == budget


def test_measured_on_minilm(minilm):
    cost = measure_batch_cost(TorchBackend(minilm, EXACT), repeats=1)
    # Real passes take time and the largest shape takes longer than the smallest; the budget
    # is a whole number of tokens within its bounds.
    assert cost.fixed_s > 0 or cost.per_token_s > 0
    assert cost.per_token_s >= 0 and cost.fixed_s >= 0
    assert MIN_BUDGET <= cost.padding_budget(8192) <= 8192
    assert math.isfinite(cost.fixed_s) and math.isfinite(cost.per_token_s)


def test_lengths_are_capped_at_the_model_maximum(small_models):
    model = small_models["seq3"]
    long_shapes = ((1, model.max_length * 4), (2, model.max_length * 4), (1, 2))
    cost = measure_batch_cost(TorchBackend(model, EXACT), shapes=long_shapes, repeats=1)  # would fail past the max
    assert cost.per_token_s >= 0


def test_one_measurement_per_model_and_precision(minilm):
    first = batch_cost_of(TorchBackend(minilm, EXACT))
    assert batch_cost_of(TorchBackend(minilm, EXACT)) is first
    fast = choose_precision("fast", "cpu", "float32", cpu_has_bf16=True)
    assert batch_cost_of(TorchBackend(minilm, fast)) is not first  # measured again under autocast


@pytest.mark.parametrize("requested, device, rule", [
    (None, "cuda", AUTO),        # a GPU measures: a fixed budget would keep batches small
    (None, "cpu", CPU_BUDGET),   # a CPU's timing reads its load: the swept default
    ("auto", "cpu", AUTO),
    (0, "cuda", 0),
    (40, "cpu", 40),
])
def test_budget_rule(requested, device, rule):
    assert budget_rule(requested, device) == rule


@pytest.mark.parametrize("ov_hint, rule", [("f32", OPENVINO_CPU_BUDGET), (None, OPENVINO_CPU_BUDGET),
                                           ("bf16", OPENVINO_BF16_BUDGET)])
def test_openvino_in_bf16_gets_twice_the_budget_of_f32(ov_hint, rule):
    """bf16 tokens cost about half as much and the pass's fixed cost stays."""
    assert OPENVINO_BF16_BUDGET == 2 * OPENVINO_CPU_BUDGET
    assert budget_rule(None, "cpu", "openvino", ov_hint) == rule
    assert budget_rule(24, "cpu", "openvino", ov_hint) == 24  # as asked, whatever the precision
    assert budget_rule(None, "cpu", "torch", ov_hint) == CPU_BUDGET


async def test_a_cpu_worker_keeps_the_default_budget_without_measuring(minilm, start_worker):
    async with start_worker(minilm) as worker:
        assert worker.batch_cost is None
        assert worker.engine._planner.max_added_padding == CPU_BUDGET
    async with start_worker(minilm, max_added_padding=7) as worker:
        assert worker.batch_cost is None
        assert worker.engine._planner.max_added_padding == 7


async def test_auto_measures_the_budget_and_stats_say_so(minilm, start_worker, nc):
    async with start_worker(minilm, max_added_padding="auto") as worker:
        measured = batch_cost_of(worker.backend)
        assert worker.batch_cost is measured
        assert worker.max_added_padding == measured.padding_budget(worker.settings.max_batch_tokens)
        assert worker.engine._planner.max_added_padding == worker.max_added_padding
        stats = json.loads((await nc.request(f"$SRV.STATS.poolwire.{worker.discovery.id}", b"",
                                             timeout=5)).data)
        batching = stats["endpoints"][0]["data"]["batching"]
        assert batching["max_added_padding"] == worker.max_added_padding
        assert batching["batch_fixed_ms"] == round(measured.fixed_s * 1e3, 3)
        assert batching["padded_token_ms"] == round(measured.per_token_s * 1e3, 5)


@pytest.mark.parametrize("value, parsed", [("auto", "auto"), ("24", 24), (0, 0), (None, None)])
def test_setting_takes_tokens_or_auto(value, parsed):
    from poolwire.settings import WorkerSettings

    assert WorkerSettings(max_added_padding=value).max_added_padding == parsed


@pytest.mark.parametrize("value", ["lots", "-3", -3, True, 2.5])
def test_setting_refuses_anything_else_naming_both_forms(value):
    from pydantic import ValidationError

    from poolwire.settings import WorkerSettings

    with pytest.raises(ValidationError, match="give a number of tokens .0 or more. or auto"):
        WorkerSettings(max_added_padding=value)
