"""The OpenVINO backend (models/openvino_backend.py) and `--backend` (models/backend_choice.py):
the rule alone, then every model of the zoo and every task it supports served through a real
nats-server with `--backend openvino`, equal to the same model served by torch; the cache
that spares a second start its conversion; and the fallbacks to torch.

Each model is converted once per session (the process shares an OpenVINO backend per loaded
model), so the workers of other test files that serve the same models with `auto` reuse it."""

import json

import numpy as np
import pytest
import torch

from poolwire.actors.batch_cost import (CPU_BUDGET, OPENVINO_BF16_BUDGET, OPENVINO_CPU_BUDGET,
                                        budget_rule)
from poolwire.client import PoolingClient
from poolwire.models import backend_choice
from poolwire.models.backend_choice import (BackendError, BackendPlan, build_backend,
                                            outputs_agree, plan_backend)
from poolwire.models.model import bundled_model_dir, load_model
from poolwire.models.precision import choose_openvino_precision

pytest.importorskip("openvino", reason="the openvino wheel is a dependency on this platform")

pytestmark = pytest.mark.timeout(600)

TEXTS = ["Hi", "The committee questions a careful experiment after a long debate.",
         "Prices rose again in March, the third increase this year, and shops expect more."]
FIRST = "what does the committee question?"
TOLERANCE = 1e-5   # the bound for `exact`; measured here: at most 2e-7 (see the report)

ZOO = ["st_mean_dense", "st_mean_dense_old", "st_cls_prompts", "qwen3_st", "qwen3_plain",
       "qwen3_seq", "roberta3", "roberta1_ce", "xlmr3", "xlmr1_ce", "regression", "distil_seq",
       "distil_tok", "deberta_seq", "deberta_tok", "ner", "colbert", "splade_max", "splade_sum"]
SMALL = ["seq3", "seq1", "multi", "tok5"]


# ---- the rule, alone ----

def test_auto_tries_openvino_on_a_cpu_where_it_imports():
    assert plan_backend("auto", "cpu", "float32", None) == BackendPlan(True, False)
    assert plan_backend("openvino", "cpu", "float32", None) == BackendPlan(True, True)


def test_torch_is_served_when_asked_without_trying_openvino():
    assert plan_backend("torch", "cpu", "float32", "No module named 'openvino'") == \
        BackendPlan(False, False)


@pytest.mark.parametrize("device, dtype, missing, why", [
    ("cuda:0", "float32", None, "auto chose torch on cuda:0"),
    ("cpu", "float32", "No module named 'openvino'",
     "auto chose torch: openvino is not installed (No module named 'openvino')"),
    ("cpu", "bfloat16", None, "OpenVINO converts float32 weights, and --dtype bfloat16"),
])
def test_auto_falls_back_to_torch_saying_why(device, dtype, missing, why):
    plan = plan_backend("auto", device, dtype, missing)
    assert not plan.try_openvino and why in plan.reason


@pytest.mark.parametrize("device, dtype, missing, why", [
    ("cuda:0", "float32", None, "serves the CPU, and the model is on cuda:0: pass --device cpu"),
    ("cpu", "float32", "No module named 'openvino'", "openvino is not installed"),
    ("cpu", "float16", None, "--dtype float16 cast them"),
])
def test_openvino_where_it_cannot_serve_is_a_one_line_error(device, dtype, missing, why):
    with pytest.raises(BackendError, match="--backend") as info:
        plan_backend("openvino", device, dtype, missing)
    assert why in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_backend_names_the_choices():
    with pytest.raises(BackendError, match="'onnx' is not one of auto, torch, openvino"):
        plan_backend("onnx", "cpu", "float32", None)


def test_outputs_agree_within_the_exact_tolerance_on_real_tokens_only():
    want = torch.randn(2, 4, 8)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    got = want.clone()
    got[1, 2:] += 100.0                     # padding: never pooled, so never compared
    assert outputs_agree(want, got, mask, "exact") is None
    got[0, 0, 0] += 1e-3
    assert "differ from torch's by 0.001" in outputs_agree(want, got, mask, "exact")
    assert "shape (2, 4, 7)" in outputs_agree(want, got[..., :7], mask, "exact")
    got = want.clone()
    got[0, 1, 1] = float("nan")
    assert "not all finite" in outputs_agree(want, got, mask, "exact")


def test_fast_outputs_are_judged_by_their_direction():
    want = torch.randn(3, 16)
    mask = torch.ones(3, 1)
    assert outputs_agree(want, want * 1.001 + 1e-4, mask, "fast") is None
    flipped = want.clone()
    flipped[2] = -flipped[2]
    assert "cosine to torch's is -1.0" in outputs_agree(want, flipped, mask, "fast")


def test_openvino_precision_hints():
    exact = choose_openvino_precision("exact", "float32", ["FP32", "INT8"])
    assert (exact.served, exact.ov_hint) == ("exact", "f32")
    native = choose_openvino_precision("fast", "float32", ["FP32", "BF16", "INT8"])
    assert (native.served, native.ov_hint, native.note) == ("fast", "bf16", "")
    avx2 = choose_openvino_precision("fast", "float32", ["FP32", "INT8"])
    assert (avx2.served, avx2.ov_hint) == ("exact", "f32")
    assert "no native bfloat16" in avx2.note and "serving float32" in avx2.describe()


def test_the_openvino_cpu_default_budget():
    assert budget_rule(None, "cpu", "openvino") == OPENVINO_CPU_BUDGET
    assert budget_rule(None, "cpu", "torch") == CPU_BUDGET
    assert budget_rule(None, "cuda", "openvino") == "auto"
    assert budget_rule(7, "cpu", "openvino") == 7


async def test_a_worker_in_fast_takes_the_budget_of_the_precision_it_serves(minilm, start_worker):
    """bf16 where this CPU has it (AVX-512 BF16 or AMX), and then twice f32's budget; f32 and
    its budget elsewhere."""
    async with start_worker(minilm, backend="openvino", precision="fast") as worker:
        hint = worker.precision.ov_hint
        assert hint == ("bf16" if worker.precision.served == "fast" else "f32")
        assert worker.engine._planner.max_added_padding == (
            OPENVINO_BF16_BUDGET if hint == "bf16" else OPENVINO_CPU_BUDGET)


# ---- every model and task, served ----

def request(task: str) -> dict:
    if task == "score":
        return {"text_1": FIRST, "text_2": TEXTS}
    return {"input": TEXTS, "normalize": True} if task == "token_embed" else {"input": TEXTS}


def values(reply: dict) -> list[np.ndarray]:
    return [dense(d["data"]) if isinstance(d["data"], dict)
            else np.atleast_1d(np.asarray(d["data"], np.float64)) for d in reply["data"]]


def dense(sparse: dict) -> np.ndarray:
    """A sparse item as a dense vector over the vocabulary, so a weight that one backend
    rounds to exactly zero and the other to 1e-9 compares as the tiny difference it is."""
    out = np.zeros(1 << 16)
    out[np.asarray(sparse["indices"], np.int64)] = sparse["values"]
    return out


async def serve_every_task(start_worker, nc, prefix, model, backend: str):
    async with start_worker(model, backend=backend) as worker:
        assert worker.backend.name == backend, worker.backend.describe()
        client = PoolingClient(nc, prefix=prefix)
        return {task.value: values(await client.request(task.value, request(task.value)))
                for task in worker.policy.supported}


@pytest.mark.parametrize("name", ["minilm", *SMALL, *ZOO])
async def test_openvino_serves_every_task_as_torch_does(name, minilm, small_models, zoo,
                                                        start_worker, nc, prefix, report):
    model = minilm if name == "minilm" else small_models[name] if name in SMALL else zoo(name)
    want = await serve_every_task(start_worker, nc, prefix, model, "torch")
    got = await serve_every_task(start_worker, nc, prefix, model, "openvino")
    assert got.keys() == want.keys()
    worst = 0.0
    for task in want:
        assert [g.shape for g in got[task]] == [w.shape for w in want[task]], task
        # Relative above 1: a sum-pooled sparse model's dot products reach 1e4, where one
        # float32 step is 1e-3 (splade_sum's score differed by exactly one).
        diff = max(float((np.abs(g - w) / np.maximum(1.0, np.abs(w))).max())
                   for g, w in zip(got[task], want[task]))
        assert diff <= TOLERANCE, (task, diff)
        worst = max(worst, diff)
    report("largest difference to torch over every task", model=name, worst=f"{worst:.2g}")


async def test_discovery_and_stats_say_openvino_serves(minilm, start_worker, nc, prefix):
    async with start_worker(minilm, backend="openvino") as worker:
        info = json.loads((await nc.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"",
                                            timeout=5)).data)
        stats = json.loads((await nc.request(f"$SRV.STATS.poolwire.{worker.discovery.id}", b"",
                                             timeout=5)).data)
    assert info["metadata"]["backend"] == "openvino"
    assert info["metadata"]["precision"] == "exact"
    described = stats["endpoints"][0]["data"]["backend"]
    assert described.startswith("backend openvino ") and "inference precision f32" in described


# ---- the cache, and the fallbacks ----

@pytest.fixture(scope="module")
def fresh_model(small_model_dirs):
    """A model object no backend was built for yet in this process (the process shares one
    per loaded model), so each of these tests starts as a new worker process would."""
    return lambda: load_model(small_model_dirs["seq1"])


@pytest.fixture(scope="module")
def first_start(fresh_model, tmp_path_factory):
    """One conversion into a state dir, shared by the tests below: (dir, the backend). Its
    small-batch limit is raised so that the tiny model gets its one-thread twins however busy
    the machine is (a start measures its own, and a loaded one may find the model slower)."""
    from poolwire.models import openvino_backend

    cache = tmp_path_factory.mktemp("openvino-state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openvino_backend, "SMALL_BATCH_S", 10.0)
        return cache, build_backend("openvino", fresh_model(), "exact", "float32", cache)


def test_a_second_start_reuses_the_cached_conversion(first_start, fresh_model):
    cache, first = first_start
    assert "(converted seq_logits, token_logits)" in first.describe()
    assert list((cache / "ir").glob("*/seq_logits.xml")), "the IR is saved in the state dir"
    assert any((cache / "compiled").iterdir()), "OpenVINO's compiled blob is cached too"
    second = build_backend("openvino", fresh_model(), "exact", "float32", cache)
    assert "(reused the cached seq_logits, token_logits)" in second.describe()
    ids = torch.tensor([[101, 7592, 2088, 102]])
    ones, zeros = torch.ones_like(ids), torch.zeros_like(ids)
    assert torch.equal(first.run("seq_logits", ids, ones, zeros),
                       second.run("seq_logits", ids, ones, zeros))


def test_the_cache_key_follows_the_model_files_and_the_versions(fresh_model, small_model_dirs,
                                                                tmp_path):
    import shutil

    from poolwire.models.openvino_backend import cache_key

    model = fresh_model()
    key = cache_key(model, "seq_logits", "2026.4.1")
    assert cache_key(fresh_model(), "seq_logits", "2026.4.1") == key
    assert cache_key(model, "token_logits", "2026.4.1") != key
    assert cache_key(model, "seq_logits", "2026.5.0") != key
    copy = shutil.copytree(model.path, tmp_path / "copy")
    assert cache_key(load_model(copy), "seq_logits", "2026.4.1") == key  # a copy is the same
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("}", ' }'))
    assert cache_key(load_model(copy), "seq_logits", "2026.4.1") != key  # an edit is not


def test_a_model_openvino_cannot_convert_falls_back_to_torch(fresh_model, tmp_path,
                                                             monkeypatch):
    import openvino

    def refuses(*args, **kwargs):
        raise RuntimeError("Model wasn't fully converted: aten::frobnicate\nmore detail")

    monkeypatch.setattr(openvino, "convert_model", refuses)
    served = build_backend("auto", fresh_model(), "exact", "float32", tmp_path)
    assert served.name == "torch"
    assert ("backend torch (auto chose torch: OpenVINO could not convert "
            "BertForSequenceClassification (seq_logits): Model wasn't fully converted: "
            "aten::frobnicate)") in served.describe()
    with pytest.raises(BackendError, match="--backend openvino cannot serve .*frobnicate"):
        build_backend("openvino", fresh_model(), "exact", "float32", tmp_path)


@pytest.mark.parametrize("which", [0, 1, 2],
                         ids=["all-cores pass", "one-thread twin", "fixed-width one-row passes"])
def test_outputs_that_differ_from_torch_fall_back_to_torch(first_start, fresh_model,
                                                            monkeypatch, which):
    from poolwire.models import openvino_backend
    from poolwire.models.openvino_backend import OpenVinoBackend

    monkeypatch.setattr(openvino_backend, "SMALL_BATCH_S", 10.0)  # a twin however busy
    real = OpenVinoBackend.run_each

    def one_pass_off(self, *args):
        outputs = real(self, *args)
        assert len(outputs) == 3, "the check runs all cores, the twin and row by row"
        outputs[which] = outputs[which] + 0.01
        return outputs

    monkeypatch.setattr(OpenVinoBackend, "run_each", one_pass_off)
    served = build_backend("auto", fresh_model(), "exact", "float32", first_start[0])
    assert served.name == "torch"
    assert "OpenVINO's seq_logits pass on the check batch: its outputs differ" in served.describe()


def test_without_openvino_auto_serves_torch(fresh_model, tmp_path, monkeypatch):
    monkeypatch.setattr(backend_choice, "_openvino_missing", lambda: "No module named 'openvino'")
    served = build_backend("auto", fresh_model(), "exact", "float32", tmp_path)
    assert served.describe().startswith(
        "backend torch (auto chose torch: openvino is not installed")


# ---- one thread for small batches ----

def test_the_one_thread_cost_runs_through_the_two_calibration_points():
    from poolwire.models.openvino_backend import one_thread_cost

    fixed, per_token = one_thread_cost([(16, 0.0003), (512, 0.0008)])
    assert per_token == pytest.approx(0.0005 / 496)
    assert fixed == pytest.approx(0.0003 - 16 * per_token)
    # A bigger batch timed no slower (noise): the small batch's time is all counted per
    # token, so that the cost still grows with the batch.
    assert one_thread_cost([(16, 0.0003), (512, 0.0002)]) == (0.0, 0.0003 / 16)


def test_small_batches_take_the_twin_and_the_rest_all_cores():
    from poolwire.models.openvino_backend import _Twin, takes_one_thread

    twin = _Twin(compiled=None, fixed_s=0.0002, per_token_s=0.000002)  # 1 ms at 400 tokens
    assert takes_one_thread(twin, 400, 0.001) and takes_one_thread(twin, 1, 0.001)
    assert not takes_one_thread(twin, 401, 0.001)
    assert not takes_one_thread(None, 1, 0.001), "no twin (a slow model): all cores always"


def test_a_fast_model_gets_a_one_thread_twin_that_computes_what_all_cores_do(first_start):
    _, backend = first_start
    limits = backend.twins
    assert set(limits) == {"seq_logits", "token_logits"} and all(t > 0 for t in limits.values())
    assert "tokens on one thread (seq_logits)" in backend.describe()
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2088, 102, 0]])
    mask = (ids != 0).long()
    for forward in ("seq_logits", "token_logits"):
        every_core, one_thread, row_by_row = backend.run_each(forward, ids, mask,
                                                              torch.zeros_like(ids))
        assert torch.allclose(every_core, one_thread, atol=1e-6)
        real = mask.bool() if forward == "token_logits" else slice(None)
        assert torch.allclose(every_core[real], row_by_row[real], atol=1e-5)
        assert torch.equal(backend.run(forward, ids, mask, torch.zeros_like(ids)), one_thread)


def test_a_batch_knows_its_time_alone_only_where_the_twin_takes_it(first_start):
    """seconds_alone (what the engine decides on to compute a batch on its loop) is the twin's
    modelled time for a batch the twin takes, and unknown (None) for one it does not take, or
    for a forward pass without a twin."""
    _, backend = first_start
    twin = backend._twins["seq_logits"]
    assert backend.seconds_alone("seq_logits", 8) == pytest.approx(twin.seconds(8))
    backend.small_batch_s, limit = twin.seconds(8), backend.small_batch_s
    try:
        assert backend.seconds_alone("seq_logits", 9) is None
    finally:
        backend.small_batch_s = limit
    assert backend.seconds_alone("hidden", 8) is None  # this model has no hidden pass


def test_a_failed_pass_does_not_fail_the_next_batches(first_start):
    """A batch OpenVINO refuses (longer than the model's 512 positions) fails alone: the next
    batch of the last good batch's shape used to fail with its error too, and every one of
    that shape after it (the CPU plugin kept the failed pass's shapes half set up). On all
    cores, as MiniLM's passes run (the tiny model's one-thread twin does not refuse it)."""
    _, backend = first_start
    ids = torch.tensor([[101, 7592, 2088, 102, 0], [101, 2088, 102, 0, 0], [101, 102, 0, 0, 0]])
    mask = (ids != 0).long()
    limit, backend.small_batch_s = backend.small_batch_s, 0.0  # 0: no batch takes the twin
    try:
        good = backend.run("seq_logits", ids, mask, torch.zeros_like(ids))
        long_ids = torch.full((1, 600), 2088)
        with pytest.raises(RuntimeError):
            backend.run("seq_logits", long_ids, torch.ones_like(long_ids),
                        torch.zeros_like(long_ids))
        for _ in range(2):
            assert torch.equal(backend.run("seq_logits", ids, mask, torch.zeros_like(ids)), good)
    finally:
        backend.small_batch_s = limit


def test_fixed_widths_hold_a_row_in_the_smallest_that_fits():
    from poolwire.models.openvino_backend import fixed_width, pad_into

    widths = (16, 32, 64)
    assert [fixed_width(w, widths) for w in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, None]
    # The pass's own buffers, still holding a longer row written before: they are reused.
    rows = (np.full((1, 16), 9, dtype=np.int64), np.ones((1, 16), dtype=np.int64))
    ids, mask = np.array([[101, 7, 102]]), np.ones((1, 3), dtype=np.int64)
    for row, array in zip(rows, (ids, mask)):
        pad_into(row, array)
    padded_ids, padded_mask = rows
    assert padded_ids[0, :3].tolist() == [101, 7, 102] and not padded_ids[0, 3:].any()
    assert padded_mask[0].tolist() == [1] * 3 + [0] * 13


def test_a_one_row_batch_runs_through_a_fixed_width_pass_with_the_same_outputs(first_start,
                                                                               monkeypatch):
    """A model with a twin compiles passes for one row of fixed widths; a one-row batch is
    padded to the smallest that holds it and gives what the dynamic pass gives on its real
    tokens (token rows cut back to its width), and a row past the widths, or a batch of two
    rows, takes the dynamic passes. The start-up check's passes include that path."""
    from poolwire.models import openvino_backend

    _, backend = first_start
    widths = sorted(backend._one_row["token_logits"])
    assert widths == [w for w in openvino_backend.ONE_ROW_WIDTHS
                      if w <= backend.model.max_length] and widths
    assert f"one row in fixed widths {', '.join(map(str, widths))}" in backend.describe()
    shapes = []
    real_infer = openvino_backend._infer
    real_row = openvino_backend._OneRow.infer

    def spied(compiled, arrays):
        shapes.append(arrays[0].shape)
        return real_infer(compiled, arrays)

    def spied_row(one_row, arrays):  # a fixed pass: the shape of the buffers it owns
        shapes.append(next(iter(one_row.rows.values())).shape)
        return real_row(one_row, arrays)

    monkeypatch.setattr(openvino_backend, "_infer", spied)
    monkeypatch.setattr(openvino_backend._OneRow, "infer", spied_row)
    lengths = [3, widths[0], widths[0] + 1] + ([widths[-1] + 1] if widths[-1] <
                                                backend.model.max_length else [])
    for width in lengths:
        ids = torch.arange(101, 101 + width).view(1, width)
        mask, types = torch.ones_like(ids), torch.zeros_like(ids)
        for forward in ("seq_logits", "token_logits"):
            twin = backend._twins[forward].compiled
            want = torch.from_numpy(real_infer(twin, (ids.numpy(), mask.numpy(), types.numpy())))
            shapes.clear()
            got = backend.run(forward, ids, mask, types)
            fixed = openvino_backend.fixed_width(width, tuple(widths))
            assert shapes == [(1, fixed or width)]
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    two = torch.arange(101, 105).view(2, 2)
    shapes.clear()
    backend.run("seq_logits", two, torch.ones_like(two), torch.zeros_like(two))
    assert shapes == [(2, 2)]
    assert len(backend.run_each("seq_logits", two, torch.ones_like(two),
                                torch.zeros_like(two))) == 3  # all cores, twin, row by row


def test_one_text_runs_through_its_own_path_with_the_outputs_of_a_one_row_batch(first_start):
    """run_row (one text's ids straight into a fixed-width pass's buffers) gives exactly what
    run() gives for the same one-row batch, whatever segment ids a pair left in the buffers
    before; a text past the widest pass, or no ids, is left to run() (None)."""
    _, backend = first_start
    widest = max(backend._one_row["token_logits"])
    pair = torch.tensor([[101, 7592, 102, 2088, 102]])
    for width in (1, 3, widest):
        ids = torch.arange(101, 101 + width).view(1, width)
        for forward in ("seq_logits", "token_logits"):
            backend.run(forward, pair, torch.ones_like(pair), torch.ones_like(pair))
            got = backend.run_row(forward, ids[0].tolist())
            want = backend.run(forward, ids, torch.ones_like(ids), torch.zeros_like(ids))
            assert isinstance(got, np.ndarray) and np.array_equal(got, want.numpy())
    if widest < backend.model.max_length:
        assert backend.run_row("seq_logits", list(range(101, 102 + widest))) is None
    assert backend.run_row("seq_logits", []) is None
    assert backend.run_row("hidden", [101, 102]) is None  # this model has no hidden pass


def test_only_a_backend_with_one_row_passes_has_a_path_for_one_text(fresh_model, tmp_path,
                                                                   monkeypatch):
    from poolwire.models import openvino_backend
    from poolwire.models.backend import TorchBackend

    # Too big for one-row passes (they cost a share of the weights' memory each), no twin.
    monkeypatch.setattr(openvino_backend, "ONE_ROW_MAX_WEIGHT_BYTES", 0)
    monkeypatch.setattr(openvino_backend, "SMALL_BATCH_S", 0.0)
    big = build_backend("openvino", fresh_model(), "exact", "float32", tmp_path)
    assert big._one_row == {} and "fixed widths" not in big.describe()
    assert big.run_row("seq_logits", [101, 102]) is None
    assert TorchBackend(fresh_model()).run_row("seq_logits", [101, 102]) is None


def test_a_model_too_slow_for_a_twin_gets_one_row_passes_of_a_query_on_all_cores(
        fresh_model, tmp_path, monkeypatch):
    """A one-row batch of such a model runs through a [1, 16] or [1, 32] pass compiled as its
    all-cores pass is (a dynamic pass fed texts of changing lengths reshapes on each), with the
    dynamic pass's outputs on the real tokens; past the widest, the dynamic pass."""
    from poolwire.models import openvino_backend

    monkeypatch.setattr(openvino_backend, "SMALL_BATCH_S", 0.0)  # no batch is small enough
    backend = build_backend("openvino", fresh_model(), "exact", "float32", tmp_path)
    assert backend.twins == {}
    widths = [w for w in openvino_backend.QUERY_ROW_WIDTHS if w <= backend.model.max_length]
    assert sorted(backend._one_row["seq_logits"]) == widths and widths
    assert f"one row in fixed widths {', '.join(map(str, widths))}" in backend.describe()
    all_cores = backend._compiled["seq_logits"].request.get_compiled_model()
    for one_row in backend._one_row["seq_logits"].values():
        threads = one_row.compiled.request.get_compiled_model().get_property(
            "INFERENCE_NUM_THREADS")
        assert threads == all_cores.get_property("INFERENCE_NUM_THREADS")
    for width in (3, widths[-1], widths[-1] + 1):
        ids = list(range(101, 101 + width))
        arrays = (np.array([ids]), np.ones((1, width), np.int64), np.zeros((1, width), np.int64))
        want = openvino_backend._infer(backend._compiled["seq_logits"], arrays)
        got = backend.run_row("seq_logits", ids)
        if width > widths[-1]:
            assert got is None
        else:
            assert got.shape == want.shape and np.allclose(got, want, atol=1e-5)


@pytest.fixture(scope="module")
def near_zero(tmp_path_factory):
    """bench/service_cost.py's near-zero embedding model on OpenVINO, with its one-row passes
    (the small-batch limit raised, as in first_start, so a busy machine cannot deny them)."""
    from bench.service_cost import build_near_zero_model
    from poolwire.models import openvino_backend

    folder = build_near_zero_model(tmp_path_factory.mktemp("near-zero") / "model")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openvino_backend, "SMALL_BATCH_S", 10.0)
        return build_backend("openvino", load_model(folder), "exact", "float32", None)


@pytest.mark.parametrize("method", ["mean", "cls", "last"])
@pytest.mark.parametrize("normalize,dimensions", [(True, None), (False, None), (True, 8)])
def test_one_text_is_pooled_as_the_batch_pools_it(near_zero, monkeypatch, method, normalize,
                                                  dimensions):
    """run_batch on one text of a plain embedding takes the backend's one-row path and gives
    the bits the batch path gives; the same text inside a batch of two agrees within float32
    rounding."""
    from poolwire.models import forward as forward_module
    from poolwire.models.forward import run_batch
    from poolwire.models.task_heads import Forward, PoolSpec
    from poolwire.models.tokenizing import Tokenizing

    tokenizing = Tokenizing(near_zero.model.tokenizer, near_zero.model.max_length)
    one, other = tokenizing.texts(["The committee met in Berlin.", "Prices rose."], None, "right")
    spec = PoolSpec(Forward.HIDDEN, method=method, normalize=normalize, dimensions=dimensions)
    rows = []
    monkeypatch.setattr(near_zero, "run_row", lambda forward, ids: rows.append(ids) or
                        type(near_zero).run_row(near_zero, forward, ids))
    got = run_batch(near_zero, [one], [spec]).outputs[0]
    assert rows == [one.ids], "one text of a plain embedding takes the one-row path"
    monkeypatch.setattr(forward_module, "_one_text", lambda *args: None)
    assert np.array_equal(got, run_batch(near_zero, [one], [spec]).outputs[0])
    in_batch = run_batch(near_zero, [one, other], [spec, spec]).outputs[0]
    assert got.shape == ((dimensions or 32),) and np.allclose(got, in_batch, atol=1e-6)


def test_one_text_of_other_outputs_takes_the_batch_path(near_zero, monkeypatch):
    from poolwire.models.forward import run_batch
    from poolwire.models.task_heads import Forward, PoolSpec
    from poolwire.models.tokenizing import TokenSeq

    monkeypatch.setattr(near_zero, "run_row", lambda *args: pytest.fail("not for this spec"))
    seq = TokenSeq([101, 7592, 2088, 102])
    rows = run_batch(near_zero, [seq], [PoolSpec(Forward.HIDDEN, token_level=True)]).outputs
    assert rows[0].shape == (4, 32)  # token_embed: a row per token, the batch path's
    paired = TokenSeq([101, 7592, 102, 2088, 102], type_ids=[0, 0, 0, 1, 1])
    assert run_batch(near_zero, [paired], [PoolSpec(Forward.HIDDEN)]).outputs[0].shape == (32,)


def test_threads_the_operator_chose_get_no_twin(fresh_model, tmp_path):
    """Nor one-thread one-row passes: those of a query's widths run on the threads chosen."""
    from poolwire.models import openvino_backend

    chosen = build_backend("openvino", fresh_model(), "exact", "float32", tmp_path, threads=2)
    assert chosen.twins == {} and "one thread" not in chosen.describe()
    assert chosen.seconds_alone("seq_logits", 8) is None
    passes = chosen._one_row["seq_logits"]
    assert set(passes) <= set(openvino_backend.QUERY_ROW_WIDTHS) and passes
    assert {p.compiled.request.get_compiled_model().get_property("INFERENCE_NUM_THREADS")
            for p in passes.values()} == {2}


def test_the_start_up_timing_stops_once_it_knows_the_answer(monkeypatch):
    from poolwire.models import openvino_backend

    calls = []
    monkeypatch.setattr(openvino_backend, "_infer", lambda compiled, arrays: calls.append(1))
    openvino_backend._best_seconds(None, ())
    assert len(calls) == 6, "one warm-up run and five timed ones"
    calls.clear()
    openvino_backend._best_seconds(None, (), enough_s=10.0)
    assert len(calls) == 2, "the first timed run is within the limit: known"
    calls.clear()
    openvino_backend._best_seconds(None, (), enough_s=1e-12)
    assert len(calls) == 2, "the first timed run is ten times over: known (a big model)"
