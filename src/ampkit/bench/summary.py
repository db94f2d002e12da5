"""From the workers' raw results to `summary.json` (schema "ampkit.bench/2", documented in docs/bench.md).

Workers report raw facts (per-step seconds, tokens, losses, memory readings, the peak FLOP/s they
measured); everything derived -- statistics, MFU, ratios against fp32, fidelity, stability, the
recommendation -- is computed here, in the parent, from those facts.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from ampkit import __version__
from ampkit.bench.config import BenchConfig
from ampkit.bench.fidelity import compare_fidelity, loss_curve_gap
from ampkit.bench.recommend import Candidate, native_support, recommend
from ampkit.bench.timing import summarize_steps
from ampkit.precision import REFERENCE, get_spec

SCHEMA = "ampkit.bench/2"
SCHEMA_VERSION = 2  # 2: throughput as items_per_s in the task's "unit"; model.flops_per_item
MAX_SKIPPED_FRACTION = 0.25  # an fp16 run that skips more than this share of its steps is unstable
FINAL_LOSS_WINDOW = 5  # "loss after the run" is the mean of the last few step losses (one batch is noisy)


def assess_stability(result: dict[str, Any]) -> tuple[bool, str | None]:
    """Stable = no non-finite loss, no non-finite gradient applied, few skipped steps."""
    total = result["warmup_steps"] + result["measured_steps"]
    if result["nonfinite_loss_steps"]:
        return False, f"{result['nonfinite_loss_steps']} of {total} steps had a non-finite loss"
    applied = result["nonfinite_grad_steps"] - result["skipped_steps"]
    if applied > 0:
        return False, f"{applied} steps applied non-finite gradients"
    if result["skipped_steps"] > MAX_SKIPPED_FRACTION * total:
        return False, f"the loss scaler skipped {result['skipped_steps']} of {total} steps"
    return True, None


def _loss_block(curve: list[float]) -> dict[str, Any]:
    tail = curve[-FINAL_LOSS_WINDOW:]
    return {"first": curve[0], "final": sum(tail) / len(tail), "last": curve[-1], "curve": curve}


def _mfu_block(items_per_s: float, flops_per_item: float | None, peak: dict[str, Any]) -> dict[str, Any]:
    """MFU = items/s x training FLOPs per item / the peak FLOP/s of the precision's compute dtype."""
    value = items_per_s * flops_per_item / peak["peak_flops"] if peak["peak_flops"] and flops_per_item else None
    return {
        "value": value,
        "peak_flops": peak["peak_flops"],
        "peak_source": peak["source"],
        "peak_dtype": peak["dtype"],
    }


def precision_entry(result: dict[str, Any], *, info) -> dict[str, Any]:
    """One precision's block, without the parts measured against fp32 (added by `add_comparisons`)."""
    name = result["precision"]
    native, note = native_support(info, get_spec(name))
    entry: dict[str, Any] = {
        "name": name,
        "status": result["status"],
        "error": result.get("error"),
        "native": native,
        "native_note": note,
        "steps": None,
        "timing": None,
        "mfu": None,
        "memory": None,
        "loss": None,
        "stability": None,
        "vs_fp32": None,
        "fidelity": None,
        "files": result["files"],
    }
    if result["status"] != "ok":
        return entry
    stats = summarize_steps(result["step_s"], result["tokens"], result["slots"])
    stable, why = assess_stability(result)
    entry.update(
        steps={"warmup": result["warmup_steps"], "measured": stats.measured_steps, "stalled": stats.stalled_steps},
        timing={
            "items_per_s": stats.items_per_s,
            "items_per_s_all": stats.items_per_s_all,
            "measured_s": stats.measured_s,
            "step_ms_median": stats.step_ms_median,
            "step_ms_p10": stats.step_ms_p10,
            "step_ms_p90": stats.step_ms_p90,
            "step_ms_min": stats.step_ms_min,
            "step_ms_max": stats.step_ms_max,
            "step_ms": [1000.0 * s for s in result["step_s"]],
        },
        mfu=_mfu_block(stats.items_per_s, result.get("flops_per_item"), result["peak"]),
        memory=result["memory"],
        loss=_loss_block(result["loss_curve"]),
        stability={
            "stable": stable,
            "reason": why,
            "skipped_steps": result["skipped_steps"],
            "nonfinite_loss_steps": result["nonfinite_loss_steps"],
            "nonfinite_grad_steps": result["nonfinite_grad_steps"],
            "final_loss_scale": result["final_loss_scale"],
        },
    )
    return entry


def common_speedup(result: dict[str, Any], reference: dict[str, Any]) -> tuple[float, int]:
    """tokens/s ratio over the measured steps both ran -- the same batches, step for step -- so a
    precision that got fewer steps (a slow one, on a budget) is not compared on a different batch mix.
    Returns (speedup, steps compared)."""
    n = min(len(result["step_s"]), len(reference["step_s"]))
    mine = summarize_steps(result["step_s"][:n], result["tokens"][:n], result["slots"][:n])
    ref = summarize_steps(reference["step_s"][:n], reference["tokens"][:n], reference["slots"][:n])
    return mine.items_per_s / ref.items_per_s, n


def add_comparisons(
    entries: list[dict[str, Any]], results: list[dict[str, Any]], run_dir: Path, *, threshold: float
) -> None:
    """Speedup, memory ratio and fidelity of every measured precision against the fp32 entry."""
    pairs = [(e, r) for e, r in zip(entries, results) if e["status"] == "ok"]
    found = next(((e, r) for e, r in pairs if get_spec(e["name"]).is_reference), None)
    if found is None:
        return
    ref, ref_result = found
    ref_capture = _load_capture(run_dir, ref)
    for entry, result in pairs:
        speedup, steps = common_speedup(result, ref_result)
        entry["vs_fp32"] = {
            "speedup": speedup,
            "steps_compared": steps,
            "memory_ratio": entry["memory"]["peak_bytes"] / ref["memory"]["peak_bytes"],
        }
        capture = ref_capture if entry is ref else _load_capture(run_dir, entry)
        fidelity = compare_fidelity(ref_capture, capture, threshold=threshold).to_dict()
        fidelity["loss_curve"] = loss_curve_gap(ref["loss"]["curve"], entry["loss"]["curve"])
        entry["fidelity"] = fidelity


def _load_capture(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    return torch.load(run_dir / entry["files"]["fidelity"], weights_only=True)


def candidate_from(entry: dict[str, Any], reference_items_per_s: float | None) -> Candidate:
    """The recommendation's view of one summary entry. Its tokens/s is fp32's times the same-batch
    speedup, so every candidate is ranked on batches it shares with the reference."""
    if entry["status"] != "ok":
        return Candidate(
            name=entry["name"], ok=False, error=entry["error"], native=entry["native"], native_note=entry["native_note"]
        )
    fidelity = entry["fidelity"] or {}
    return Candidate(
        name=entry["name"],
        ok=True,
        stable=entry["stability"]["stable"],
        instability=entry["stability"]["reason"],
        items_per_s=_ranked_items_per_s(entry, reference_items_per_s),
        peak_bytes=entry["memory"]["peak_bytes"],
        logits_cosine=fidelity.get("logits_cosine"),
        fidelity_passed=bool(fidelity.get("passed")),
        native=entry["native"],
        native_note=entry["native_note"],
    )


def _ranked_items_per_s(entry: dict[str, Any], reference_items_per_s: float | None) -> float:
    if entry["vs_fp32"] is None or reference_items_per_s is None:
        return entry["timing"]["items_per_s"]
    return reference_items_per_s * entry["vs_fp32"]["speedup"]


def device_block(info) -> dict[str, Any]:
    return {
        "type": info.type,
        "name": info.name,
        "gpu_model": info.gpu_model,
        "compute_capability": list(info.compute_capability) if info.compute_capability else None,
        "total_memory_bytes": info.total_memory_bytes,
        "native_bf16": info.native_bf16,
        "native_fp16": info.native_fp16,
        "has_tf32": info.has_tf32,
        "has_fp8": info.has_fp8,
        "cpu_flags": sorted(info.cpu_flags),
        "cpu_threads": torch.get_num_threads(),
    }


def _flops(results: list[dict[str, Any]]) -> dict[str, Any]:
    """FLOPs per item as the reference worker (else the first that ran) counted them."""
    ok = [r for r in results if r.get("status") == "ok"]
    ok.sort(key=lambda r: not get_spec(r["precision"]).is_reference)
    first = ok[0] if ok else {}
    return {
        "flops_per_item": first.get("flops_per_item"),
        "flops_source": first.get("flops_source"),
        "measured_parameters": first.get("parameters"),
    }


FLOPS_FORMULAS = {
    "analytic": "the task's formula (language models: 6N + 12*layers*d_model*seq_len, PaLM; N = matmul parameters)",
    "measured": "torch.utils.flop_counter.FlopCounterMode over one forward and backward, per slot",
}


def build_summary(
    *,
    config: BenchConfig,
    info,
    task: dict[str, Any],
    results: list[dict[str, Any]],
    warnings: list[str],
    run_dir: Path,
    wall_s: float,
    host_load: dict[str, Any] | None = None,
) -> dict[str, Any]:
    entries = [precision_entry(r, info=info) for r in results]
    add_comparisons(entries, results, run_dir, threshold=config.fidelity_threshold)
    ref_ips = next(
        (e["timing"]["items_per_s"] for e in entries if get_spec(e["name"]).is_reference and e["timing"]), None
    )
    rec = recommend(
        [candidate_from(e, ref_ips) for e in entries],
        threshold=config.fidelity_threshold,
        tie_tolerance=config.tie_tolerance,
        capacity_bytes=info.total_memory_bytes,
        unit=task["unit"],
    )
    flops = _flops(results)
    summary = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "command": "bench",
        "ampkit_version": __version__,
        "torch_version": torch.__version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": wall_s,
        "config": config.to_dict(),
        "device": device_block(info),
        "host_load": host_load,
        "unit": task["unit"],
        "task": task,
        "model": {
            "preset": task["name"],
            "parameters": task.get("parameters") or flops.pop("measured_parameters"),
            **{k: v for k, v in flops.items() if k != "measured_parameters"},
            "flops_formula": FLOPS_FORMULAS.get(flops["flops_source"] or "", None),
        },
        "data": {
            "corpus": task.get("corpus"),
            "seq_len": task.get("seq_len"),
            "batch_size": config.batch_size,
        },
        "reference": REFERENCE,
        "warnings": warnings,
        "precisions": entries,
        "recommendation": rec.to_dict(),
    }
    return json_safe(summary)


def json_safe(value: Any) -> Any:
    """Non-finite floats become None (strict JSON has no NaN/Infinity); the counts say what happened."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
