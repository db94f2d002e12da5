"""bench's recommendation made actionable: the `ampkit train` command (or the Python API call) of the
recommended candidate, with the largest micro-batch the planner fits on this device and the throughput
measured here (`train_command`, the recommendation's `train` block)."""

from __future__ import annotations

from typing import Any

from ampkit.bench.candidates import candidate_overrides, split_candidate
from ampkit.bench.config import BenchConfig
from ampkit.bench.parallel import train_flags
from ampkit.lora import LoraSettings


def _lora_settings(settings: LoraSettings) -> dict[str, Any]:
    """The `[lora]` settings a LoRA run was given ({} for full fine-tuning): the rank, and every other
    setting of the section that differs from its default."""
    import dataclasses  # here, beside its one use: keeps this module's imports as they were

    if not settings.enabled:
        return {}
    defaults = type(settings)(lora=settings.lora)  # the section's defaults at this rank
    return {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name == "lora" or getattr(settings, f.name) != getattr(defaults, f.name)
    }


def _flag_value(value: Any) -> str:
    import shlex

    return shlex.quote(str(value))


def train_command(config: BenchConfig, task: dict[str, Any], entry: dict[str, Any], fit: dict[str, Any]) -> dict:
    """The recommendation made actionable: `ampkit train` with this precision and the largest micro-batch
    the planner fits on this device, and the throughput measured here."""
    found = fit.get("batch_size")
    batch = found if found else config.data.batch_size
    rows = task.get("train_samples")  # a batch beyond the training set only repeats it
    capped = bool(found and isinstance(rows, int) and 0 < rows < found)
    batch = rows if capped else batch
    name, optimizer = split_candidate(entry["name"])
    model, data = config.model, config.data
    images = (f" --image-size {model.image_size}" if model.image_size else "") + (
        f" --freeze {model.freeze}" if model.freeze else ""
    )
    if model.task:  # a built-in image task (vlm) takes the image flags too
        many = f" --images-per-sample {model.images_per_sample}" if model.images_per_sample != 1 else ""
        head = f"ampkit train --task {model.task}" + (many + images if task.get("kind") == "image-text" else "")
    elif task.get("seq_len") is not None:  # the language model
        corpus = f" --data {data.data}" if data.data != "default" else ""
        head = f"ampkit train --model {model.model}{corpus} --seq-len {data.seq_len}"
    elif task.get("kind") == "image-text" and model.model.startswith("hf:"):  # an hf: VLM on its captioned images
        head = f"ampkit train --model {model.model} --images-per-sample {model.images_per_sample}" + images
    else:  # a task object of the Python API
        head = None
    lora = _lora_settings(config.lora)  # a LoRA bench recommends a LoRA run, with its settings
    if head:
        command = (
            f"{head} --precision {name}" + (f" --optimizer {optimizer}" if optimizer else "") + f" --batch-size {batch}"
        )
        command += _override_flags(config, entry["name"]) + train_flags(config.parallel, entry["name"])
        command += "".join(f" --{key.replace('_', '-')} {_flag_value(value)}" for key, value in lora.items())
    else:
        extra = f", optimizer={optimizer!r}" if optimizer else ""
        settings = "".join(f", {key}={value!r}" for key, value in lora.items())
        extra += "".join(f", {key}={value!r}" for key, value in _override_settings(config, entry["name"]).items())
        command = f"ampkit.train.run(task, precision={name!r}{extra}, batch_size={batch}{settings})"
    return {
        "command": command,
        "batch_size": batch,
        "batch_source": fit.get("source") if found else None,
        "batch_note": (f"capped at its {rows:,} training samples (the planner fits {found:,})" if capped else None)
        if found
        else (fit.get("note") or "the planner found no batch that fits"),
        "capacity_bytes": fit.get("capacity_bytes"),
        "capacity_label": fit.get("capacity_label"),
        "expected_items_per_s": entry["timing"]["items_per_s"] if entry.get("timing") else None,
        "measured_batch_size": entry["budget"]["batch_size"],
    }


def _override_settings(config: BenchConfig, name: str) -> dict[str, str]:
    """train's settings for a candidate's module overrides ('bf16-mixed@vision=fp32') and --keep-fp32."""
    out = {"module_precision": str(candidate_overrides(name)), "keep_fp32": config.keep_fp32}
    return {k: v for k, v in out.items() if v}


def _override_flags(config: BenchConfig, name: str) -> str:
    return "".join(f" --{k.replace('_', '-')} {_flag_value(v)}" for k, v in _override_settings(config, name).items())
