"""A VLM plan's own tables: the model by part and the sample's images, and each part's share of the
step (GiB = 1024**3 bytes); the ledger and compute tables are every plan's (`plan/render/report.py`)."""

from __future__ import annotations

from typing import Any

from rich.console import Group

from ampkit.plan.setting import GIB
from ampkit.report.console import column_format, columns, compact_table, key_value_table

PART_COLUMNS = ("parameters", "gradients", "optimizer_states", "weight_copies", "activations")


def _stack(stack: dict[str, Any] | None) -> str:
    if not stack:
        return "-"
    mlp = "gated MLP" if stack["gated"] else "MLP"
    text = f"{stack['layers']} x {stack['width']}, {stack['heads']} heads, {mlp} {stack['ff']:,}"
    if stack.get("windowed_layers"):
        text += f", {stack['windowed_layers']} windowed ({stack['window_tokens']} tokens)"
    return text


def model_rows(model: dict[str, Any], workload: dict[str, Any]) -> list[tuple[str, str]]:
    parts = model["parts"]
    rows = [
        ("parameters (exact)", f"{model['num_parameters']:,}"),
        *((f"  {part}", f"{n:,}") for part, n in parts.items()),
        ("transformers class", f"{model['architecture']} ({model['model_type']})"),
        ("vision tower", _stack(model["vision"])),
        ("language model", _stack(model["language"])),
    ]
    if model.get("fusion"):
        rows.append(("fusion (cross-attention) layers", _stack(model["fusion"])))
    image = workload.get("image")
    if image:
        rows.append(
            (
                "images per sample",
                f"{workload['images_per_sample']} of {workload['image_size']} px: {image['tokens']:,} image tokens "
                f"each, {image['encoder_passes']} encoder pass(es) of {image['encoder_tokens']:,} patches",
            )
        )
        if image["cross_tokens"]:
            rows.append(("cross-attention states", f"{image['cross_tokens']:,} per image"))
    else:
        rows.append(("images per sample", "0 (text only)"))
    rows.append(
        (
            "trained parts",
            ", ".join(workload["trained_parts"])
            + (f" (frozen: {', '.join(workload['frozen'])})" if workload["frozen"] else ""),
        )
    )
    return rows


def vlm_model_table(summary: dict[str, Any]) -> Group:
    model = summary["model"]
    return key_value_table(f"Model: {model['name']} (image-text)", model_rows(model, summary["workload"]))


def part_headers() -> list[str]:
    return ["part", "precision", "trains", "weights", "grads", "optim", "copies", "activ"]


def part_rows(row: dict[str, Any]) -> list[list[str]]:
    parts = row["parts"]
    cells = [
        [p["part"] for p in parts],
        [p["precision"] for p in parts],
        ["yes" if p["trained"] else "frozen" for p in parts],
        *(column_format([p[key] / GIB for p in parts], decimals=2) for key in PART_COLUMNS),
    ]
    return [list(c) for c in zip(*cells)]


def parts_table(summary: dict[str, Any]) -> Group:
    """Each part's share of the first configuration's step (its gradients once all are made)."""
    row = summary["rows"][0]
    s = row["setting"]
    title = f"Parts, GiB: {s['precision']} / {s['optimizer']}, micro-batch {s['micro_batch']} x {s['seq_len']} tokens"
    notes = ["activ: what the forward keeps for backward; a frozen part with nothing trained before it keeps none"]
    return compact_table(title, columns(part_headers()), part_rows(row), notes=notes)
