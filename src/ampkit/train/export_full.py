"""A full fine-tune's weights for `train --export merged` (`ampkit.train.export`): an `hf:` run's model
rebuilt from its folder with the newest complete checkpoint's weights, each in the dtype it trained in.

The checkpoint is the run's own: single-file (one process: RUN_DIR/checkpoints/step-N.pt) or sharded
(DCP, RUN_DIR/checkpoints/step-N.dcp/, any world size: every rank's shards are read whole in this one
process, `ampkit.distributed.checkpoint.read_sharded_model`), verified against its manifest (checksums
and the run's identity) either way. The model is built as training built it (`build_hf_model`: the
folder's weights, or its config and the run's seed), then each parameter and buffer takes the saved
dtype (fp32 master weights for the *-mixed precisions, bf16 for bf16-true) and the saved values; a
tied weight stays tied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.distributed.checkpoint import list_sharded, read_sharded_model
from ampkit.errors import UsageError
from ampkit.models.hf import HFCausalLM, build_hf_model, is_hf_model
from ampkit.train.checkpoint import list_checkpoints, load_checkpoint
from ampkit.train.checkpointer import run_identity
from ampkit.train.config import TrainConfig, resume_config


def load_full_run(run_dir: Path, kind: str) -> tuple[TrainConfig, HFCausalLM, int]:
    """(config, the `hf:` model with the newest checkpoint's weights, its step), on CPU, for a run without
    LoRA; refuses, naming what can be exported, an adapter export and a model not from `hf:`."""
    config = resume_config(run_dir, {})
    spec = config.model.task or config.model.model
    if kind == "adapter":
        raise UsageError(
            f"{run_dir} is not a LoRA run (it trained every weight, without --lora): it has no adapter; "
            "export the whole model with --export merged"
        )
    if config.model.task or not is_hf_model(spec):
        raise UsageError(
            f"{run_dir} trained {spec!r}, not an hf:PATH model: there is no Hugging Face folder to write; "
            "--export takes a --lora run (merged or adapter, any model) or a full fine-tune of an hf: model "
            f"(merged); this run's weights are its checkpoints' 'model' state dict in {run_dir / 'checkpoints'}"
        )
    state, step = latest_model_state(run_dir, identity=run_identity(config))
    model = build_hf_model(spec, device="cpu", seed=config.seed)  # its shapes and config; the weights replaced
    load_trained_weights(model, state, spec=spec)
    model.eval()
    return config, model, step


def latest_model_state(run_dir: Path, *, identity: dict[str, Any]) -> tuple[dict[str, torch.Tensor], int]:
    """The newest complete checkpoint's model state dict, single-file or sharded, verified; and its step."""
    paths = [*list_checkpoints(run_dir), *list_sharded(run_dir)]
    found = [(int(p.name[len("step-") : len("step-") + 8]), p) for p in paths]  # step-NNNNNNNN.pt | .dcp
    if not found:
        raise UsageError(f"{run_dir} has no complete checkpoint to export; train it (or resume it) first")
    _, newest = max(found)
    if newest.suffix == ".dcp":
        return read_sharded_model(newest, identity=identity)
    ckpt = load_checkpoint(newest, identity=identity)
    return ckpt["model"], int(ckpt["step"])


@torch.no_grad()
def load_trained_weights(model: nn.Module, state: dict[str, torch.Tensor], *, spec: str) -> None:
    """`state` into `model`, each parameter and buffer first cast to the dtype it was saved in (so the copy
    is exact and the export keeps the training dtype); a tied weight is one parameter and stays tied."""
    try:
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            saved = state.get(name)
            if saved is not None and saved.dtype != tensor.dtype:
                tensor.data = tensor.data.to(saved.dtype)
        model.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:160]
        raise UsageError(
            f"the checkpoint does not fit --model {spec} as it is now ({first}); export with the model "
            "folder the run trained"
        ) from None
