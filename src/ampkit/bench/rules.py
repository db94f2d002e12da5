"""The seeds' decision rules, fired on what bench measured: each a line of advice with its evidence.

- **fp32 is fast enough** (a small model): the best natively run low-precision candidate's measured gain
  over fp32 lies inside the measurement's noise (half the p10-p90 spread of step times, relative to the median, the
  larger of fp32's and the candidate's). The seed: "small models (tens of millions of parameters):
  fp32 is already fast; mixed precision's gain is not obvious and may add tuning cost".
- **TF32 first**: tf32 qualified and the recommendation is a 16-bit regime, while memory is not the
  constraint (fp32 peaks below `MEMORY_BOUND_FRACTION` of the device): tf32 keeps fp32's range and
  storage, needs no loss scaler and no rollback machinery. The seed: "precision-sensitive but not short
  of memory: TF32 is the easier choice; without NaN monitoring and checkpoint rollback, TF32 first".
- **checkpointing vs accumulation** by measured utilisation, when a peak nears the device's memory: the
  seed's rule is that activation checkpointing pays when memory forces the batch to be halved and the
  halved batch runs the GPU below 50% utilisation; otherwise a smaller micro-batch with gradient
  accumulation keeps the effective batch without the recompute (~1/3 more compute). Utilisation is the
  chosen precision's measured MFU at the measured batch, an upper bound of the halved batch's.
- **an fp32 island's cost**: a candidate with module overrides (`bf16-mixed@blocks.1.mlp`, the fix doctor
  advises) measured beside the same candidate without them: the island's price in step time, against
  the noise of the two runs, so a fix is taken knowing what it costs.

Pure functions on summary entries (dicts of summary.json's `precisions`): testable on synthetic ones.
"""

from __future__ import annotations

from typing import Any

from ampkit.bench.candidates import OVERRIDE, candidate_spec
from ampkit.bench.recommend import MEMORY_BOUND_FRACTION, format_speedup

UTILISATION_FLOOR = 0.5
"""below this MFU at a halved batch, activation checkpointing beats shrinking the batch (the seed's 50%)"""


def _ok(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["status"] == "ok" and e.get("timing") and e.get("vs_fp32")]


def _reference(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((e for e in _ok(entries) if candidate_spec(e["name"]).is_reference), None)


def step_noise(entry: dict[str, Any]) -> float:
    """Half the p10-p90 spread of the measured step times over their median (a fraction; 0 with one step)."""
    t = entry["timing"]
    median = t["step_ms_median"]
    return (t["step_ms_p90"] - t["step_ms_p10"]) / (2 * median) if median else 0.0


def fp32_fast_enough(entries: list[dict[str, Any]], parameters: int | None) -> dict[str, Any] | None:
    ref = _reference(entries)
    others = [e for e in _ok(entries) if e is not ref and e.get("native", True)]  # emulated: the hardware's cause
    if ref is None or not others:
        return None
    best = max(others, key=lambda e: e["vs_fp32"]["speedup"])
    gain, noise = best["vs_fp32"]["speedup"] - 1.0, max(step_noise(ref), step_noise(best))
    if abs(gain) > noise:  # a real gain, or a real loss (said by the recommendation's reason)
        return None
    size = f"{parameters / 1e6:.3g}M parameters: " if parameters else ""
    text = (
        f"fp32 is fast enough here: the best gain, {best['name']} {format_speedup(1.0 + gain)}, is inside the "
        f"measurement's noise (+/-{noise:.0%} step-time spread); {size}mixed precision pays on larger models"
    )
    evidence = {"best": best["name"], "speedup": 1.0 + gain, "noise": noise, "parameters": parameters}
    return {"rule": "fp32-fast-enough", "text": text, "evidence": evidence}


def _plain_tf32(name: str) -> bool:
    """The tf32 candidate itself (no optimizer or module overrides of its own), by its spec, not its name."""
    spec = candidate_spec(name)
    return spec.tf32 and name == spec.name


def tf32_first(entries: list[dict[str, Any]], rec: dict[str, Any], capacity_bytes: int) -> dict[str, Any] | None:
    chosen, ref = rec.get("precision"), _reference(entries)
    tf32 = next((e for e in _ok(entries) if _plain_tf32(e["name"])), None)
    disqualified = any(_plain_tf32(name) for name in rec.get("disqualified", {}))
    if ref is None or tf32 is None or chosen is None or disqualified:
        return None
    spec = candidate_spec(chosen)
    if spec.is_reference or spec.tf32:
        return None
    fraction = ref["memory"]["peak_bytes"] / capacity_bytes if capacity_bytes > 0 else None
    if fraction is None or fraction >= MEMORY_BOUND_FRACTION:
        return None
    scaler = spec.loss_scaling
    speed = format_speedup(tf32["vs_fp32"]["speedup"])
    text = (
        f"TF32 first where precision matters or there is no rollback: tf32 runs at {speed} fp32's speed with "
        f"fp32's range and storage{' and no loss scaler' if scaler else ''}, and memory is not the constraint "
        f"(fp32 peaks at {fraction:.0%} of the device); take {chosen} with NaN monitoring and checkpoint "
        "rollback (train --guard)"
    )
    evidence = {
        "tf32_speedup": tf32["vs_fp32"]["speedup"],
        "chosen": chosen,
        "chosen_speedup": next((e["vs_fp32"]["speedup"] for e in entries if e["name"] == chosen), None),
        "fp32_memory_fraction": fraction,
        "chosen_loss_scaler": scaler,
    }
    return {"rule": "tf32-first", "text": text, "evidence": evidence}


def checkpointing_or_accumulation(
    entries: list[dict[str, Any]], rec: dict[str, Any], capacity_bytes: int
) -> dict[str, Any] | None:
    near = [
        e
        for e in _ok(entries)
        if capacity_bytes > 0 and e["memory"]["peak_bytes"] >= MEMORY_BOUND_FRACTION * capacity_bytes
    ]
    chosen = next((e for e in _ok(entries) if e["name"] == rec.get("precision")), None)
    mfu = ((chosen or {}).get("mfu") or {}).get("value")
    if not near or chosen is None or mfu is None:
        return None
    batch = chosen["budget"]["batch_size"]
    if mfu < UTILISATION_FLOOR:
        text = (
            f"activation checkpointing over a smaller batch: {chosen['name']} runs at {mfu:.0%} MFU at batch {batch}, "
            f"below {UTILISATION_FLOOR:.0%} already, so a halved batch would idle the device further; checkpointing "
            "(~1/3 more compute) keeps the batch"
        )
        verdict = "checkpointing"
    else:
        text = (
            f"gradient accumulation over checkpointing: {chosen['name']} runs at {mfu:.0%} MFU at batch {batch}; if "
            f"memory forces a smaller micro-batch, measure it (--batch-size {max(1, (batch or 2) // 2)}) and while it "
            f"stays above {UTILISATION_FLOOR:.0%}, --grad-accum keeps the effective batch without the recompute"
        )
        verdict = "accumulation"
    evidence = {"verdict": verdict, "mfu": mfu, "batch_size": batch, "floor": UTILISATION_FLOOR}
    evidence["memory_fraction"] = max(e["memory"]["peak_bytes"] for e in near) / capacity_bytes
    return {"rule": "checkpointing-or-accumulation", "text": text, "evidence": evidence}


def island_costs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One rule per candidate with module overrides whose plain form (its name before '@') was measured
    too: the island's step-time cost (a fraction: +0.07 is 7% slower), from the medians of the same
    batches and steps, beside the larger of the two runs' noise."""
    ok = {e["name"]: e for e in _ok(entries)}
    found = []
    for name, island in ok.items():
        base_name = name.split(OVERRIDE, 1)[0]
        base = ok.get(base_name)
        if base is None or base_name == name:
            continue
        base_ms, island_ms = base["timing"]["step_ms_median"], island["timing"]["step_ms_median"]
        if not base_ms or not island_ms:
            continue
        cost, noise = island_ms / base_ms - 1.0, max(step_noise(base), step_noise(island))
        kept = name[len(base_name) + 1 :].replace(OVERRIDE, ", ")
        verdict = "inside the noise" if abs(cost) <= noise else ("slower" if cost > 0 else "faster")
        text = (
            f"the island {kept} costs {cost:+.0%} step time over {base_name} ({island_ms:.1f} vs {base_ms:.1f} ms "
            f"a step; +/-{noise:.0%} noise: {verdict})"
        )
        evidence = {"candidate": name, "base": base_name, "cost": cost, "noise": noise, "verdict": verdict}
        found.append({"rule": "island-cost", "text": text, "evidence": evidence})
    return found


def seed_rules(
    entries: list[dict[str, Any]], rec: dict[str, Any], *, capacity_bytes: int, parameters: int | None
) -> list[dict[str, Any]]:
    """Every rule that fires on this bench: {"rule", "text", "evidence"} each (summary.json's `rules`)."""
    found = [
        fp32_fast_enough(entries, parameters),
        tf32_first(entries, rec, capacity_bytes),
        checkpointing_or_accumulation(entries, rec, capacity_bytes),
    ]
    return [f for f in found if f is not None] + island_costs(entries)
