"""ampkit.precision.overrides: a precision per module (fp32 islands, -true subtrees), applied by the policy."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.precision import SPECS, ModuleOverrides, build_precision
from ampkit.precision.overrides import MARK, PART_NAMES, REGIMES, resolve_pattern


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _record(model: Net) -> dict[str, tuple[torch.dtype, torch.dtype]]:
    """name -> (input dtype, output dtype) of every Linear's forward."""
    seen: dict[str, tuple[torch.dtype, torch.dtype]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(lambda m, a, o, n=name: seen.__setitem__(n, (a[0].dtype, o.dtype)))
    return seen


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed", "bf16-true"])
def test_an_fp32_island_computes_bitwise_what_fp32_computes_inside_it(precision):
    """The island's forward and its weights' gradients, from what arrives at it, are the fp32 model's
    bit for bit: the same module in fp32, fed the island's input (upcast) and its output's gradient."""
    policy = build_precision(precision, device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.1.mlp"))
    model = policy.convert_module(Net())
    reference = copy.deepcopy(Net().blocks[1].mlp)  # the same seed: the same initial weights, in fp32
    if precision.endswith("-true"):  # the island's weights were cast down and back up: take them as they are
        reference.load_state_dict({k: v.float() for k, v in model.blocks[1].mlp.state_dict().items()})
    seen: dict[str, torch.Tensor] = {}
    island = model.blocks[1].mlp
    island.register_forward_hook(lambda m, a, o: seen.update(x=a[0].detach(), y=o))
    x = torch.randn(4, 8)
    with policy.forward_context():
        out = model(x.to(torch.bfloat16) if precision == "bf16-true" else x)
    seen["y"].retain_grad()
    out.float().sum().backward()
    ref_in = seen["x"].float().requires_grad_(True)
    ref_out = reference(ref_in)
    # the forward, bit for bit (its output handed back in the dtype that arrived where no autocast follows)
    assert torch.equal(ref_out.to(seen["y"].dtype), seen["y"])
    ref_out.backward(seen["y"].grad.float())
    for (name, p), (_, q) in zip(island.named_parameters(), reference.named_parameters(), strict=True):
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, q.grad), name


def test_an_fp32_island_runs_its_matmuls_in_fp32_under_bf16_autocast():
    policy = build_precision("bf16-mixed", device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.1.mlp"))
    model = policy.convert_module(Net())
    seen = _record(model)
    with policy.forward_context():
        out = model(torch.randn(4, 8))
    assert seen["blocks.1.mlp.0"] == seen["blocks.1.mlp.2"] == (torch.float32, torch.float32)
    assert seen["blocks.0.mlp.0"][1] == seen["head"][1] == torch.bfloat16  # the rest stays under autocast
    assert out.dtype == torch.bfloat16
    assert policy.overridden == {"blocks.1.mlp": "fp32"}
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_a_glob_resolves_to_the_outermost_matches_and_a_part_name_needs_a_vlm():
    model = Net()
    assert resolve_pattern(model, "blocks.*.mlp") == ("blocks.0.mlp", "blocks.1.mlp")
    assert resolve_pattern(model, "blocks.*") == ("blocks.0", "blocks.1")  # not their children too
    with pytest.raises(UsageError, match=r"'language' matches no module .*blocks"):
        resolve_pattern(model, "language")  # a model without a vision part has no parts


def test_a_pattern_matching_nothing_is_one_line_naming_it_and_some_modules():
    policy = build_precision("bf16-mixed", device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.7.mlp"))
    with pytest.raises(UsageError) as err:
        policy.convert_module(Net())
    text = str(err.value)
    assert "\n" not in text and "'blocks.7.mlp'" in text and "blocks.1.mlp" in text  # the closest paths


@pytest.mark.parametrize(
    ("text", "word"),
    [("vision", "write PATTERN=REGIME"), ("vision=bf16-mixed", "not a module regime"), ("=fp32", "PATTERN=REGIME")],
)
def test_bad_overrides_are_refused_in_one_line(text, word):
    with pytest.raises(UsageError, match=word):
        ModuleOverrides.parse(text)


def test_the_regimes_are_fp32_and_the_true_ones_and_the_part_names_are_the_vlm_adapters():
    from ampkit.models.hf_vlm import PARTS

    assert PART_NAMES == PARTS
    assert {SPECS[r].param_dtype for r in REGIMES} == {torch.float32, torch.bfloat16, torch.float16}
    assert all(not SPECS[r].autocast for r in REGIMES)
    parsed = ModuleOverrides.parse("vision=fp32, blocks.0=bf16-true") + ModuleOverrides.keep_fp32("head")
    assert str(parsed) == "vision=fp32,blocks.0=bf16-true,head=fp32"
    assert parsed.to_dict() == {"vision": "fp32", "blocks.0": "bf16-true", "head": "fp32"}


def test_a_true_subtree_in_an_fp32_model_stores_and_computes_in_bf16_and_hands_back_fp32():
    policy = build_precision("fp32", device_type="cpu", overrides=ModuleOverrides.parse("blocks.0=bf16-true"))
    model = policy.convert_module(Net())
    seen = _record(model)
    out = model(torch.randn(4, 8))
    assert {p.dtype for p in model.blocks[0].parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.blocks[1].parameters()} == {torch.float32}
    assert seen["blocks.0.mlp.0"] == (torch.bfloat16, torch.bfloat16)
    assert seen["blocks.1.mlp.0"] == (torch.float32, torch.float32)  # the block's output came back in fp32
    out.sum().backward()
    assert model.blocks[0].mlp[0].weight.grad.dtype == torch.bfloat16


def test_an_fp32_island_in_a_bf16_true_model_keeps_fp32_weights_and_hands_back_bf16():
    policy = build_precision("bf16-true", device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.1.mlp"))
    with policy.init_context():
        model = Net()
    model = policy.convert_module(model)
    seen = _record(model)
    out = model(policy.convert_input(torch.randn(4, 8)))
    assert {p.dtype for p in model.blocks[1].mlp.parameters()} == {torch.float32}
    assert model.blocks[0].mlp[0].weight.dtype == model.blocks[1].norm.weight.dtype == torch.bfloat16
    assert seen["blocks.1.mlp.0"] == seen["blocks.1.mlp.2"] == (torch.float32, torch.float32)
    assert seen["head"] == (torch.bfloat16, torch.bfloat16) and out.dtype == torch.bfloat16  # handed back
    out.float().sum().backward()
    assert model.blocks[1].mlp[0].weight.grad.dtype == torch.float32


@pytest.mark.parametrize("precision", [n for n, s in SPECS.items() if not s.converts_linears and not s.tf32])
def test_every_precision_runs_an_island_forward_and_backward(precision):
    """The contract: whatever the regime, an fp32 island's Linears multiply in fp32 and gradients flow."""
    policy = build_precision(precision, device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.0.mlp"))
    with policy.init_context():
        model = Net()
    model = policy.convert_module(model)
    seen = _record(model)
    with policy.forward_context():
        out = model(policy.convert_input(torch.randn(2, 8)))
    policy.backward(out.float().sum())
    assert seen["blocks.0.mlp.2"] == (torch.float32, torch.float32)
    assert model.blocks[0].mlp[0].weight.grad is not None
    assert not torch.is_autocast_enabled("cpu")  # every region closed


def test_applying_twice_and_deep_copies_keep_one_region():
    policy = build_precision("bf16-mixed", device_type="cpu", overrides=ModuleOverrides.keep_fp32("head"))
    model = policy.convert_module(Net())
    copied = policy.convert_module(copy.deepcopy(model))  # doctor's layer fidelity converts a copy
    region = getattr(copied.head, MARK)
    assert region.regime == "fp32" and region.inner is None  # wrapped once, not twice
    assert copied.head.forward.__self__ is copied.head  # the copy's region runs the copy, not the original
    seen = _record(copied)
    with policy.forward_context():
        copied(torch.randn(2, 8))
    assert seen["head"] == (torch.float32, torch.float32)
    assert list(model.state_dict()) == list(Net().state_dict())  # same keys: checkpoints load


def test_the_low_bit_converters_leave_an_islands_linears_unconverted():
    pytest.importorskip("torchao")
    policy = build_precision("fp8-emulated", device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.1"))
    model = nn.Sequential()
    model.add_module("blocks", nn.ModuleList([nn.Sequential(nn.Linear(32, 32)), nn.Sequential(nn.Linear(32, 32))]))
    model.add_module("head", nn.Linear(32, 16))
    policy.convert_module(model)
    report = policy.conversion()
    assert report is not None
    assert "blocks.1.0" in report.kept and "override" in report.kept["blocks.1.0"]
    assert "blocks.0.0" in report.converted and type(model.blocks[1][0]) is nn.Linear


def test_a_vlm_part_name_resolves_as_freeze_finds_the_part(tmp_path):
    pytest.importorskip("transformers")
    from ampkit.models.hf_vlm import build_hf_vlm
    from vlm_fixtures import save_tiny_vlm

    model = build_hf_vlm(f"hf:{save_tiny_vlm(tmp_path / 'llava', 'llava')}", device="meta")
    vision = resolve_pattern(model, "vision")
    assert vision == tuple(f"hf.{r}" for r in model.parts.roots["vision"]) and vision
    kept = ModuleOverrides.keep_fp32("vision").parameters_by_dtype(model)
    in_part = {f"hf.{n}" for n, part in model.parts.of_parameter.items() if part == "vision"}
    assert set(kept) == in_part  # the island's parameters are exactly the part's
    policy = build_precision("bf16-true", device_type="cpu", overrides=ModuleOverrides.keep_fp32("vision"))
    policy.convert_module(model)  # on the meta device: casts, no memory
    assert {p.dtype for n, p in model.named_parameters() if n in in_part} == {torch.float32}
    assert model.hf.lm_head.weight.dtype == torch.bfloat16


def test_a_subtree_in_the_dtype_the_loss_scaler_guards_is_refused_in_one_line():
    with pytest.raises(UsageError, match="cannot unscale gradients stored in fp16-true's dtype"):
        build_precision("fp16-mixed", device_type="cpu", overrides=ModuleOverrides.parse("head=fp16-true"))
    build_precision("fp16-mixed", device_type="cpu", overrides=ModuleOverrides.parse("head=bf16-true"))  # fine


STEPPED = ["fp32", "bf16-mixed", "fp16-mixed", "bf16-true", "fp16-true"]


@pytest.mark.parametrize(
    ("precision", "regime"),
    [(p, r) for p in STEPPED for r in REGIMES if (p, r) != ("fp16-mixed", "fp16-true")],  # that one: refused
)
def test_every_precision_and_regime_take_a_full_step(precision, regime):
    """scale -> backward -> unscale -> step with a subtree in each regime."""
    policy = build_precision(precision, device_type="cpu", overrides=ModuleOverrides.parse(f"blocks.1={regime}"))
    with policy.init_context():
        model = Net()
    model = policy.convert_module(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = model.blocks[1].mlp[0].weight.detach().clone()
    with policy.forward_context():
        out = model(policy.convert_input(torch.randn(2, 8)))
    policy.backward(out.float().pow(2).mean())
    policy.unscale_gradients(optimizer)
    assert policy.optimizer_step(optimizer)
    assert model.blocks[1].mlp[0].weight.dtype == SPECS[regime].param_dtype
    assert not torch.equal(model.blocks[1].mlp[0].weight, before)  # the subtree trains


def test_torch_compile_traces_an_island():
    """The region is a `with` block in the module's forward, which dynamo traces (hooks that enter
    autocast by hand do not)."""
    policy = build_precision("bf16-mixed", device_type="cpu", overrides=ModuleOverrides.keep_fp32("blocks.1.mlp"))
    model = policy.convert_module(Net())
    seen = _record(model)
    compiled = torch.compile(model, backend="eager")
    with policy.forward_context():
        out = compiled(torch.randn(4, 8))
    out.float().sum().backward()
    assert seen["blocks.1.mlp.0"] == (torch.float32, torch.float32) and seen["blocks.0.mlp.0"][1] == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
