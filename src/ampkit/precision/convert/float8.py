"""fp8: torchao's float8 training conversion (`torchao.float8.convert_to_float8_training`).

The converted Linears (`Float8Linear`) cast input, weight and output gradient to float8 with dynamic
scales (`tensorwise`: one per tensor; `rowwise`: one per row) and multiply them with `torch._scaled_mm`
on sm89+/MI300 GPUs; `fp8-emulated` runs the same conversion with torchao's emulation (the casts in
software, the matmul in the high-precision dtype): for tests and CPUs. Beyond the shape rule, a Linear
stays in bf16 where the fp8 roofline (`precision/fp8_roofline.py`) predicts no gain on a known GPU.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ampkit.precision.convert.base import LinearConverter
from ampkit.precision.convert.loading import load_torchao


class Float8Converter(LinearConverter):
    format_name = "fp8-e4m3"

    def extra_reason(self, fqn: str, module: nn.Linear) -> str | None:
        if self.options is not None and not self.options.pays(module):
            return "predicted not to gain on this GPU (fp8 roofline)"
        return None

    def swap(self, model: nn.Module, names: list[str]) -> None:
        float8 = load_torchao("float8", what="fp8")
        recipe = self.options.recipe if self.options is not None else "tensorwise"
        fsdp = bool(self.options is not None and self.options.fsdp_all_gather)
        config = dataclasses.replace(
            float8.Float8LinearConfig.from_recipe_name(recipe),
            emulate=self.emulated,
            enable_fsdp_float8_all_gather=fsdp,
        )
        wanted = set(names)
        float8.convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in wanted)
