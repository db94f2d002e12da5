"""Which modules get adapters: `--lora-targets` patterns resolved against a model, or the model
family's default.

Patterns are comma-separated. A plain name matches a module whose path is that name or ends with
".name" (peft's own rule: `q_proj`, `attn.q_proj`); a pattern with `*`, `?` or `[` is a glob over the
whole module path (`blocks.*.attn.*`). Every pattern must match at least one module, and every match
must be a layer LoRA can adapt (a Linear, an Embedding, a convolution): a typo or a whole block is
refused with the names that would work.

Defaults, by model family:
- a Llama-style decoder (ampkit's built-in LM, HF llama/mistral/qwen2 ... via `hf:PATH`): the attention
  and MLP projections q/k/v/o_proj, gate/up/down_proj (the QLoRA paper's choice: every block Linear);
- another `hf:PATH` model: peft's own default for its model type (gpt2: c_attn), else every Linear
  but the output head;
- any other task's model: every nn.Linear.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from torch import nn

from ampkit.errors import UsageError

LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTABLE = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""torch layer types peft's LoRA adapts (transformers' Conv1D too, recognised by name)."""
_GLOB = set("*?[")


@dataclass(frozen=True)
class Targets:
    """The resolved targets: module paths, and where they came from."""

    paths: list[str]
    source: str
    """"--lora-targets ..." or the default's family ("llama projections", "peft's gpt2 default", ...)"""

    def names(self) -> list[str]:
        """The distinct last components (q_proj, ...), in first-seen order."""
        return list(dict.fromkeys(p.rsplit(".", 1)[-1] for p in self.paths))


def adaptable(module: nn.Module) -> bool:
    return isinstance(module, ADAPTABLE) or type(module).__name__ == "Conv1D"


def linear_paths(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def _output_head(model: nn.Module) -> set[str]:
    """Paths of the module(s) that produce the logits (kept out of the every-Linear default of HF models)."""
    hf = getattr(model, "hf", None)
    head = hf.get_output_embeddings() if hf is not None and hasattr(hf, "get_output_embeddings") else None
    return {name for name, module in model.named_modules() if head is not None and module is head}


def _hf_model_type(model: nn.Module) -> str | None:
    hf = getattr(model, "hf", None)
    config = getattr(hf, "config", None)
    return getattr(config, "model_type", None)


def default_targets(model: nn.Module) -> Targets:
    """The family default (module docstring)."""
    linears = linear_paths(model)
    llama = [p for p in linears if p.rsplit(".", 1)[-1] in LLAMA_PROJECTIONS]
    if llama:
        return Targets(llama, "llama projections (" + ", ".join(n for n in LLAMA_PROJECTIONS if _has(llama, n)) + ")")
    model_type = _hf_model_type(model)
    if model_type is not None:
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

        names = PEFT_DEFAULTS.get(model_type)
        if names:
            return Targets(match(model, list(names)), f"peft's {model_type} default ({', '.join(names)})")
        head = _output_head(model)
        return Targets([p for p in linears if p not in head], "every nn.Linear but the output head")
    return Targets(linears, "every nn.Linear")


def _has(paths: list[str], name: str) -> bool:
    return any(p.rsplit(".", 1)[-1] == name for p in paths)


def _matches(path: str, pattern: str) -> bool:
    if _GLOB & set(pattern):
        return fnmatch.fnmatchcase(path, pattern)
    return path == pattern or path.endswith("." + pattern)


def match(model: nn.Module, patterns: list[str]) -> list[str]:
    """Module paths matching any of `patterns`, in model order; refuses a pattern matching nothing, or a
    module LoRA cannot adapt (UsageError with names that would work)."""
    modules = dict(model.named_modules())
    found: list[str] = []
    for pattern in patterns:
        hits = [path for path in modules if path and _matches(path, pattern)]
        if not hits:
            raise UsageError(
                f"--lora-targets pattern {pattern!r} matches no module of {type(model).__name__}; "
                f"its Linear layers are named like: {_examples(model)}"
            )
        wrong = [path for path in hits if not adaptable(modules[path])]
        if wrong:
            raise UsageError(
                f"--lora-targets pattern {pattern!r} matches {wrong[0]} ({type(modules[wrong[0]]).__name__}), which "
                f"LoRA cannot adapt: name its Linear layers instead, e.g. {_examples(model)}"
            )
        found += [path for path in hits if path not in found]
    order = {path: i for i, path in enumerate(modules)}
    return sorted(found, key=order.__getitem__)


def _examples(model: nn.Module, limit: int = 8) -> str:
    names = list(dict.fromkeys(p.rsplit(".", 1)[-1] for p in linear_paths(model)))
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "") if names else "(it has none)"


def resolve_targets(model: nn.Module, patterns: list[str]) -> Targets:
    """`--lora-targets` patterns resolved (or the family default when there are none)."""
    if not patterns:
        targets = default_targets(model)
        if not targets.paths:
            raise UsageError(
                f"{type(model).__name__} has no nn.Linear layer for LoRA to adapt; name layers with --lora-targets"
            )
        return targets
    return Targets(match(model, patterns), "--lora-targets " + ",".join(patterns))
