"""The payoff predictor on model descriptions: --formats' candidates, the GEMM shapes, the step outside
them, what converts on which GPU, the whole-step estimate, and the torchao filter applied for real."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.hardware import GPUS
from ampkit.hardware.roofline import Roofline, linear_cost
from ampkit.plan.describe import describe_config, describe_model
from ampkit.plan.payoff import all_candidates, parse_formats, payoff_plan
from ampkit.plan.payoff.filters import torchao_filter
from ampkit.plan.payoff.formats import Candidate
from ampkit.plan.payoff.other import elementwise_elements_per_token, other_time
from ampkit.plan.payoff.predict import WORTH_IT, Workload, dim_multiple, predict_gpu
from ampkit.plan.payoff.shapes import HEAD, model_linears
from ampkit.tasks.lm import LanguageModelTask

H100, B200 = GPUS["H100-80GB"], GPUS["B200"]
GPT2 = describe_config(
    {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
)


def _format(block: dict, label: str, gpu: int = 0) -> dict:
    return next(f for f in block["gpus"][gpu]["formats"] if f["label"] == label)


def test_formats_are_read_from_the_registry_with_their_recipes():
    assert [c.label for c in all_candidates()] == ["fp32", "tf32", "fp16", "fp8", "mxfp8", "mxfp4", "nvfp4"]
    picked = parse_formats("fp8, fp8:rowwise, e4m3, nvfp4,all")
    assert [c.label for c in picked[:3]] == ["fp8", "fp8:rowwise", "nvfp4"]  # an alias is its format, once
    assert Candidate("fp8-e5m2", "tensorwise").label == "fp8-e5m2"
    assert (dim_multiple(Candidate("mxfp8", "mx")), dim_multiple(Candidate("nvfp4", "nvfp4"))) == (32, 16)
    assert (dim_multiple(Candidate("fp8-e4m3", "rowwise")), dim_multiple(Candidate("fp16", "none"))) == (16, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fp9", "unknown numeric format 'fp9' for --formats"),
        ("nf4", "nf4 has no matmul peak in the GPU table"),
        ("mxfp8:rowwise", "mxfp8 has no recipe 'rowwise'; choose from mx"),
        ("fp8,,nvfp4", "has an empty item"),
    ],
)
def test_a_bad_format_is_refused_in_one_line(text, message):
    with pytest.raises(UsageError, match=message) as err:
        parse_formats(text)
    assert "\n" not in str(err.value)


def test_each_linear_runs_forward_dgrad_and_wgrad_gemms():
    desc = describe_model("7b")
    linears = {s.name: s for s in model_linears(desc)}
    assert list(linears) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", HEAD]
    assert (linears["down_proj"].k, linears["down_proj"].n, linears["down_proj"].count) == (11008, 4096, 32)
    assert linears["down_proj"].gemms(2048) == [
        ("forward", 2048, 11008, 4096),
        ("dgrad", 2048, 4096, 11008),
        ("wgrad", 4096, 2048, 11008),
    ]
    assert linears[HEAD].head and (linears[HEAD].k, linears[HEAD].n, linears[HEAD].count) == (4096, 32000, 1)
    assert model_linears(GPT2) == []  # Conv1D blocks: no Linear a converter swaps
    assert payoff_plan(GPT2, formats="fp8", micro_batch=1, seq_len=128, gpu=H100)["note"].startswith("gpt2 blocks")


def test_the_rest_of_the_step_by_hand():
    desc = describe_model("7b")
    device = Roofline.from_peaks(bandwidth=1e12, bf16=1e15)
    d, ff, q, kv = desc.d_model, desc.d_ff, desc.q_dim, desc.kv_dim
    assert elementwise_elements_per_token(desc) == 10 * d + 2 * (q + kv) + 3 * ff  # RoPE and a gated MLP
    other = other_time(desc, micro_batch=2, seq_len=1024, grad_accum=4, device=device)
    tokens = 2048
    assert other.attention_s == pytest.approx(12 * desc.n_layers * q * 1024 * tokens / 1e15)
    assert other.elementwise_s == pytest.approx(3 * elementwise_elements_per_token(desc) * 2 * tokens * 32 / 1e12)
    assert other.optimizer_s == pytest.approx(28 * desc.num_parameters() / 4 / 1e12)  # one step per 4 micro-batches
    sharded = other_time(desc, micro_batch=2, seq_len=1024, grad_accum=4, device=device, shards=8)
    assert sharded.optimizer_s == pytest.approx(other.optimizer_s / 8) and sharded.attention_s == other.attention_s


def test_small_gemms_do_not_pay_and_the_plan_says_stay_in_bf16():
    block = payoff_plan(describe_model("small"), formats="fp8,fp8:rowwise", micro_batch=1, seq_len=128, gpu=H100)
    for label in ("fp8", "fp8:rowwise"):
        fmt = _format(block, label)
        assert fmt["converted_layers"] == [] and fmt["step_speedup"] == pytest.approx(1.0)
        assert "stay in bf16" in fmt["warning"]
        assert all(layer["with_overhead"] < 1 for layer in fmt["layers"] if layer["name"] != HEAD)


def test_a_large_model_converts_its_block_linears_never_its_head_and_amdahl_caps_the_step():
    block = payoff_plan(describe_model("7b"), formats="all", micro_batch=4, seq_len=2048, gpu=B200)
    gpu = block["gpus"][0]
    fp8, nvfp4 = _format(block, "fp8"), _format(block, "nvfp4")
    for fmt in (fp8, nvfp4):
        assert fmt["converted_layers"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        head = next(layer for layer in fmt["layers"] if layer["name"] == HEAD)
        assert not head["converted"] and "head" in head["reason"]
        assert fmt["filter"]["filter_fqns"] == [HEAD]
        # kernel-only > with its casts > the whole step (the rest of it unchanged) > 1; below Amdahl's bound
        assert fmt["kernel_only"] > fmt["with_overhead"] > fmt["step_speedup"] >= WORTH_IT
        assert fmt["step_kernel_only"] > fmt["step_speedup"] and fmt["step_kernel_only"] < gpu["amdahl_bound"]
        assert fmt["warning"] is None
    assert nvfp4["kernel_only"] == pytest.approx(4.0) and fp8["kernel_only"] == pytest.approx(2.0)  # compute-bound
    assert 0 < gpu["gemm_share"] < 1 and gpu["amdahl_bound"] == pytest.approx(1 / (1 - gpu["gemm_share"]))
    tf32 = _format(block, "tf32")  # a whole-model precision: every Linear in it, no torchao filter
    assert tf32["step_speedup"] < 1 and tf32["filter"] is None and len(tf32["converted_layers"]) == 8


def test_the_step_estimate_is_amdahls_law_over_the_converted_linears():
    desc = describe_model("7b")
    work = Workload(desc=desc, micro_batch=1, seq_len=4096)
    prediction = predict_gpu(work, H100, [Candidate("fp8-e4m3", "tensorwise")])
    assert prediction is not None
    (fmt,) = prediction.formats
    device = Roofline.from_gpu(H100)
    assert device is not None
    low = sum(v.low_s * v.count if v.converted else v.bf16_s * v.count for v in fmt.layers)
    assert fmt.step_speedup == pytest.approx(prediction.bf16_step_s / (low + prediction.other.total_s))
    q = next(v for v in fmt.layers if v.name == "q_proj")
    assert q.bf16_s == pytest.approx(linear_cost(4096, 4096, 4096, device).total_s)
    share, gain = fmt.converted_share, q.bf16_s / q.low_s  # every block Linear here gains alike (square-ish)
    assert share is not None and 0 < share < 1 and gain > 1


def test_block_scaled_formats_are_not_predicted_off_blackwell():
    block = payoff_plan(describe_model("7b"), formats="mxfp8,nvfp4", micro_batch=1, seq_len=2048)  # every GPU
    names = [g["gpu"] for g in block["gpus"]]
    assert "B200" in names and "H100-80GB" in names and "V100-16GB" in block["skipped_gpus"]
    for gpu in block["gpus"]:
        for fmt in gpu["formats"]:
            sm100 = (GPUS[gpu["gpu"]].compute_capability or (0, 0)) >= (10, 0)  # B200, GB200: block-scaled MMA
            assert fmt["predicted"] == sm100, (gpu["gpu"], fmt["label"])
            if not fmt["predicted"]:
                assert "block-scaled MMA" in fmt["note"]


def test_a_shape_that_breaks_the_block_rule_stays_bf16():
    desc = describe_model("7b")
    odd = type(desc)(**{**desc.__dict__, "d_ff": 11000})  # 11000 = 16 x 687.5: neither 16- nor 32-aligned
    block = payoff_plan(odd, formats="mxfp8", micro_batch=4, seq_len=2048, gpu=B200)
    verdicts = {layer["name"]: layer for layer in _format(block, "mxfp8")["layers"]}
    assert not verdicts["down_proj"]["converted"] and "multiples of 32" in verdicts["down_proj"]["reason"]
    assert verdicts["q_proj"]["converted"]


def test_the_pasted_torchao_filter_converts_exactly_the_linears_that_pay():
    """70b on H100 at 2,048 tokens with fp8 rowwise: its narrow k/v projections (8192 -> 1024) do not
    pay, the rest do; the snippet, run as a user pastes it, converts just those (torchao, for real)."""
    block = payoff_plan(describe_model("70b"), formats="fp8:rowwise", micro_batch=1, seq_len=2048, gpu=H100)
    fmt = _format(block, "fp8:rowwise")
    assert fmt["filter"]["filter_fqns"] == ["k_proj", "v_proj", HEAD]
    model = LanguageModelTask(model="tiny", seq_len=32).build_model(device=torch.device("cpu"), seed=0)
    exec(fmt["filter"]["code"], {"model": model})  # the user's paste
    kinds = {name.rsplit(".", 1)[-1]: type(m).__name__ for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert {k for k, cls in kinds.items() if cls == "Float8Linear"} == set(fmt["converted_layers"])
    assert kinds["k_proj"] == kinds["lm_head"] == "Linear"


def test_mxfp4s_filter_says_torchao_has_no_recipe_for_it():
    made = torchao_filter(Candidate("mxfp4", "mx"), skipped=[HEAD], converted=["q_proj"], where="B200")
    assert "no mxfp4 training recipe" in made["note"] and "quantize_" not in made["code"]
    compile(made["code"], "<filter>", "exec")
