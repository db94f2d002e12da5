"""From the workers' raw results to `summary.json` (schema "ampkit.bench/2", documented in docs/bench.md).

Workers report raw facts (per-step seconds, tokens, losses, memory readings, the peak FLOP/s they
measured); everything derived -- statistics, MFU, ratios against fp32, fidelity, stability, the
recommendation -- is computed here, in the parent, from those facts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ampkit.bench.budget import amdahl_speedup
from ampkit.bench.candidates import candidate_spec
from ampkit.bench.config import BenchConfig
from ampkit.bench.fidelity import FIDELITY_ROWS, compare_fidelity, fidelity_file, loss_curve_gap
from ampkit.bench.gate import add_gate, gate_block
from ampkit.bench.parallel import parallel_block
from ampkit.bench.peaks import matmul_ratio, mfu_denominator, mfu_value
from ampkit.bench.profile import CATEGORIES
from ampkit.bench.ratios import matched_speedup, profile_ratios
from ampkit.bench.recommend import Candidate, conv_tf32_advice, native_support, recommend
from ampkit.bench.rules import seed_rules
from ampkit.bench.timing import StepStats, summarize_steps
from ampkit.bench.train_command import train_command
from ampkit.precision import REFERENCE
from ampkit.provenance import summary_header

if TYPE_CHECKING:
    from ampkit.hardware import DeviceInfo

PredictPeak = Callable[[str, int, int | None], dict[str, Any]]
"""`predict(precision, batch_size, seq_len) -> {"bytes", "source", "note"}`: the planner's step peak
(`bench.memory_check.predict_step_peak`; seq_len None: the config's)."""
FitBatch = Callable[[str], dict[str, Any]]
"""`fit_batch(precision) -> {"batch_size", ...}`: the largest micro-batch that fits
(`bench.memory_check.largest_batch`)."""

SCHEMA = "ampkit.bench/2"
SCHEMA_VERSION = 2  # 2: throughput as items_per_s in the task's "unit"; model.flops_per_item
MAX_SKIPPED_FRACTION = 0.25  # an fp16 run that skips more than this share of its steps is unstable
FINAL_LOSS_WINDOW = 5  # "loss after the run" is the mean of the last few step losses (one batch is noisy)
CAST_NOTE_SHARE = 0.10  # autocast's dtype casts above this share of a step are named in the report


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
    return {
        "first": curve[0],
        "final": sum(tail) / len(tail),
        "last": curve[-1],
        "curve": curve,
        "at_common_step": None,  # set by `add_common_step_loss`
    }


def _mfu_block(items_per_s: float, flops_per_item: float | None, denominator: dict[str, Any]) -> dict[str, Any]:
    """MFU = items/s x training FLOPs per item / the peak FLOP/s of the compute dtype really used
    (`bench.peaks.mfu_denominator`); never above 1 (`mfu_value`)."""
    value, note = mfu_value(items_per_s, flops_per_item, denominator)
    return {
        "value": value,
        "peak_flops": denominator.get("peak_flops"),
        "peak_source": denominator.get("source", "unknown"),
        "peak_dtype": denominator.get("dtype", "fp32"),
        "note": note,
    }


def _denominator(result: dict[str, Any], info: DeviceInfo, peaks: dict[str, Any] | None) -> dict[str, Any]:
    if peaks is not None:
        return mfu_denominator(result["precision"], info, peaks)
    return {**(result.get("peak") or {"peak_flops": None, "source": "unknown", "dtype": "fp32"}), "note": None}


def _budget_entry(result: dict[str, Any]) -> dict[str, Any]:
    """How the budget shaped this precision's run (the parent's plan, then what the worker did)."""
    job, done = result.get("job_plan") or {}, result.get("plan") or {}
    mode = done.get("mode") or job.get("mode") or "full"
    few = bool(result.get("few_steps"))
    reasons = [r for r in (done.get("reason") or job.get("reason"), result.get("few_steps_reason")) if r]
    return {
        "mode": mode,
        "few_steps": few,
        "reason": "; ".join(dict.fromkeys(reasons)) or None,
        "batch_size": done.get("batch_size") or job.get("batch_size"),
        "warmup_steps": result.get("warmup_steps"),
        "fidelity_rows": result.get("fidelity_rows") or job.get("fidelity_rows"),
        "estimated_step_s": job.get("estimated_step_s"),
        "measured_step_s": result.get("estimated_step_s"),
        "estimated_total_s": job.get("estimated_total_s"),
        "max_measure_s": job.get("max_measure_s"),
        "measured_s": sum(result.get("step_s") or []),
        "startup_s": done.get("startup_s"),
        "imports_s": done.get("imports_s"),
        "started": done.get("started"),
        "fidelity_s": done.get("fidelity_s"),
        "warmup_s": done.get("warmup_s"),
        "probe_s": done.get("probe_s"),
        "worker_s": result.get("worker_s"),
    }


def precision_entry(
    result: dict[str, Any],
    *,
    info: DeviceInfo,
    peaks: dict[str, Any] | None = None,
    flops_per_item: float | None = None,
) -> dict[str, Any]:
    """One precision's block, without the parts measured against fp32 (added by `add_comparisons`)."""
    name = result["precision"]
    native, note = native_support(info, candidate_spec(name))
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
        "budget": _budget_entry(result),
        "profile": None,
        "conversion": (result.get("throughput") or {}).get("conversion"),  # the low-bit formats' Linears
        "parallel": result.get("parallel"),  # the worker's ranks: mode, world size, backend, reduce dtype
    }
    if result["status"] != "ok":
        return entry
    stats = summarize_steps(result["step_s"], result["tokens"], result["slots"])
    # MFU counts the items the model read (processed: masked prompts too), not only the trained ones:
    # the trained rate scaled by the measured steps' processed/trained ratio.
    processed = result.get("processed") or result["tokens"]
    # The ratio first: exactly 1.0 where none is masked (a * b / b need not be a in floating point).
    processed_per_s = stats.items_per_s * (sum(processed) / max(1, sum(result["tokens"])))
    images = sum(result.get("image_tokens") or [])  # a VLM's image tokens, among the processed
    image_per_s = stats.items_per_s * images / max(1, sum(result["tokens"])) if images else None
    flops = flops_per_item if flops_per_item is not None else result.get("flops_per_item")
    stable, why = assess_stability(result)
    entry.update(
        steps={"warmup": result["warmup_steps"], "measured": stats.measured_steps, "stalled": stats.stalled_steps},
        timing=_timing_block(stats, result["step_s"], processed_per_s, image_per_s),
        mfu=_mfu_block(processed_per_s / _devices(result, info), flops, _denominator(result, info, peaks)),
        memory={**result["memory"], "step_peak_bytes": result.get("step_peak_bytes")},
        profile=_profile(result),
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


def _devices(result: dict[str, Any], info: DeviceInfo) -> int:
    """The devices a worker's items/s ran on, for MFU per device: bench --parallel's ranks each have an
    accelerator of their own; CPU ranks share the one CPU whose peak the parent measured."""
    return 1 if info.type == "cpu" else int((result.get("parallel") or {}).get("world_size") or 1)


def _timing_block(
    stats: StepStats, step_s: list[float], processed_per_s: float, image_per_s: float | None = None
) -> dict[str, Any]:
    """The timing block: `summarize_steps`' rates and step-time spread, each step in ms."""
    return {
        "items_per_s": stats.items_per_s,
        "items_per_s_all": stats.items_per_s_all,
        "processed_per_s": processed_per_s,
        "image_tokens_per_s": image_per_s,
        "measured_s": stats.measured_s,
        "step_ms_median": stats.step_ms_median,
        "step_ms_p10": stats.step_ms_p10,
        "step_ms_p90": stats.step_ms_p90,
        "step_ms_min": stats.step_ms_min,
        "step_ms_max": stats.step_ms_max,
        "step_ms": [1000.0 * s for s in step_s],
    }


def _profile(result: dict[str, Any]) -> dict[str, Any] | None:
    """The profiled step's breakdown, with its padded slots (`profile_ratios` compares per slot)."""
    profile = result.get("profile")
    return None if profile is None else {**profile, "slots": result.get("profiled_slots")}


def common_speedup(result: dict[str, Any], reference: dict[str, Any]) -> tuple[float, int]:
    """tokens/s ratio over the measured steps both ran -- the same batches, step for step -- less either
    run's warm-up-like first steps (`bench.ratios.matched_speedup`), so a precision that got fewer steps
    (a slow one, on a budget) is not compared on a different batch mix, nor with fp32's warm-up.
    Returns (speedup, steps compared)."""
    found = matched_speedup(result, reference)
    return found.speedup, found.steps_compared


def _same_batches(entry: dict[str, Any], ref: dict[str, Any]) -> bool:
    return entry["budget"]["batch_size"] == ref["budget"]["batch_size"]


def _vs_fp32(
    entry: dict[str, Any], result: dict[str, Any], ref: dict[str, Any], ref_result: dict[str, Any]
) -> dict[str, Any]:
    """Speedup over the steps both ran on the same batches (`bench.ratios`); per item when the batches
    differ (a reduced batch): then it is the ratio of the items/s figures."""
    same = _same_batches(entry, ref)
    if same:
        found = matched_speedup(result, ref_result).to_dict()
    else:
        figures = entry["timing"]["items_per_s"] / ref["timing"]["items_per_s"]
        found = {"speedup": figures, "steps_compared": 0, "items_per_s_ratio": figures, "agrees": True}
    return {
        **found,
        "memory_ratio": entry["memory"]["peak_bytes"] / ref["memory"]["peak_bytes"],
        "same_batches": same,
    }


def add_comparisons(
    entries: list[dict[str, Any]], results: list[dict[str, Any]], run_dir: Path, *, threshold: float
) -> None:
    """Speedup, memory ratio and fidelity of every measured precision against the fp32 entry; fidelity
    also for a precision that was not timed (compared with fp32's capture on as many rows)."""
    pairs = [(e, r) for e, r in zip(entries, results) if e["status"] in ("ok", "not-timed")]
    found = next(((e, r) for e, r in pairs if candidate_spec(e["name"]).is_reference and e["status"] == "ok"), None)
    if found is None:
        return
    ref, ref_result = found
    ref_rows = ref_result.get("fidelity_rows") or FIDELITY_ROWS
    for entry, result in pairs:
        if entry["status"] == "ok":
            entry["vs_fp32"] = _vs_fp32(entry, result, ref, ref_result)
        rows = result.get("fidelity_rows") or FIDELITY_ROWS
        if entry["files"].get("fidelity") is None:
            continue
        ref_capture = _load_capture(run_dir, fidelity_file(ref["files"]["fidelity"], rows, ref_rows))
        capture = ref_capture if entry is ref else _load_capture(run_dir, entry["files"]["fidelity"])
        fidelity = compare_fidelity(ref_capture, capture, threshold=threshold).to_dict()
        fidelity["rows"] = rows
        comparable = entry["status"] == "ok" and entry["vs_fp32"]["same_batches"]
        fidelity["loss_curve"] = loss_curve_gap(ref["loss"]["curve"], entry["loss"]["curve"] if comparable else [])
        entry["fidelity"] = fidelity


def _load_capture(run_dir: Path, relative: str) -> dict[str, Any]:
    return torch.load(run_dir / relative, weights_only=True)


def add_common_step_loss(entries: list[dict[str, Any]]) -> int | None:
    """The last step every comparable precision reached (same batches as fp32), and each one's loss
    there: losses at equal steps, on the same batches, from the same initial weights."""
    comparable = [
        e
        for e in entries
        if e["status"] == "ok"
        and (candidate_spec(e["name"]).is_reference or (e["vs_fp32"] is not None and e["vs_fp32"]["same_batches"]))
    ]
    if not comparable:
        return None
    step = min(len(e["loss"]["curve"]) for e in comparable)
    for entry in comparable:
        entry["loss"]["at_common_step"] = entry["loss"]["curve"][step - 1]
    return step


def profile_block(entries: list[dict[str, Any]], peaks: dict[str, Any] | None) -> dict[str, Any] | None:
    """Amdahl's ceiling from the fp32 profile, and each profiled precision's prediction from its own
    matmuls' speed in its profiled step against fp32's (`bench.ratios.profile_ratios`: this model's
    matmuls, not the large-GEMM probe, kept as `probe_matmul_ratio`)."""
    ref = next((e for e in entries if candidate_spec(e["name"]).is_reference and e.get("profile")), None)
    if ref is None:
        return None
    share = ref["profile"]["shares"]["matmul"]
    for entry in entries:
        profile = entry.get("profile")
        if profile is None:
            continue
        ratios = profile_ratios(profile, ref["profile"])
        ratio = ratios["matmul_ratio"]
        profile.update(
            ratios,
            matmul_ratio_source="profiled step" if ratio else None,
            probe_matmul_ratio=matmul_ratio(entry["name"], peaks) if peaks else None,
            amdahl_speedup=amdahl_speedup(share, ratio) if ratio else None,
        )
    return {
        "categories": dict(CATEGORIES),
        "reference_matmul_share": share,
        "ceiling_2x": amdahl_speedup(share, 2.0),
        "ceiling_unbounded": 1.0 / (1.0 - share) if share < 1 else None,
        "cast_threshold": CAST_NOTE_SHARE,
    }


def add_predictions(entries: list[dict[str, Any]], results: list[dict[str, Any]], predict: PredictPeak | None) -> None:
    """The planner's predicted step peak beside the profiled step's measured peak, and their ratio."""
    for entry, result in zip(entries, results):
        if entry["status"] != "ok" or entry["memory"] is None:
            continue
        memory = entry["memory"]
        memory.update(predicted_bytes=None, predicted_source=None, predicted_note="not predicted", predicted_ratio=None)
        if predict is None:
            continue
        batch = result.get("profiled_batch_size") or entry["budget"]["batch_size"] or 1
        width = (result.get("profiled_slots") or 0) // batch or None
        found = predict(entry["name"], batch, width)
        memory.update(predicted_bytes=found["bytes"], predicted_source=found["source"], predicted_note=found["note"])
        measured = memory.get("step_peak_bytes")
        if found["bytes"] and measured:
            memory["predicted_ratio"] = measured / found["bytes"]


def candidate_from(entry: dict[str, Any], reference_items_per_s: float | None) -> Candidate:
    """The recommendation's view of one summary entry. Its tokens/s is fp32's times the same-batch
    speedup, so every candidate is ranked on batches it shares with the reference."""
    if entry["status"] != "ok":
        not_timed = (entry["budget"]["reason"] or "not timed") if entry["status"] == "not-timed" else None
        return Candidate(
            name=entry["name"],
            ok=False,
            error=entry["error"],
            native=entry["native"],
            native_note=entry["native_note"],
            not_timed=not_timed,
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


def device_block(info: DeviceInfo) -> dict[str, Any]:
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
    ok.sort(key=lambda r: not candidate_spec(r["precision"]).is_reference)
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
    info: DeviceInfo,
    task: dict[str, Any],
    results: list[dict[str, Any]],
    warnings: list[str],
    run_dir: Path,
    wall_s: float,
    host_load: dict[str, Any] | None = None,
    peaks: dict[str, Any] | None = None,
    predict: PredictPeak | None = None,
    fit_batch: FitBatch | None = None,
    budget: dict[str, Any] | None = None,
    interrupted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json from the workers' results; `peaks` (the device's, `bench.peaks`), `predict` (the
    planner's step peak), `fit_batch` (the largest batch that fits) and `budget` come from the runner.
    `interrupted` (a stop signal: `signal`, `during`, `finished`) makes it `"status": "interrupted"`,
    with what was measured and no recommendation."""
    flops = _flops(results)
    entries = [precision_entry(r, info=info, peaks=peaks, flops_per_item=flops["flops_per_item"]) for r in results]
    add_comparisons(entries, results, run_dir, threshold=config.fidelity_threshold)
    common_step = add_common_step_loss(entries)
    add_gate(entries, config.gate)  # --gate: each candidate's loss gap to fp32's at the matched steps
    add_predictions(entries, results, predict)
    if interrupted is None:
        rec = _recommendation(config, info, task, entries, fit_batch)
    else:
        rec = _no_recommendation(interrupted)
    gate = gate_block(entries, rec["precision"], config.gate)
    rec["advice"] += [gate["line"]] if gate and gate["line"] else []
    summary = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "command": "bench",
        "status": "interrupted" if interrupted else "completed",
        "interrupted": interrupted,
        **summary_header(info=info, config=config.to_dict(), wall_s=wall_s),
        "device": device_block(info),
        "host_load": host_load,
        "unit": task["unit"],
        "task": task,
        "model": _model_block(task, flops),
        "data": {"corpus": task.get("corpus"), "seq_len": task.get("seq_len"), "batch_size": config.data.batch_size},
        "reference": REFERENCE,
        "parallel": parallel_block(config.parallel),
        "warnings": warnings,
        "loss_common_step": common_step,
        "profile": profile_block(entries, peaks),
        "peaks": peaks,
        "budget": budget,
        "precisions": entries,
        "recommendation": rec,
        "gate": gate,
    }
    return json_safe(summary)


def _model_block(task: dict[str, Any], flops: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `model`: the task's name and parameters, its FLOPs per item and how they were counted."""
    return {
        "preset": task["name"],
        "parameters": task.get("parameters") or flops["measured_parameters"],
        **{k: v for k, v in flops.items() if k != "measured_parameters"},
        "flops_formula": FLOPS_FORMULAS.get(flops["flops_source"] or ""),
    }


def _recommendation(
    config: BenchConfig,
    info: DeviceInfo,
    task: dict[str, Any],
    entries: list[dict[str, Any]],
    fit_batch: FitBatch | None,
) -> dict[str, Any]:
    ref_ips = next(
        (e["timing"]["items_per_s"] for e in entries if candidate_spec(e["name"]).is_reference and e["timing"]), None
    )
    rec = recommend(
        [candidate_from(e, ref_ips) for e in entries],
        threshold=config.fidelity_threshold,
        tie_tolerance=config.tie_tolerance,
        capacity_bytes=info.total_memory_bytes,
        unit=task["unit"],
    ).to_dict()
    rec["advice"] += conv_tf32_advice(int(task.get("convolutions") or 0))
    rec["rules"] = seed_rules(entries, rec, capacity_bytes=info.total_memory_bytes, parameters=task.get("parameters"))
    rec["advice"] += [rule["text"] for rule in rec["rules"]]  # the seeds' rules, with their evidence in `rules`
    chosen = next((e for e in entries if e["name"] == rec["precision"]), None)
    rec["train"] = None
    if chosen is not None and chosen["status"] == "ok":
        fit = fit_batch(chosen["name"]) if fit_batch is not None else {"batch_size": None, "note": "not predicted"}
        rec["train"] = train_command(config, task, chosen, fit)
    return rec


def _no_recommendation(interrupted: dict[str, Any]) -> dict[str, Any]:
    """An interrupted bench compared only some precisions: it recommends none."""
    finished = ", ".join(interrupted["finished"]) or "none"
    return {
        "precision": None,
        "reason": f"interrupted by {interrupted['signal']} before every precision was measured (finished: "
        f"{finished}): no recommendation; run the bench again to the end",
        "disqualified": {},
        "advice": [],
        "train": None,
    }


def json_safe(value: Any) -> Any:
    """Non-finite floats become None (strict JSON has no NaN/Infinity); the counts say what happened."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
