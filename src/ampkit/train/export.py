"""`ampkit train --export merged|adapter RUN_DIR`: what a LoRA run trained, in formats other tools load.

The run's base is rebuilt exactly as training built it (its saved config: the task, the seed or the
`hf:PATH` weights, the base dtype, nf4 quantisation), its checksum checked against the newest
checkpoint's manifest, and the checkpoint's adapters loaded. Then:
- `adapter`: a peft adapter folder (`adapter_config.json` + `adapter_model.safetensors`, peft's key
  layout `base_model.model.<path>.lora_A.weight`), which `peft.PeftModel.from_pretrained(base, DIR)`
  loads onto the same base; `ampkit_base.json` says which base that is (model, seed, dtype, sha256).
- `merged`: every adapted layer's weight W + (alpha / rank) B A, computed in fp32 and stored in the
  base's dtype (an nf4 base is dequantised to the precision's compute dtype first), the adapters
  removed. An `hf:PATH` model is written with transformers' `save_pretrained` (config.json +
  model.safetensors, and the folder's tokenizer files), so `AutoModelForCausalLM.from_pretrained(DIR)`
  loads it; any other model as `model.safetensors` (safetensors' `save_model`: a tied weight once) and
  `config.json` (its description).
Written to `--out DIR` or RUN_DIR/export-KIND-step-N, never over an existing path.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.lora.apply import ADAPTER_NAME, LoraInfo, is_adapter, load_peft, peft_config
from ampkit.lora.build import build_lora_model
from ampkit.lora.nf4 import dequantize, is_4bit
from ampkit.lora.state import load_adapter_state
from ampkit.models.hf import HFCausalLM, hf_model_dir
from ampkit.runs import make_dir
from ampkit.tasks.load import build_task
from ampkit.train.checkpoint import list_checkpoints, load_checkpoint
from ampkit.train.checkpointer import lora_identity, run_identity
from ampkit.train.config import TrainConfig, resume_config

EXPORT_KINDS = ("merged", "adapter")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def load_lora_run(run_dir: Path) -> tuple[TrainConfig, nn.Module, LoraInfo, int]:
    """(config, adapted model with the newest checkpoint's adapters, what was adapted, its step), on CPU."""
    config = resume_config(run_dir, {})
    if not config.lora.enabled:
        raise UsageError(
            f"{run_dir} is not a LoRA run (it trained every weight, without --lora): its checkpoints hold the whole "
            "model already; --export merged|adapter exports what a --lora run trained"
        )
    paths = list_checkpoints(run_dir)
    if not paths:
        raise UsageError(f"{run_dir} has no complete checkpoint to export; train it (or resume it) first")
    task = build_task(config.task_spec())
    model, info = build_lora_model(
        task, config.lora, precision=config.precision, device=torch.device("cpu"), seed=config.seed
    )
    ckpt = load_checkpoint(paths[-1], identity=run_identity(config) | lora_identity(config, model))  # base checksum too
    load_adapter_state(model, ckpt["model"])
    model.eval()
    return config, model, info, int(ckpt["step"])


def export_run(run_dir: str | Path, kind: str, *, out: str | Path | None = None) -> Path:
    """Write the export (module docstring); returns its folder."""
    if kind not in EXPORT_KINDS:
        raise UsageError(f"unknown --export {kind!r}; choose one of: {', '.join(EXPORT_KINDS)}")
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not an ampkit train run (no config.json); pass a run directory to --export")
    config, model, info, step = load_lora_run(run_dir)
    target = Path(out) if out else run_dir / f"export-{kind}-step-{step:08d}"
    if target.exists():
        raise UsageError(f"{target} already exists; exports never overwrite: pass --out NEW_DIR or remove it")
    make_dir(target)
    if kind == "adapter":
        write_adapter(model, info, config, target)
    else:
        write_merged(model, config, target)
    return target


def _export_root(model: nn.Module) -> tuple[nn.Module, str]:
    """The module an outside tool loads (transformers' model inside `HFCausalLM`) and its path prefix."""
    return (model.hf, "hf.") if isinstance(model, HFCausalLM) else (model, "")


def base_description(config: TrainConfig) -> dict[str, Any]:
    spec = config.model.task or config.model.model
    return {
        "model": spec,
        "seed": config.seed,
        "precision": config.precision,
        "base_dtype": config.lora.resolved_base_dtype(config.precision),
    }


def write_adapter(model: nn.Module, info: LoraInfo, config: TrainConfig, target: Path) -> None:
    """peft's adapter folder for `model`'s adapters (keys and config as `PeftModel.save_pretrained` writes)."""
    from safetensors.torch import save_file

    load_peft()
    root, prefix = _export_root(model)
    lora_config = peft_config(config.lora, [p.removeprefix(prefix) for p in info.targets.paths])
    spec = config.model.task or config.model.model
    lora_config.base_model_name_or_path = (
        str(hf_model_dir(config.model.model).resolve()) if isinstance(model, HFCausalLM) else spec
    )
    lora_config.save_pretrained(str(target))
    marker = f".{ADAPTER_NAME}."
    state = {
        "base_model.model." + name.replace(marker, "."): value.detach().contiguous().cpu()
        for name, value in root.state_dict().items()
        if is_adapter(name)
    }
    save_file(state, str(target / "adapter_model.safetensors"), metadata={"format": "pt"})
    _write_json(target / "ampkit_base.json", base_description(config) | {"trainable_parameters": info.trainable})


@torch.no_grad()
def merge_adapters(model: nn.Module) -> int:
    """Fold every LoRA layer into its base in place (W + delta in fp32, stored in the base's dtype; a 4-bit
    base dequantised to its compute dtype); the peft layers are replaced by plain ones. Returns how many."""
    from peft.tuners.lora import LoraLayer

    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]
    for name, lora_layer in layers:
        layer: Any = lora_layer  # peft's lora.Linear (or Embedding, Conv): get_delta_weight is theirs
        base: Any = layer.get_base_layer()
        if is_4bit(base):
            weight = dequantize(base)
            plain = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, dtype=weight.dtype)
            plain.weight.copy_(weight)
            if base.bias is not None:
                plain.bias.copy_(base.bias)
            base = plain
        delta = layer.get_delta_weight(ADAPTER_NAME).float()
        base.weight.copy_((base.weight.float() + delta).to(base.weight.dtype))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, base)
    return len(layers)


def write_merged(model: nn.Module, config: TrainConfig, target: Path) -> None:
    merge_adapters(model)
    root, _ = _export_root(model)
    if isinstance(model, HFCausalLM):
        source = hf_model_dir(config.model.model)
        hf: Any = root  # transformers' PreTrainedModel
        hf.config.use_cache = True  # HFCausalLM turned the cache off for training; an inference load wants it
        with _quiet_transformers():
            hf.save_pretrained(str(target), safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, target / name)
        return
    from safetensors.torch import save_model

    save_model(root, str(target / "model.safetensors"), metadata={"format": "pt"})
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in root.parameters()})
    _write_json(
        target / "config.json",
        {"ampkit_model": _model_config(root), "dtypes": dtypes, "base": base_description(config)},
    )


def _model_config(model: nn.Module) -> dict[str, Any]:
    cfg = getattr(model, "config", None)
    to_dict = getattr(cfg, "to_dict", None)
    return to_dict() if callable(to_dict) else {"class": type(model).__name__}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No "Writing model shards" progress bar on the console."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
