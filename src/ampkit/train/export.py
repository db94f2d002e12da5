"""`ampkit train --export merged|adapter RUN_DIR`: what a run trained, in formats other tools load.

A LoRA run: its base is rebuilt exactly as training built it (its saved config: the task, the seed
or the `hf:PATH` weights, the base dtype, nf4 quantisation), its checksum checked against the newest
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
A full fine-tune (no `--lora`) of an `hf:PATH` model exports `merged` only: the newest complete
checkpoint, single-file or sharded (DCP), in the dtypes it trained in (`ampkit.train.export_full`),
written with `save_pretrained` as above. `--export-dtype fp32|bf16|fp16` casts a merged model's
floating-point weights before it is written.
Written to `--out DIR` or RUN_DIR/export-KIND-step-N through a temporary sibling folder renamed into
place (a crash leaves no half export); an existing non-empty folder is refused unless
`--export-overwrite` is given, and never one that holds the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import dtype_of
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
from ampkit.train.export_full import load_full_run

EXPORT_KINDS = ("merged", "adapter")
EXPORT_DTYPES = ("fp32", "bf16", "fp16")  # --export-dtype: a merged model's floating-point weights
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",  # sentencepiece
    "added_tokens.json",
    "chat_template.jinja",
)


def load_lora_run(run_dir: Path) -> tuple[TrainConfig, nn.Module, LoraInfo, int]:
    """(config, adapted model with the newest checkpoint's adapters, what was adapted, its step), on CPU."""
    config = resume_config(run_dir, {})
    if not config.lora.enabled:
        raise UsageError(f"{run_dir} is not a LoRA run (it trained every weight, without --lora)")
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


def export_run(
    run_dir: str | Path,
    kind: str,
    *,
    out: str | Path | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the export (module docstring); returns its folder. `dtype`: a merged model's (None: as
    trained); `overwrite`: replace an existing non-empty `out` folder."""
    if kind not in EXPORT_KINDS:
        raise UsageError(f"unknown --export {kind!r}; choose one of: {', '.join(EXPORT_KINDS)}")
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise UsageError(f"unknown --export-dtype {dtype!r}; choose one of: {', '.join(EXPORT_DTYPES)}")
    if dtype is not None and kind == "adapter":
        raise UsageError("--export-dtype sets a merged model's dtype; an adapter folder keeps its fp32 adapters")
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not an ampkit train run (no config.json); pass a run directory to --export")
    info = None
    if resume_config(run_dir, {}).lora.enabled:
        config, model, info, step = load_lora_run(run_dir)
    else:
        config, model, step = load_full_run(run_dir, kind)
    target = Path(out) if out else run_dir / f"export-{kind}-step-{step:08d}"
    _check_target(target, run_dir, overwrite=overwrite)

    def write(folder: Path) -> None:
        if info is not None and kind == "adapter":
            write_adapter(model, info, config, folder)
        else:
            write_merged(model, config, folder, dtype=None if dtype is None else dtype_of(dtype, flag="--export-dtype"))

    _publish(target, write)
    return target


def _check_target(target: Path, run_dir: Path, *, overwrite: bool) -> None:
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is a file; pass --out NEW_DIR")
    if not (target.is_dir() and any(target.iterdir())):
        return  # new, or an empty folder
    if not overwrite:
        raise UsageError(
            f"{target} already exists and is not empty; exports never overwrite unless asked: pass "
            "--out NEW_DIR, or --export-overwrite to replace it"
        )
    held = run_dir.resolve()
    if target.resolve() == held or target.resolve() in held.parents:
        raise UsageError(f"--out {target} holds the run {run_dir}; --export-overwrite would delete it")


def _publish(target: Path, write: Callable[[Path], None]) -> None:
    """`write(folder)` into a temporary sibling, then renamed to `target`; an existing `target` (empty, or
    replaced on request) is moved aside first and removed once the new one is in place."""
    tmp, old = target.with_name(f".{target.name}.tmp"), target.with_name(f".{target.name}.old")
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    make_dir(tmp)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


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


def write_merged(model: nn.Module, config: TrainConfig, target: Path, *, dtype: torch.dtype | None = None) -> None:
    """The model with its adapters folded in (a full fine-tune's: as it is), its floating-point weights cast
    to `dtype` when given: an `hf:` model as a Hugging Face folder, any other as safetensors + description."""
    merge_adapters(model)
    root, _ = _export_root(model)
    if dtype is not None:
        root.to(dtype)  # floating-point parameters and buffers only
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
