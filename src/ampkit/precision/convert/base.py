"""The module-converter interface: one class per low-bit format (torchtitan's components/quantization).

A converter finds a model's eligible Linear layers, swaps them for its format's, and reports which it
converted and which it kept in the compute dtype, and why (`ConversionReport`). Eligibility, in order:
- an `nn.Linear` or a subclass (Falcon's FalconLinear), but not one a converter already swapped in, nor
  nn.MultiheadAttention's out_proj (which MultiheadAttention multiplies by its weight, never its forward);
- not the output head (`SKIP_MODULES`): the logits' precision drives the loss, and every published
  low-bit recipe (torchao's float8, NVIDIA's NVFP4) keeps it in bf16;
- in and out features multiples of the format's `dim_multiple` (`ampkit.formats`): fp8's kernels need
  16-aligned dims; an MX block of 32 (NVFP4: 16) runs along the in features in the forward GEMM and
  along the out features in the input-gradient GEMM, so both dims must hold whole blocks;
- the converter's own rule (`extra_reason`: fp8 skips Linears its roofline predicts no gain for).
A model where no Linear meets the shape rule is refused (`ConversionRefused`): it would run as
bf16-mixed under the format's name.

In-place consumers: torchao's training matmuls are autograd Functions that return a reshape of their
own result, a view made inside the Function, and autograd forbids modifying such a view in place
(Falcon's `mlp_output += attention_output` raises "Output 0 of matmul_with_hp_or_float8_args is a view
and is being modified inplace"). `guard_inplace` makes such an output a tensor of its own (a copy of
the layer's output: one extra write and read of tokens x out_features elements per converted Linear,
small beside the GEMM's tokens x in x out multiply-adds, and fused away under torch.compile).
ampkit's own emulation (`convert/qdq.py`) returns a fresh tensor and needs no guard.

Converters run on the meta device (`ampkit train` converts before materialising) and on fake tensors
(`ampkit plan`): a swap moves the Linear's own Parameter objects into the new module, so tied weights,
state-dict names and the model's initialisation are unchanged.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from ampkit.formats import NumericFormat, get_format
from ampkit.precision.convert.report import ConversionRefused, ConversionReport

SKIP_MODULES = ("lm_head",)
"""module-name endings kept in the compute dtype whatever their shape: the output head"""
HEAD = "the output head"


class LinearConverter:
    """One format's converter. Subclasses set `format_name` and implement `swap`."""

    format_name: ClassVar[str]
    """its format in `ampkit.formats` (whose `converter` names this class)"""
    native_missing: ClassVar[str] = ""
    """why no native path exists on any device (torchao ships no training kernels for the format), in a
    refusal's words; "" where the format's native rule (`NumericFormat.native`) decides"""

    def __init__(self, *, precision: str, emulated: bool, options: Any = None) -> None:
        self.precision = precision
        self.emulated = emulated
        self.options = options
        """the precision's options object (fp8: `Fp8Options`); converters that take none ignore it"""

    @property
    def fmt(self) -> NumericFormat:
        return get_format(self.format_name)

    def shape_reason(self, fqn: str, module: nn.Linear) -> str | None:
        """Why `module` cannot hold this format (None: it can): the output head, or its shape."""
        if any(fqn.endswith(name) for name in SKIP_MODULES):
            return HEAD
        m = self.fmt.dim_multiple
        if module.in_features % m or module.out_features % m:
            return f"{module.in_features}x{module.out_features} not multiples of {m}"
        return None

    def extra_reason(self, fqn: str, module: nn.Linear) -> str | None:
        """The converter's own rule beyond the shape (None: convert it)."""
        return None

    def guards_outputs(self) -> bool:
        """Its converted Linears return a view made inside an autograd Function (torchao's matmuls do):
        `guard_inplace` gives each output a tensor of its own."""
        return True

    def swap(self, model: nn.Module, names: list[str]) -> None:
        """Replace the Linears named `names` (module names under `model`) by this format's, in place."""
        raise NotImplementedError

    def classify(
        self, model: nn.Module, *, kernels: bool = True, keep: dict[str, str] | None = None
    ) -> ConversionReport:
        """Which of `model`'s Linears this converter would convert and which it would keep, and why,
        without touching the model (a dry run: `ampkit plan` checks each format on a meta-device model).
        Refuses a model with none that meets the shape rule, and (`kernels`) a native conversion that no
        kernel exists for (`native_missing`). `keep`: module path -> why every Linear in its subtree stays
        (a per-module precision override)."""
        if kernels and self.native_missing and not self.emulated:
            raise ConversionRefused(f"{self.precision}: {self.native_missing}; use {self.precision}-emulated")
        chosen: list[str] = []
        kept: dict[str, str] = {}
        shaped = 0
        for fqn, module in model.named_modules():
            if not isinstance(module, nn.Linear) or _converted(module):
                continue
            why = "the model itself (a converter swaps the Linears inside a model)" if not fqn else None
            why = why or _kept_by(fqn, keep or {}) or _no_forward(module) or self.shape_reason(fqn, module)
            shaped += why is None
            why = why or self.extra_reason(fqn, module)
            if why is None:
                chosen.append(fqn)
            else:
                kept[fqn] = why
        if not shaped:
            raise ConversionRefused(self._nothing_to_convert(kept))
        return ConversionReport(
            precision=self.precision, format=self.fmt.name, emulated=self.emulated, converted=chosen, kept=kept
        )

    def convert(self, model: nn.Module, *, keep: dict[str, str] | None = None) -> ConversionReport:
        """Convert `model`'s eligible Linears in place (`classify`'s choice, `keep` kept) and report what it did."""
        report = self.classify(model, keep=keep)
        self.swap(model, report.converted)
        if self.guards_outputs():
            for fqn in report.converted:
                guard_inplace(model.get_submodule(fqn))
        return report

    def _nothing_to_convert(self, kept: dict[str, str]) -> str:
        others = {name: why for name, why in kept.items() if why != HEAD}
        if not others:
            found = "its only nn.Linear layer is the output head, which stays in bf16" if kept else "no nn.Linear layer"
        else:
            name, why = next(iter(others.items()))
            found = f"none of its {len(others)} nn.Linear layers (the head aside) can hold it ({name}: {why})"
        return f"{self.precision} has nothing to convert in this model: {found}; use bf16-mixed for it"


def _converted(module: nn.Module) -> bool:
    """A Linear some converter already swapped in (ampkit's, or torchao's Float8Linear)."""
    return type(module).__module__.startswith(("ampkit.precision.convert", "torchao"))


def _kept_by(fqn: str, keep: dict[str, str]) -> str | None:
    """Why a Linear at `fqn` stays, when it is in a kept subtree (`keep`: root path -> why)."""
    return next((why for root, why in keep.items() if fqn == root or fqn.startswith(root + ".")), None)


def _no_forward(module: nn.Linear) -> str | None:
    """A Linear whose forward its owner never calls: nn.MultiheadAttention reads `out_proj.weight` itself,
    so a swapped out_proj would be reported converted and multiply nothing in the format."""
    if isinstance(module, NonDynamicallyQuantizableLinear):
        return "read by nn.MultiheadAttention through its weight"
    return None


def replace_module(model: nn.Module, fqn: str, new: nn.Module) -> None:
    """Put `new` where module `fqn` of `model` is."""
    parent_name, _, child = fqn.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def adopt_linear(cls: type[nn.Linear], old: nn.Module, **attrs: Any) -> nn.Linear:
    """An instance of `cls` holding the Linear `old`'s own Parameter objects (built on the meta device: no
    memory, no init work), in `old`'s train/eval mode, with `attrs` set on it."""
    assert isinstance(old, nn.Linear), f"a converter swaps nn.Linear layers, not {type(old).__name__}"
    new = cls(old.in_features, old.out_features, bias=old.bias is not None, device="meta")
    new.weight = old.weight
    new.bias = old.bias
    for name, value in attrs.items():
        setattr(new, name, value)
    return new.train(old.training)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a plain Linear would multiply `x` in: autocast's where it is on for `x`'s device, else `x`'s."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def guard_inplace(module: nn.Module) -> None:
    """Make `module`'s output safe for in-place consumers: an output that is a view (torchao's matmul
    Functions return one) is replaced by a copy of its own; any other output passes through unchanged."""
    module.register_forward_hook(_own_output)


def _own_output(module: nn.Module, args: Any, output: Any) -> Any:
    if isinstance(output, torch.Tensor) and output._is_view():
        return output.clone()
    return None  # the output as it is
