"""Any transformers causal LM, described exactly: built on the meta device from its config.json.

`AutoModelForCausalLM.from_config` under `torch.device("meta")` allocates nothing (a 70B model in
well under a second), so the counts come from the modules transformers itself builds, whatever the
architecture:
- total parameters: distinct tensors (a tied head counted once), equal to transformers'
  `num_parameters()`;
- mixture of experts: the experts are the parameters of modules named `experts` (transformers 5
  fuses them into (experts, ...) tensors; older layouts hold one module per expert), and a token
  runs `experts_per_token` of them (the config's `num_experts_per_tok`, or its other spellings):
  active parameters = total - expert parameters x (1 - experts_per_token / experts); shared experts
  and routers are always active;
- matmul parameters (the N of 6N, FLOPs per token): the active parameters less the lookup tables
  (token and learned-position embeddings), plus the head when it is tied (it still multiplies);
- the decoder layers' pattern (`plan/describe/layers.py`): identical layers, or how they differ.

For the model types the analytic engine knows (llama, mistral, qwen2, gpt2, opt), the formula
description (`model.py`) gives the shape fields and this module checks its count against the
meta model's; for every other type the shape fields are read from the config (hidden size, heads,
head dim, ...) and only the traced engine plans it (`HFDescription.analytic` is False).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.plan.describe.layers import LayerPattern, find_pattern, layer_signatures
from ampkit.plan.describe.model import ModelDescription

EXPERTS_PER_TOKEN_KEYS = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "experts_per_token",
    "moe_topk",
    "num_selected_experts",
    "moe_k",
    "top_k",
)
_EXPERT_MODULE = re.compile(r"(^|\.)experts$")


@dataclass(frozen=True, kw_only=True)
class HFCounts:
    """Exact counts of a transformers model's parameters (elements)."""

    total: int
    active: int
    """per token: total less the experts a token does not run (equal to total without experts)"""
    matmul: int
    """active parameters that multiply in a forward pass (the N of 6N)"""
    embedding: int
    """lookup tables: token and learned-position embeddings"""
    tensors: tuple[int, ...]
    """element count of every distinct parameter tensor"""
    layer_parameters: tuple[int, ...]
    """parameters of each decoder layer"""
    experts: int = 0
    """experts per MoE layer (0: a dense model)"""
    experts_per_token: int = 0
    expert_parameters: int = 0
    """parameters inside the experts (all of them, over every layer)"""

    def to_dict(self) -> dict[str, int]:
        """The counts as summary.json's model block names them (`total` is num_parameters, `active`
        active_parameters, ...; the expert fields keep their names)."""
        renamed = {"total": "num_parameters", **{f: f"{f}_parameters" for f in ("active", "matmul", "embedding")}}
        names = ("total", "active", "matmul", "embedding", "experts", "experts_per_token", "expert_parameters")
        return {renamed.get(f, f): getattr(self, f) for f in names}


def _distinct(params) -> dict[int, nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for p in params:
        seen.setdefault(id(p), p)
    return seen


def experts_per_token(config: Any) -> int | None:
    for key in EXPERTS_PER_TOKEN_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _expert_groups(model: nn.Module) -> list[tuple[int, int]]:
    """(experts, parameters) of each module named `experts` (not `shared_experts`)."""
    groups = []
    for name, module in model.named_modules():
        if not _EXPERT_MODULE.search(name):
            continue
        own = list(module.parameters(recurse=False))
        fused = [p for p in own if p.dim() >= 3]
        if fused:  # transformers 5: (experts, out, in) tensors (their biases are (experts, out))
            n = int(fused[0].shape[0])
            groups.append((n, sum(p.numel() for p in own if p.dim() >= 2 and p.shape[0] == n)))
        elif isinstance(module, nn.ModuleList) and len(module):  # one module per expert
            groups.append((len(module), sum(p.numel() for p in _distinct(module.parameters()).values())))
    return groups


def count_parameters(model: nn.Module, config: Any, layers: nn.ModuleList | None) -> HFCounts:
    """Count a (meta-device) transformers model: totals, experts, lookups, per layer."""
    params = _distinct(model.parameters())
    lookup = _distinct(p for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    hf: Any = model
    head, embed = hf.get_output_embeddings(), hf.get_input_embeddings()
    tied_head = head.weight.numel() if head is not None and embed is not None and head.weight is embed.weight else 0
    total = sum(p.numel() for p in params.values())
    groups = _expert_groups(model)
    k = experts_per_token(config) if groups else None
    expert_params = sum(n for _, n in groups)
    inactive = sum(n * (1 - k / e) for e, n in groups) if k else 0.0
    active = total - round(inactive)
    embedding = sum(p.numel() for p in lookup.values())
    return HFCounts(
        total=total,
        active=active,
        matmul=active - embedding + tied_head,
        embedding=embedding,
        tensors=tuple(p.numel() for p in params.values()),
        layer_parameters=tuple(
            sum(p.numel() for p in _distinct(layer.parameters()).values()) for layer in layers or []
        ),
        experts=max((e for e, _ in groups), default=0),
        experts_per_token=k or 0,
        expert_parameters=expert_params,
    )


@dataclass(frozen=True, kw_only=True)
class HFDescription(ModelDescription):
    """A `ModelDescription` whose counts are transformers' own modules' (any architecture)."""

    model_type: str
    architecture: str
    counts: HFCounts
    pattern: LayerPattern
    analytic: bool
    """the analytic engine replays this shape (the llama, gpt2 and opt families, counts checked)"""
    hf_config: Any = field(default=None, compare=False, repr=False)
    """transformers' config object (the traced engine builds copies of fewer layers from it)"""
    signatures: tuple = field(default=(), compare=False, repr=False)
    """each decoder layer's signature (`plan/describe/layers.py`), to check the shallow copies"""
    notes: tuple[str, ...] = ()

    def num_parameters(self) -> int:
        return self.counts.total

    def active_parameters(self) -> int:
        return self.counts.active

    def matmul_parameters(self) -> int:
        return self.counts.matmul

    def parameter_tensors(self) -> list[int]:
        return list(self.counts.tensors)

    def block_parameters(self) -> int:
        """The largest decoder layer's parameters (FSDP gathers one layer at a time)."""
        return max(self.counts.layer_parameters, default=0)

    def layers_parameters(self) -> int:
        """Every decoder layer's parameters, summed (layers may differ: dense and MoE, sliding and global)."""
        return sum(self.counts.layer_parameters)

    def to_dict(self) -> dict[str, Any]:
        skip = {"model_config", "hf_config", "signatures", "counts", "pattern"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out.update(
            self.counts.to_dict(), buildable=self.buildable, layers=self.pattern.to_dict(), notes=list(self.notes)
        )
        return out


def read_config(path: Path):
    """transformers' config from a config.json file (offline, no remote code)."""
    from ampkit.models.hf import read_config_file

    return read_config_file(path)


def meta_model(config, config_file: Path | str, *, dtype: torch.dtype | None = None) -> nn.Module:
    """The causal LM on the meta device (no memory); an unbuildable config is a one-line UsageError."""
    from ampkit.models.hf import build_from_config

    with torch.device("meta"):
        return build_from_config(config, config_file, dtype=dtype)


def _int(config: Any, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _shape_fields(config: Any, model: nn.Module) -> dict[str, Any]:
    """ModelDescription's shape fields read from any transformers config (the traced engine's case)."""
    d = _int(config, "hidden_size", "n_embd", "d_model")
    heads = _int(config, "num_attention_heads", "n_head", default=1)
    hf: Any = model
    embed, head = hf.get_input_embeddings(), hf.get_output_embeddings()
    positions = [
        m.num_embeddings
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding) and m is not embed and re.search(r"pos|wpe", name)
    ]
    return {
        "family": str(config.model_type),
        "vocab_size": _int(config, "vocab_size"),
        "d_model": d,
        "n_layers": _int(config, "num_hidden_layers", "n_layer"),
        "n_heads": heads,
        "n_kv_heads": _int(config, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads),
        "head_dim": _int(config, "head_dim", default=d // heads if heads else 0),
        "d_ff": _int(config, "intermediate_size", "moe_intermediate_size", "n_inner", "ffn_dim", default=4 * d),
        "tie_embeddings": head is not None and embed is not None and head.weight is embed.weight,
        "position_rows": sum(positions),
    }


def describe_hf_config(
    config, *, name: str, config_file: Path | str, formula: ModelDescription | None
) -> HFDescription:
    """Build `config` on the meta device and describe it; `formula` is the analytic family's
    description of the same config when there is one (its count is checked against the model's)."""
    from ampkit.models.hf import decoder_layers

    model = meta_model(config, config_file)
    layers = decoder_layers(model)
    counts = count_parameters(model, config, layers)
    signatures = layer_signatures(layers or [], config)
    pattern = find_pattern(signatures) if signatures else LayerPattern(n_layers=0, found=False)
    notes: list[str] = []
    if counts.experts and not counts.experts_per_token:
        notes.append(
            f"the config names no experts per token ({', '.join(EXPERTS_PER_TOKEN_KEYS[:2])}): "
            "every expert is counted as active"
        )
    analytic = formula is not None and formula.num_parameters() == counts.total and not counts.experts
    if formula is not None and not analytic:
        notes.append(
            f"the {formula.family} formula counts {formula.num_parameters():,} parameters but transformers "
            f"builds {counts.total:,}: planned by the traced engine only"
        )
    base = {f.name: getattr(formula, f.name) for f in fields(ModelDescription)} if analytic and formula else {}
    if not base:
        max_len = _int(config, "max_position_embeddings", "n_positions", "max_sequence_length")
        base = {**_shape_fields(config, model), "max_positions": max_len, "model_config": None}
    base.update(name=name, source="config.json")
    return HFDescription(
        **base,
        model_type=str(config.model_type),
        architecture=type(model).__name__,
        counts=counts,
        pattern=pattern,
        analytic=analytic,
        hf_config=config,
        signatures=tuple(signatures),
        notes=tuple(notes),
    )


def has_analytic(desc: ModelDescription) -> bool:
    """Whether the analytic engine replays this model (every preset; HF configs of its families)."""
    return bool(getattr(desc, "analytic", True))


FORMULA_TYPES = ("llama", "mistral", "qwen2", "gpt2", "opt")
"""model types `model.py` has formulas for (the analytic engine's families)"""
SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def defaulted_fields(config: Any, data: dict[str, Any]) -> list[str]:
    """Shape fields config.json leaves out, which transformers fills with its class defaults."""
    aliases = getattr(config, "attribute_map", {})  # hidden_size -> n_embd, ...
    return [key for key in SHAPE_KEYS if hasattr(config, key) and key not in data and aliases.get(key) not in data]


def transformers_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def describe_config_file(path: Path, data: dict[str, Any], *, vocab_size: int | None = None) -> ModelDescription:
    """A config.json as transformers builds it (any architecture), the formula description attached
    where an analytic family applies. Without transformers (or with a vocabulary override) the
    formula description alone, as before."""
    from ampkit.plan.describe.model import describe_config

    formula: ModelDescription | None = None
    refusal: UsageError | None = None
    try:
        formula = describe_config(data, name=str(path), vocab_size=vocab_size)
    except UsageError as err:
        refusal = err
    if vocab_size is not None or not transformers_installed():
        if formula is None:
            assert refusal is not None, "describe_config either describes or refuses"
            raise UsageError(f"{refusal} (with transformers installed, pip install 'ampkit[hf]', any type plans)")
        return formula
    config = read_config(path)
    from ampkit.models.hf import IMAGE_TEXT, check_kind

    if check_kind(config, path) == IMAGE_TEXT:  # a VLM: its parts and images (plan/describe/vlm.py)
        from ampkit.plan.describe.vlm import describe_vlm_file

        return describe_vlm_file(config, data, path)
    missing = defaulted_fields(config, data)
    if missing:  # transformers would fill in its class defaults: a model of a size nobody asked for
        if refusal is not None and config.model_type in FORMULA_TYPES:
            raise refusal  # the family's own field names (n_embd, n_layer, ... for gpt2)
        raise UsageError(f"{path}: {config.model_type} config is missing required field(s): {', '.join(missing)}")
    return describe_hf_config(config, name=str(path), config_file=path, formula=formula)
