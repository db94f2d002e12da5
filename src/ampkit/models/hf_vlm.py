"""Hugging Face image-text models (VLMs) as ampkit models: `--model hf:PATH` with a VLM config.

PATH's config.json is an `AutoModelForImageTextToText` type (`models/hf.py` `model_kind`): LLaVA,
Llama 3.2 Vision (mllama), Qwen2-VL / Qwen2.5-VL, Idefics3 / SmolVLM, PaliGemma, Gemma 3, ... As for
a causal LM, a config alone is built on the meta device and materialised with transformers' own
init seeded per tensor name (`models/hf_init.py`); a folder with weights loads them
(`from_pretrained`, local files only). Nothing is downloaded.

The model's **parts** (`find_parts`), named once for every family: `vision` (the vision tower),
`projector` (what maps vision states into the language model: LLaVA's `multi_modal_projector`,
Idefics3's `connector`, Qwen2-VL's `visual.merger`, and mllama's fusion: its projector plus the
cross-attention decoder layers), `language` (the language model and its head). Found by the
modules' names transformers gives them (and, for fusion, the cross-attention layers' class), every
parameter in exactly one part; `--freeze PART` and the planner's per-part ledger use them.

`HFVisionLM` gives the model ampkit's call contract: `forward(input_ids, **image_inputs) -> logits`
(the image inputs each family's rule makes, `models/vlm_images.py`), `blocks` (the vision encoder's
and the language model's layers, for checkpointing and FSDP), `parts`, `config` (`HFVisionInfo`).
Module paths are transformers' prefixed with `hf.` (`hf.model.vision_tower.vision_model.encoder.layers.0`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.models.hf import (
    HF_PREFIX,
    IMAGE_TEXT,
    HFModelInfo,
    _instantiate,
    check_kind,
    has_weights,
    hf_model_dir,
    info_from_model,
    load_hf_config,
)
from ampkit.models.hf_init import init_hf_weights
from ampkit.models.init import draw_seed, materialize
from ampkit.models.vlm_images import ImageFamily, image_family

PARTS = ("vision", "projector", "language")
"""a VLM's parts, in the order data flows through them"""
_PART_NAMES = {
    "vision": re.compile(r"^(vision_tower|vision_model|visual|vision_encoder|image_encoder|vision)$"),
    "projector": re.compile(r"^(multi_modal_projector|mm_projector|connector|merger|projector|resampler|aligner)$"),
    "language": re.compile(r"^(language_model|text_model|lm_head)$"),
}
_FUSION_LAYER = re.compile(r"CrossAttention.*(Layer|Block)$")
"""decoder layers that read the vision states (mllama's `MllamaCrossAttentionDecoderLayer`): fusion"""


@dataclass(frozen=True)
class Parts:
    """Module paths (transformers', no `hf.` prefix) of each part, and the parameters of each."""

    roots: dict[str, tuple[str, ...]]
    """part -> the modules it consists of (their subtrees, less any subtree given to another part)"""
    of_parameter: dict[str, str]
    """parameter name (its first name, as `named_parameters` gives it) -> part ("other": none)"""

    def parameters(self, model: nn.Module, part: str) -> list[nn.Parameter]:
        params = dict(model.named_parameters())
        return [params[name] for name, p in self.of_parameter.items() if p == part and name in params]

    def counts(self, model: nn.Module) -> dict[str, int]:
        """Parameters (elements) per part, each distinct tensor once; "other" only when non-empty."""
        params = dict(model.named_parameters())
        out = dict.fromkeys(PARTS, 0)
        for name, part in self.of_parameter.items():
            out[part] = out.get(part, 0) + params[name].numel()
        return {k: v for k, v in out.items() if k in PARTS or v}


def _part_of_name(name: str) -> str | None:
    last = name.rsplit(".", 1)[-1]
    for part, pattern in _PART_NAMES.items():
        if pattern.match(last):
            return part
    return None


def find_parts(model: nn.Module) -> Parts:
    """Each parameter's part: that of its deepest ancestor module named like a part (module docstring);
    a cross-attention decoder layer is fusion (`projector`) inside the language model."""
    owner: dict[str, str] = {}
    for name, module in model.named_modules():
        part = _part_of_name(name) if name else None
        if part is None and _FUSION_LAYER.search(type(module).__name__):
            part = "projector"
        if part is not None:
            owner[name] = part
    of_parameter: dict[str, str] = {}
    for name, _ in model.named_parameters():  # a tied weight once, under its first name
        prefixes = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)]
        of_parameter[name] = next((owner[p] for p in prefixes if p in owner), "other")
    roots: dict[str, list[str]] = {p: [] for p in PARTS}
    for name, part in owner.items():
        if not any(name.startswith(r + ".") for r in roots[part]):
            roots[part].append(name)
    return Parts(roots={k: tuple(v) for k, v in roots.items()}, of_parameter=of_parameter)


def check_part_names(names: Iterable[str], available: Collection[str] | None, *, model: str) -> tuple[str, ...]:
    """`--freeze` values: each a part name with parameters in this model (`available`: its parts;
    None: a model without parts -- a causal LM, an MLP, any model that is not vision-language), else one line."""
    out = []
    for name in names:
        if name not in PARTS:
            raise UsageError(f"--freeze {name!r}: not a part name; choose from {', '.join(PARTS)}")
        if available is None or name not in available:
            having = "only a vision-language model has parts"
            if available is not None:
                having = "its parts: " + ", ".join(sorted(available))
            raise UsageError(f"--freeze {name}: no module of {model} is in a {name} part ({having})")
        out.append(name)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class HFVisionInfo(HFModelInfo):
    """`HFModelInfo` of a VLM: the language model's shape fields, and the parts' exact counts."""

    part_parameters: dict[str, int] = field(default_factory=dict, repr=False)
    """parameters (elements) per part: vision, projector, language (and "other" where some are)"""
    convolutions: int = 0
    """convolution layers (the vision tower's patch embedding): cuDNN's TF32 switch governs them"""

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "kind": IMAGE_TEXT, "parts": dict(self.part_parameters)}


def vision_info(spec: str, model: nn.Module, *, pretrained: bool) -> HFVisionInfo:
    base = info_from_model(spec, model, pretrained=pretrained)
    fields = {k: getattr(base, k) for k in base.__dataclass_fields__}
    convs = sum(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return HFVisionInfo(**fields, part_parameters=find_parts(model).counts(model), convolutions=convs)


def _layer_lists(model: nn.Module) -> list[nn.ModuleList]:
    """The repeated layers: ModuleLists whose members are all transformer layers (a class of the
    model's `_no_split_modules`, or one named ...Layer / ...Block)."""
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    lists = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module):
            names = {type(child).__name__ for child in module}
            if all(n in no_split or n.endswith(("Layer", "Block")) for n in names):
                lists.append(module)
    return lists


class HFVisionLM(nn.Module):
    """A transformers image-text model with ampkit's call contract (module docstring).

    `forward(input_ids (B, T), **image_inputs) -> logits (B, T, vocab)`: `image_inputs` are the
    family's (`pixel_values`, and `image_grid_thw`, `aspect_ratio_ids`, `cross_attention_mask`,
    `pixel_attention_mask`, `token_type_ids` where it needs them). Padding is on the right and
    attention is causal, so no attention mask is needed: no real token sees a pad. The KV cache is off.
    """

    supports_attn_mask = False  # packed rows would mix images across documents: --batching pad/bucket

    def __init__(self, model: nn.Module, info: HFVisionInfo, family: ImageFamily | None):
        super().__init__()
        self.hf = model
        self.config = info
        self.family = family
        hf_config: Any = model.config
        hf_config.use_cache = False
        text: Any = hf_config.get_text_config()
        text.use_cache = False

    @property
    def parts(self) -> Parts:
        return find_parts(self.hf)

    @property
    def blocks(self) -> list[nn.Module]:
        """Every repeated layer (vision encoder's, then the language model's), each once."""
        return [layer for layers in _layer_lists(self.hf) for layer in layers]

    def num_parameters(self) -> int:
        return self.config.num_parameters()

    def init_weights(self, *, seed: int) -> None:
        """The initial values after `to_empty` (`ampkit.models.hf_init`)."""
        init_hf_weights(self.hf, seed=seed)

    def forward(self, input_ids: torch.Tensor, **image_inputs: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids, use_cache=False, **image_inputs).logits


def freeze(model: HFVisionLM, names: Iterable[str]) -> int:
    """Stop training the named parts (`requires_grad` off: no gradients, no optimizer states; the
    flags survive `to_empty`, so this works on the meta device); returns the frozen elements."""
    parts = model.parts
    frozen = 0
    for name in check_part_names(names, set(parts.of_parameter.values()), model=model.config.name):
        for param in parts.parameters(model.hf, name):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def is_image_text(spec: str) -> bool:
    """True for `hf:PATH` whose config is an image-text model (a VLM); False for anything else."""
    if not spec.startswith(HF_PREFIX):
        return False
    folder = hf_model_dir(spec)
    from ampkit.models.hf import model_kind

    return model_kind(load_hf_config(spec)) == IMAGE_TEXT if (folder / "config.json").is_file() else False


def family_of(spec: str, config: Any) -> ImageFamily | None:
    """The image rule of the model's family, or None for a family ampkit has no rule for."""
    from ampkit.models.vlm_images import FAMILIES

    if str(config.model_type) not in FAMILIES:
        return None
    return image_family(config, hf_model_dir(spec))


def describe_hf_vlm(spec: str) -> HFVisionInfo:
    """Count and describe a VLM `hf:PATH` on the meta device (nothing allocated, no weights read)."""
    config = load_hf_config(spec)
    with torch.device("meta"):
        model = _instantiate(spec, config, weights=False)
    return vision_info(spec, model, pretrained=has_weights(hf_model_dir(spec)))


def build_hf_vlm(
    spec: str, *, device: str | torch.device = "cpu", seed: int | None = None, frozen: Iterable[str] = ()
) -> HFVisionLM:
    """`hf:PATH` (a VLM config) -> HFVisionLM on `device`, in torch's default dtype, the `frozen` parts
    not trained. As `build_hf_model`: a config alone is built on the meta device and materialised
    with the seeded init (`device="meta"`: returned unmaterialised); weights are loaded for real."""
    config = load_hf_config(spec)
    folder: Path = hf_model_dir(spec)
    if check_kind(config, folder / "config.json") != IMAGE_TEXT:
        raise UsageError(f"--model {spec}: not an image-text model; a causal LM builds with build_hf_model")
    family = family_of(spec, config)
    weights = has_weights(folder)
    if weights:
        model = _instantiate(spec, config, weights=True)
        adapter = HFVisionLM(model, vision_info(spec, model, pretrained=True), family).to(device)
        freeze(adapter, frozen)
        return adapter
    with torch.device("meta"):
        model = _instantiate(spec, config, weights=False)
    adapter = HFVisionLM(model, vision_info(spec, model, pretrained=False), family)
    freeze(adapter, frozen)
    if torch.device(device).type == "meta":
        return adapter
    materialize(adapter, device=device, seed=draw_seed() if seed is None else seed)  # in place
    return adapter
