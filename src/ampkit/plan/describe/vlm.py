"""A vision-language model described for the planner: exact counts per part and the shapes its ledger reads.

Built on the meta device from its config.json (transformers' `AutoModelForImageTextToText`: nothing
allocated; the 11B Llama 3.2 Vision in about a second), so the counts are transformers' own:
- per part (`models/hf_vlm.py` `find_parts`: vision, projector with mllama's fusion layers,
  language), every distinct tensor once; they sum to transformers' `num_parameters()`;
- matmul parameters by the tokens they multiply: the vision tower's (per patch of each encoder
  pass), the projector's (per image token, or per cross-attention state for mllama, whose fusion
  layers' key/value projections also read the vision states while the rest of them reads the
  text), the language model's (per token of its sequence, the head included);
- the stacks the activations come from: the vision encoder's layers (width, heads, MLP, norm and
  gating read from its first layer's modules; windowed-attention layers where the config has
  them, Qwen2.5-VL's), the language model's self-attention layers and its cross-attention ones.
Shape fields come from the vision and text configs (hidden sizes, heads, head_dim); the LM's fill
`ModelDescription`'s own fields (so a plan's model block reads like a causal LM's), and `analytic`
is False: the causal-LM engines do not plan it, `plan/vlm` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.models.hf_vlm import PARTS, Parts, _layer_lists, find_parts
from ampkit.models.vlm_images import ImageFamily
from ampkit.plan.describe.model import ModelDescription

TEXT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
VISION_WIDTH_KEYS = ("embed_dim", "hidden_size")  # Qwen2-VL's vision hidden_size is the LM's width
VISION_DEPTH_KEYS = ("depth", "num_hidden_layers")


@dataclass(frozen=True, kw_only=True)
class Stack:
    """One stack of transformer layers the activations come from (widths in elements)."""

    name: str
    layers: int
    width: int
    q_dim: int
    kv_dim: int
    ff: int
    heads: int
    gated: bool
    """a gated MLP (SwiGLU: gate, up, down) rather than fc1 -> act -> fc2"""
    rms_norm: bool
    windowed_layers: int = 0
    """layers that attend within windows of `window_tokens` (the rest attend to the whole pass)"""
    window_tokens: int = 0
    norms: int = 2
    """norms over the residual width per layer (Gemma's four: around attention and around the MLP)"""
    qk_norm: bool = False
    """the queries and keys are normalised per head (Gemma 3, Qwen3): two more norms, on q and k"""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True)
class MatmulGroups:
    """Matmul parameters (elements) by the tokens they multiply."""

    vision: int
    """per patch of every encoder pass (the patch embedding's conv included)"""
    projector_image: int
    """per image token (LLaVA's MLP, Idefics3's connector, Qwen2-VL's merger, ...)"""
    projector_cross: int
    """per cross-attention state (mllama's projector and its fusion layers' key/value projections)"""
    fusion_text: int
    """per language-model token inside the fusion layers (their queries, outputs, MLPs)"""
    language: int
    """per language-model token (self-attention layers, the head; a tied head counted here too)"""

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True)
class VLMDescription(ModelDescription):
    """An image-text model: the language model's shape in `ModelDescription`'s fields, the rest here."""

    model_type: str
    architecture: str
    total_parameters: int
    part_parameters: dict[str, int]
    """parameters per part (vision, projector, language; they sum to the total)"""
    part_tensors: dict[str, tuple[int, ...]]
    """elements of each distinct parameter tensor, per part (optimizer states are per tensor)"""
    part_layer_max: dict[str, int]
    """each part's largest repeated layer (parameters): FSDP gathers one at a time"""
    matmul: MatmulGroups
    vision: Stack
    language_stack: Stack
    fusion: Stack | None
    """mllama's cross-attention layers (None without them)"""
    projector_in_features: int = 0
    """elements per token the projector's matmuls read (each saves its input for backward)"""
    family_rule: ImageFamily | None = field(default=None, compare=False, repr=False)
    """the image-token rule (None: ampkit has none for this family; plans with --images-per-sample 0)"""
    analytic: bool = False
    """the causal-LM engines do not plan this model (`plan/vlm` does)"""

    def num_parameters(self) -> int:
        return self.total_parameters

    def matmul_parameters(self) -> int:
        m = self.matmul
        return m.vision + m.projector_image + m.projector_cross + m.fusion_text + m.language

    def parameter_tensors(self) -> list[int]:
        return [n for part in self.part_tensors.values() for n in part]

    def block_parameters(self) -> int:
        return max(self.part_layer_max.values(), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "kind": "image-text",
            "model_type": self.model_type,
            "architecture": self.architecture,
            "num_parameters": self.total_parameters,
            "parts": dict(self.part_parameters),
            "matmul_parameters": self.matmul.to_dict(),
            "vision": self.vision.to_dict(),
            "language": self.language_stack.to_dict(),
            "fusion": self.fusion.to_dict() if self.fusion else None,
            "vocab_size": self.vocab_size,
            "max_positions": self.max_positions,
            "tie_embeddings": self.tie_embeddings,
        }


def _int(config: Any, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def missing_fields(config: Any, data: dict[str, Any]) -> list[str]:
    """Shape fields the config.json leaves to transformers' class defaults (a model of a size nobody
    asked for): the text model's (in text_config, or at the top for Qwen2-VL's flat files) and the
    vision tower's width and depth."""
    nested = data.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else data
    missing = [f"text_config.{k}" for k in TEXT_KEYS if k not in text and k not in data]
    vision = data.get("vision_config")
    if not isinstance(vision, dict):
        return [*missing, "vision_config"]
    for keys in (VISION_WIDTH_KEYS, VISION_DEPTH_KEYS):
        if not any(k in vision for k in keys):
            missing.append(f"vision_config.{keys[-1]}")
    return missing


def _matmul_weights(model: nn.Module) -> dict[str, int]:
    """Elements of each matmul weight, by its module's name: Linear and conv weights, and a projector's
    own 2-D parameters (Gemma 3 multiplies by `mm_input_projection_weight`, a bare parameter)."""
    out: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) and module.weight is not None:
            out[name] = module.weight.numel()
        elif "projector" in name.rsplit(".", 1)[-1] and not isinstance(module, nn.Embedding):
            for pname, param in module.named_parameters(recurse=False):
                if param.dim() >= 2:
                    out[f"{name}.{pname}"] = param.numel()
    return out


def _matmul_groups(model: nn.Module, parts: Parts, *, cross: bool) -> MatmulGroups:
    owner = {name.rsplit(".", 1)[0]: part for name, part in parts.of_parameter.items() if name.endswith(".weight")}
    owner.update(parts.of_parameter)  # a bare parameter is its own "module" (`_matmul_weights`)
    fusion = _fusion_layer_names(model)
    groups = dict.fromkeys(("vision", "projector_image", "projector_cross", "fusion_text", "language"), 0)
    for name, n in _matmul_weights(model).items():
        part = owner.get(name)
        in_fusion = any(name.startswith(f + ".") for f in fusion)
        if part == "vision":
            groups["vision"] += n
        elif in_fusion:
            key = "projector_cross" if name.rsplit(".", 1)[-1] in ("k_proj", "v_proj") else "fusion_text"
            groups[key] += n
        elif part == "projector":
            groups["projector_cross" if cross else "projector_image"] += n
        elif part == "language":
            groups["language"] += n
    hf: Any = model
    head, embed = hf.get_output_embeddings(), hf.get_input_embeddings()
    if head is not None and embed is not None and head.weight is embed.weight:
        groups["language"] += head.weight.numel()  # a tied head still multiplies
    return MatmulGroups(**groups)


def _projector_inputs(model: nn.Module, parts: Parts) -> int:
    """Input widths of the projector's matmuls (fusion layers aside), summed: elements saved per token."""
    fusion = _fusion_layer_names(model)
    total = 0
    for name, module in model.named_modules():
        if any(name == f or name.startswith(f + ".") for f in fusion):
            continue
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) and parts.of_parameter.get(f"{name}.weight") == "projector":
            total += module.in_features
        elif "projector" in name.rsplit(".", 1)[-1] and not isinstance(module, nn.Embedding) and weight is None:
            total += sum(int(p.shape[0]) for p in module.parameters(recurse=False) if p.dim() == 2)
    return total


def _fusion_layer_names(model: nn.Module) -> list[str]:
    from ampkit.models.hf_vlm import _FUSION_LAYER

    return [name for name, m in model.named_modules() if name and _FUSION_LAYER.search(type(m).__name__)]


def _stack_layers(model: nn.Module, parts: Parts, part: str) -> list[nn.Module]:
    roots = parts.roots.get(part, ())
    names = {id(m): n for n, m in model.named_modules()}
    layers: list[nn.Module] = []
    for layer_list in _layer_lists(model):
        where = names.get(id(layer_list), "")
        if any(where == r or where.startswith(r + ".") for r in roots):
            layers.extend(layer_list)
    return layers


def _norms(layer: nn.Module | None) -> tuple[int, bool]:
    """(norms over the residual width, whether q and k have norms of their own) of one layer."""
    if layer is None:
        return 2, False
    names = [(n, m) for n, m in layer.named_modules() if "Norm" in type(m).__name__]
    qk = [n for n, _ in names if n.rsplit(".", 1)[-1] in ("q_norm", "k_norm", "q_layernorm", "k_layernorm")]
    return max(1, len(names) - len(qk)), bool(qk)


def _vision_stack(model: nn.Module, parts: Parts, vision: Any) -> Stack:
    layers = _stack_layers(model, parts, "vision")
    width = _int(vision, *VISION_WIDTH_KEYS)
    heads = _int(vision, "num_attention_heads", "attention_heads", "num_heads", default=1)
    mlp_ratio = getattr(vision, "mlp_ratio", None)
    ff = _int(vision, "intermediate_size", default=int(width * mlp_ratio) if mlp_ratio else 4 * width)
    first = layers[0] if layers else None
    names = [n for n, _ in first.named_modules()] if first is not None else []
    full = getattr(vision, "fullatt_block_indexes", None)
    window_px, patch = _int(vision, "window_size"), _int(vision, "patch_size", default=1)
    windowed = len(layers) - len(full) if full and window_px else 0
    return Stack(
        name="vision",
        layers=len(layers),
        width=width,
        q_dim=width,
        kv_dim=width,
        ff=ff,
        heads=heads,
        gated=any(n.endswith("gate_proj") for n in names),
        rms_norm=first is not None and any("RMSNorm" in type(m).__name__ for m in first.modules()),
        windowed_layers=windowed,
        window_tokens=(window_px // patch) ** 2 if windowed else 0,
        norms=_norms(first)[0],
    )


def _text_stack(text: Any, layers: int, name: str, first: nn.Module | None = None) -> Stack:
    d = _int(text, "hidden_size")
    heads = _int(text, "num_attention_heads", default=1)
    kv_heads = _int(text, "num_key_value_heads", default=heads)
    head_dim = _int(text, "head_dim", default=d // heads)
    return Stack(
        name=name,
        layers=layers,
        width=d,
        q_dim=heads * head_dim,
        kv_dim=kv_heads * head_dim,
        ff=_int(text, "intermediate_size", default=4 * d),
        heads=heads,
        gated=True,  # every language model of these families has a gated MLP (SwiGLU, GeGLU)
        rms_norm=True,
        norms=_norms(first)[0],
        qk_norm=_norms(first)[1],
    )


def _layer_max(model: nn.Module, parts: Parts) -> dict[str, int]:
    out = {}
    for part in PARTS:
        layers = _stack_layers(model, parts, part) if part != "projector" else []
        if part == "projector":
            names = set(_fusion_layer_names(model))
            layers = [m for n, m in model.named_modules() if n in names]
        out[part] = max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0)
    return out


def describe_vlm(config: Any, *, name: str, config_file: Path | str, family: ImageFamily | None) -> VLMDescription:
    """Build `config` (an image-text model's) on the meta device and describe it (module docstring)."""
    from ampkit.models.hf import build_from_config

    with torch.device("meta"):
        model = build_from_config(config, config_file)
    parts = find_parts(model)
    params = dict(model.named_parameters())
    tensors = {p: tuple(params[n].numel() for n, q in parts.of_parameter.items() if q == p) for p in PARTS}
    if "other" in parts.of_parameter.values():
        stray = [n for n, q in parts.of_parameter.items() if q == "other"]
        raise UsageError(f"{config_file}: cannot tell which part {stray[0]} belongs to (vision, projector, language)")
    text = config.get_text_config()
    fusion_layers = len(_fusion_layer_names(model))
    lm_layers = len(_stack_layers(model, parts, "language")) - fusion_layers  # fusion layers share its list
    hf: Any = model
    embed, head = hf.get_input_embeddings(), hf.get_output_embeddings()
    fusion_names = set(_fusion_layer_names(model))
    names = {id(m): n for n, m in model.named_modules()}
    lm_first = next((m for m in _stack_layers(model, parts, "language") if names.get(id(m)) not in fusion_names), None)
    language = _text_stack(text, lm_layers, "language", lm_first)
    return VLMDescription(
        name=name,
        family="llama",
        vocab_size=int(head.out_features if head is not None else embed.num_embeddings),
        d_model=language.width,
        n_layers=lm_layers + fusion_layers,
        n_heads=language.heads,
        n_kv_heads=language.kv_dim // max(1, language.q_dim // language.heads),
        head_dim=language.q_dim // language.heads,
        d_ff=language.ff,
        tie_embeddings=head is not None and embed is not None and head.weight is embed.weight,
        max_positions=_int(text, "max_position_embeddings"),
        source="config.json",
        model_type=str(config.model_type),
        architecture=type(model).__name__,
        total_parameters=sum(p.numel() for p in params.values()),
        part_parameters={p: sum(tensors[p]) for p in PARTS},
        part_tensors=tensors,
        part_layer_max=_layer_max(model, parts),
        matmul=_matmul_groups(model, parts, cross=fusion_layers > 0),
        vision=_vision_stack(model, parts, config.vision_config),
        language_stack=language,
        fusion=_text_stack(text, fusion_layers, "fusion") if fusion_layers else None,
        projector_in_features=_projector_inputs(model, parts),
        family_rule=family,
    )


def describe_vlm_file(config: Any, data: dict[str, Any], path: Path) -> VLMDescription:
    """A VLM's config.json (read by transformers as `config`, parsed as `data`), described; shape fields
    it leaves to transformers' defaults are refused, naming them."""
    from ampkit.models.vlm_images import FAMILIES, image_family

    missing = missing_fields(config, data)
    if missing:
        raise UsageError(f"{path}: {config.model_type} config is missing required field(s): {', '.join(missing)}")
    family = image_family(config, path.parent) if str(config.model_type) in FAMILIES else None
    return describe_vlm(config, name=str(path), config_file=path, family=family)
