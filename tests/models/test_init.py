"""Initial weights do not depend on how the model is built (fp32, bf16-true, meta device then
materialised, real construction, fp8), and a bf16-true build makes no fp32 copy of the model.
The FSDP2 build (each rank its slice of the same init) is checked in tests/distributed/probe_fsdp.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ampkit.distributed.context import LocalRun
from ampkit.models import LlamaLM, ModelConfig, build_model, get_preset
from ampkit.models.init import _local_part, materialize, parameter_seed
from ampkit.precision import build_precision
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import build_task
from ampkit.train import TrainConfig
from ampkit.train.build import build_run_model

TINY = get_preset("tiny")
UNTIED = ModelConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96)


def params(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def assert_same(a, b, *, round_to: torch.dtype | None = None) -> None:
    pa, pb = params(a), params(b)
    assert list(pa) == list(pb)
    for name, x in pa.items():
        want = x.detach().to(round_to) if round_to else x.detach()
        assert pb[name].dtype == want.dtype, name
        assert torch.equal(pb[name].detach(), want), name


@pytest.mark.parametrize("cfg", [TINY, UNTIED], ids=["tied", "untied"])
def test_every_build_path_gives_the_same_initial_weights(cfg):
    reference = build_model(cfg, seed=11)  # meta device, then to_empty + init_weights
    real = LlamaLM(cfg)  # constructed for real (its own throwaway init), then re-initialised
    real.init_weights(seed=11)
    assert_same(reference, real)
    with build_precision("bf16-true", device_type="cpu").init_context():
        bf16 = build_model(cfg, seed=11)
    assert torch.get_default_dtype() == torch.float32  # the context restored it
    assert_same(reference, bf16, round_to=torch.bfloat16)  # bf16-true starts at the fp32 init, rounded
    with torch.device("meta"):
        late = LlamaLM(cfg)
    materialize(late, device="cpu", seed=11)
    assert_same(reference, late)


def test_tied_head_stays_tied_and_is_counted_once():
    for model in (build_model(TINY, seed=0), LlamaLM(TINY)):
        assert model.lm_head.weight is model.embed.weight
        assert sum(p.numel() for p in model.parameters()) == TINY.num_parameters()
    untied = build_model(UNTIED, seed=0)
    assert untied.lm_head.weight is not untied.embed.weight
    assert not torch.equal(untied.lm_head.weight, untied.embed.weight[: untied.lm_head.weight.shape[0]])


def test_the_seed_alone_decides_the_weights():
    torch.manual_seed(1)
    a = build_model(TINY, seed=5)
    torch.manual_seed(2)  # another global RNG state: no effect
    b = build_model(TINY, seed=5)
    assert_same(a, b)
    c = build_model(TINY, seed=6)
    for name, p in params(a).items():
        if "norm" not in name:
            assert not torch.equal(p, params(c)[name]), name
    assert parameter_seed(5, "embed.weight") != parameter_seed(5, "norm.weight") != parameter_seed(6, "norm.weight")


def test_gpt2_style_scheme_is_kept():
    cfg = get_preset("small")
    model = build_model(cfg, seed=0)
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        want = residual if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
        assert abs(p.std().item() - want) < 0.03 * want, name
        assert abs(p.mean().item()) < 0.05 * want, name
    blocks = [params(model)[f"blocks.{i}.attn.q_proj.weight"] for i in range(2)]
    assert not torch.equal(*blocks)  # same shape, different names: different draws


def test_fp8_conversion_on_the_meta_device_keeps_the_fp32_init():
    pytest.importorskip("torchao")
    from ampkit.precision.fp8 import converted_layers

    reference = build_model(TINY, seed=3)
    config = TrainConfig.of(model="tiny", precision="fp8-emulated", seq_len=32, seed=3)
    policy = build_precision("fp8-emulated", device_type="cpu")
    model, _ = build_run_model(
        build_task(config.task_spec()), config, policy=policy, device=torch.device("cpu"), parallel=LocalRun()
    )
    assert converted_layers(model)  # Float8Linear swapped in while the model was on the meta device
    assert_same(reference, model)


def test_the_language_model_task_builds_a_materialised_fp32_model():
    model = LanguageModelTask(model="tiny").build_model(device=torch.device("cpu"), seed=4)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert_same(build_model(TINY, seed=4), model)


def test_a_partly_real_model_is_refused():
    with torch.device("meta"):
        model = LlamaLM(TINY)
    model.norm.weight = torch.nn.Parameter(torch.ones(TINY.d_model))
    with pytest.raises(RuntimeError, match="partly on the meta device"):
        materialize(model, device="cpu", seed=0)


@pytest.mark.parametrize(
    ("rows", "world", "sizes"), [(5, 2, [3, 2]), (5, 4, [2, 2, 1, 0]), (1, 2, [1, 0]), (8, 2, [4, 4])]
)
def test_local_slices_follow_fsdp2_chunking(rows, world, sizes):
    """torch.chunk's split, as FSDP2 shards dim 0: the last ranks may get fewer rows, or none."""
    full = torch.arange(rows * 3, dtype=torch.float32).view(rows, 3)
    shard0 = SimpleNamespace(is_shard=lambda: True, is_replicate=lambda: False, dim=0)
    parts = []
    for rank in range(world):
        mesh = SimpleNamespace(size=lambda dim: world, get_local_rank=lambda dim, r=rank: r)
        parts.append(_local_part(full, SimpleNamespace(placements=(shard0,), device_mesh=mesh)))
    assert [p.shape[0] for p in parts] == sizes
    assert torch.equal(torch.cat(parts), full)


def _allocator_peak(fn) -> tuple[int, object]:
    """Peak of the CPU allocator's running total (bytes) while `fn` runs, and what it returned."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return peak, result


@pytest.mark.parametrize("precision", ["bf16-true", "fp16-true"])
def test_true_precision_builds_without_an_fp32_copy(precision):
    cfg = get_preset("small")  # ~25M parameters: fp32 would be ~100 MB, bf16 ~50 MB
    config = TrainConfig.of(model="small", precision=precision, seq_len=32)
    policy = build_precision(precision, device_type="cpu")
    peak, (model, _) = _allocator_peak(
        lambda: build_run_model(
            build_task(config.task_spec()), config, policy=policy, device=torch.device("cpu"), parallel=LocalRun()
        )
    )
    dtype = policy.spec.param_dtype
    assert {p.dtype for p in model.parameters()} == {dtype}
    n = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    weights = n * dtype.itemsize
    # the weights, plus one parameter's fp32 draw at a time (and its cast), plus a little slack
    assert peak <= weights + 2 * 4 * largest + 2**20, (peak, weights, largest)
    assert peak < 0.6 * 4 * n  # far below an fp32 copy of the model (which the old build made first)
    assert_same(build_model(cfg, seed=config.seed), model, round_to=dtype)
