"""Pick one precision from measurements, and say why in numbers.

The rule: among the precisions that ran to the end, ran stably and whose fidelity against fp32
passes, take the fastest by tokens/s; any within `tie_tolerance` of it counts as a tie, and a tie
goes to the simpler regime (`PrecisionSpec.simplicity`). fp32 is the reference: it passes fidelity by definition,
so "nothing beats fp32" recommends fp32, with each other precision's measured slowdown and, where
its dtype is emulated here, the missing hardware support named.
Pure functions on plain data: the recommendation can be tested on synthetic measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ampkit.bench.candidates import candidate_rank, candidate_spec
from ampkit.errors import UsageError
from ampkit.hardware.device import BF16_CPU_FLAGS, FP16_CPU_FLAGS, DeviceInfo
from ampkit.precision import REFERENCE, SPECS, PrecisionSpec

MEMORY_BOUND_FRACTION = 0.85  # a peak above this share of the device's memory earns memory advice


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """What the recommendation needs to know about one measured precision."""

    name: str
    ok: bool
    """ran to the end (no crash, no out-of-memory)"""
    error: str | None = None
    stable: bool = True
    instability: str | None = None
    """why it is unstable, e.g. "3 non-finite losses" (None when stable)"""
    items_per_s: float | None = None
    peak_bytes: int | None = None
    logits_cosine: float | None = None
    fidelity_passed: bool = False
    native: bool = True
    """the device runs this precision's compute dtype in hardware (else: emulated)"""
    native_note: str = ""
    """e.g. "native: amx_bf16" or "emulated (this CPU lacks avx512_bf16/amx_bf16)" """
    not_timed: str | None = None
    """why the budget left it untimed ("not timed: emulated, bf16 matmuls run at 0.05x ..."), or None"""


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    precision: str | None
    """None when nothing can be recommended (the fp32 reference itself did not run)"""
    reason: str
    """one line, in numbers"""
    disqualified: dict[str, str] = field(default_factory=dict)
    """precision -> why it cannot be recommended"""
    advice: list[str] = field(default_factory=list)
    """further lines (memory-bound advice)"""

    def to_dict(self) -> dict:
        return {
            "precision": self.precision,
            "reason": self.reason,
            "disqualified": dict(self.disqualified),
            "advice": list(self.advice),
        }


def simplicity_rank(name: str) -> float:
    """`PrecisionSpec.simplicity` (plus a half with its own optimizer, `bench.candidates`); a name
    outside the table ranks after every known precision."""
    try:
        return candidate_rank(name)
    except UsageError:
        return len(SPECS)


def _is_reference(name: str) -> bool:
    try:
        return candidate_spec(name).is_reference
    except UsageError:
        return False


def native_support(info: DeviceInfo, precision_spec: PrecisionSpec) -> tuple[bool, str]:
    """(native?, note) for a precision's compute dtype on `info`'s device (a hardware.DeviceInfo)."""
    key = precision_spec.matmul_key
    if precision_spec.emulated:
        fmt = precision_spec.linear_format.key  # "fp8", "mxfp8", "nvfp4", "mxfp4"
        return False, f"emulated ({fmt} rounding in software, no {fmt} matmuls: its fidelity, not its speed)"
    if key == "fp32":
        return True, "native"
    native = info.is_native(key)
    if info.type == "cpu":
        flags = BF16_CPU_FLAGS[:2] if key == "bf16" else FP16_CPU_FLAGS[:2]  # the x86 names
        present = sorted(set(flags) & set(info.cpu_flags))
        if native:
            return True, f"native: {'/'.join(present) or 'present'}"
        return False, f"emulated (this CPU lacks {'/'.join(flags)})"
    return native, f"{'native' if native else 'emulated'} on {info.arch_label}"


def disqualification(c: Candidate, *, threshold: float) -> str | None:
    """Why `c` cannot be recommended, or None."""
    if c.not_timed:
        return c.not_timed if c.not_timed.startswith("not timed") else f"not timed: {c.not_timed}"
    if not c.ok:
        return f"failed: {c.error}"
    if not c.stable:
        return f"unstable: {c.instability}"
    if c.items_per_s is None or not c.items_per_s > 0:
        return "no throughput measured"
    if not _is_reference(c.name) and not c.fidelity_passed:
        return f"fidelity: logits cos {format_cosine(c.logits_cosine)} < {threshold}"
    return None


def _items_per_s(c: Candidate) -> float:
    """The throughput of a candidate that `disqualification` let through (it requires one)."""
    assert c.items_per_s is not None, f"{c.name} has no throughput; it should have been disqualified"
    return c.items_per_s


def _peak_bytes(c: Candidate) -> int:
    """The measured peak, 0 when none was measured."""
    return c.peak_bytes or 0


def recommend(
    candidates: list[Candidate],
    *,
    threshold: float = 0.99,
    tie_tolerance: float = 0.05,
    capacity_bytes: int = 0,
    unit: str = "tokens",
) -> Recommendation:
    """The fastest stable precision that passes fidelity; ties (within `tie_tolerance`) go to the simpler.
    `unit` names the task's items in the reason ("tokens/s", "samples/s")."""
    by_name = {c.name: c for c in candidates}
    disqualified = {c.name: why for c in candidates if (why := disqualification(c, threshold=threshold))}
    ref = by_name.get(REFERENCE)
    if ref is None or REFERENCE in disqualified:
        why = disqualified.get(REFERENCE, "not measured")
        return Recommendation(
            precision=None, reason=f"no recommendation: the fp32 reference {why}", disqualified=disqualified
        )
    passing = [c for c in candidates if c.name not in disqualified]
    fastest = max(passing, key=_items_per_s)
    tied = [c for c in passing if _items_per_s(c) >= _items_per_s(fastest) * (1.0 - tie_tolerance)]
    chosen = min(tied, key=lambda c: simplicity_rank(c.name))
    if _is_reference(chosen.name):
        reason = _why_reference(candidates, ref, disqualified, tie_tolerance, unit)
    else:
        reason = _why_faster(chosen, ref, fastest, unit)
    return Recommendation(
        precision=chosen.name,
        reason=reason,
        disqualified=disqualified,
        advice=_memory_advice(candidates, ref, passing, capacity_bytes) or _memory_lean(chosen, ref, passing, unit),
    )


def format_speedup(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def format_cosine(value: float | None) -> str:
    """Enough digits to tell 0.99999 from 1: six decimals above 0.9999, four below."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.6f}" if value > 0.9999 else f"{value:.4f}"


def format_memory_change(ratio: float) -> str:
    """0.62 -> "-38% memory"; 1.0 -> "same memory"."""
    change = round((ratio - 1.0) * 100)
    return "same memory" if change == 0 else f"{change:+d}% memory"


def _why_faster(chosen: Candidate, ref: Candidate, fastest: Candidate, unit: str) -> str:
    parts = [f"{format_speedup(_items_per_s(chosen) / _items_per_s(ref))} {unit}/s"]
    if chosen.peak_bytes and ref.peak_bytes:
        parts.append(format_memory_change(chosen.peak_bytes / ref.peak_bytes))
    parts.append(f"logits cos {format_cosine(chosen.logits_cosine)} vs fp32")
    reason = f"{chosen.name}: " + ", ".join(parts)
    if fastest.name != chosen.name:
        reason += (
            f" ({fastest.name} was {format_speedup(_items_per_s(fastest) / _items_per_s(chosen))} as fast: "
            "a tie, which goes to the simpler regime)"
        )
    return reason


def _why_reference(
    candidates: list[Candidate], ref: Candidate, disqualified: dict[str, str], tie_tolerance: float, unit: str
) -> str:
    notes, ratios = [], []
    for c in candidates:
        if _is_reference(c.name):
            continue
        if c.name in disqualified:
            notes.append(f"{c.name} {disqualified[c.name]}")
            continue
        ratio = _items_per_s(c) / _items_per_s(ref)
        ratios.append(ratio)
        if c.native:
            verdict = f"within the {tie_tolerance:.0%} tie margin" if ratio >= 1 else "slower"
            notes.append(f"{c.name} {format_speedup(ratio)} {unit}/s ({c.native_note or 'native'} here, yet {verdict})")
        else:  # "emulated (this CPU lacks ...)"
            notes.append(f"{c.name} {format_speedup(ratio)} {unit}/s, {c.native_note or 'emulated'}")
    return _reference_head(ratios, disqualified=len(notes) > len(ratios), tie_tolerance=tie_tolerance) + (
        ": " + "; ".join(notes) if notes else ""
    )


def _reference_head(ratios: list[float], *, disqualified: bool, tie_tolerance: float) -> str:
    """What was measured against fp32, said as it was: slower, a tie, or nothing else qualified."""
    others = " (or disqualified)" if disqualified else ""
    if not ratios:
        return "fp32: no other precision qualified" if disqualified else "fp32: the only precision measured"
    if max(ratios) < 1.0:
        return f"fp32: every other precision was slower{others}"
    return (
        f"fp32: no other precision was more than {tie_tolerance:.0%} faster{others} (a tie goes to the simpler regime)"
    )


LEAN_FRACTION = 0.9
"""A passing candidate is named the memory-lean choice when its peak is below this share of the chosen one's."""


def _memory_lean(chosen: Candidate, ref: Candidate, passing: list[Candidate], unit: str) -> list[str]:
    """The passing low-precision candidate with the smallest peak, when it is not the chosen one and
    saves at least 10% against both the chosen one and fp32 (e.g. bf16-true+adamw-sr: bf16 weights and
    states whose updates are not rounded away)."""
    lower = [c for c in passing if c.peak_bytes and not _is_reference(c.name)]  # fp32 is the yardstick
    leanest = min(lower, key=_peak_bytes, default=None)
    if leanest is None or leanest.name == chosen.name or not (chosen.peak_bytes and ref.peak_bytes):
        return []
    if _peak_bytes(leanest) >= LEAN_FRACTION * min(chosen.peak_bytes, ref.peak_bytes):  # must save vs both
        return []
    change = format_memory_change(_peak_bytes(leanest) / ref.peak_bytes)
    speed = format_speedup(_items_per_s(leanest) / _items_per_s(ref))
    return [f"memory-lean: {leanest.name} passes fidelity with {change} vs fp32 at {speed} fp32's {unit}/s"]


def _memory_advice(
    candidates: list[Candidate], ref: Candidate, passing: list[Candidate], capacity_bytes: int
) -> list[str]:
    """When a precision's peak nears the device's memory, say which passing precision saves the most."""
    if capacity_bytes <= 0:
        return []
    near = [c for c in candidates if c.peak_bytes and c.peak_bytes >= MEMORY_BOUND_FRACTION * capacity_bytes]
    if not near:
        return []
    gib = 1024**3
    worst = max(near, key=_peak_bytes)
    advice = (
        f"memory-bound: {worst.name} peaks at {_peak_bytes(worst) / capacity_bytes:.0%} of the device's "
        f"{capacity_bytes / gib:.1f} GiB"
    )
    leanest = min((c for c in passing if c.peak_bytes), key=_peak_bytes, default=None)
    if leanest is not None and ref.peak_bytes and _peak_bytes(leanest) < ref.peak_bytes:
        advice += (
            f"; {leanest.name} uses {format_memory_change(_peak_bytes(leanest) / ref.peak_bytes)} "
            "vs fp32 and passes fidelity"
        )
    advice += "; activation checkpointing or a smaller --batch-size frees more ('ampkit plan' shows the ledger)"
    return [advice]


def conv_tf32_advice(convolutions: int) -> list[str]:
    """The cuDNN TF32 pitfall, for a model with convolutions (the seed's vision-tower case): ampkit's
    `tf32` turns on both TF32 switches (`torch.backends.cuda.matmul.allow_tf32` for matmuls and
    `torch.backends.cudnn.allow_tf32` for convolutions) and its `fp32` turns both off, while stock
    PyTorch leaves the cuDNN one on by default, so a plain-PyTorch "fp32" conv baseline may already run
    its convolutions in TF32 (on CUDA Ampere and newer)."""
    if convolutions <= 0:
        return []
    return [
        f"convolutions ({convolutions}): ampkit's tf32 sets both TF32 switches (matmul and cuDNN) and its fp32 turns "
        "both off; stock PyTorch leaves torch.backends.cudnn.allow_tf32 on, so an 'fp32' conv baseline outside "
        "ampkit may already run its convolutions in TF32 (CUDA Ampere and newer)"
    ]
