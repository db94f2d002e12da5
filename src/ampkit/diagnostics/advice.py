"""Diagnosis to advice: small rules, each mapping findings to one fix with its evidence.

Every rule reads an `Evidence` (what doctor measured) and returns an `Advice` or None. The fixes
are the ones the seeds apply by hand: keep a module in fp32 (`custom_fwd(cast_inputs=float32)`
or an autocast-disabled region, with the module path filled in), lower `init_scale` (65536 ->
4096) when early overflow skips dominate, raise it when underflow dominates, switch to bf16 where
the device has it, clip gradients when one layer's norm towers over the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ampkit.diagnostics.gradstats import LongTail, ScaleRange
from ampkit.diagnostics.layer_fidelity import FidelityResult
from ampkit.diagnostics.locator import ROOT, Finding
from ampkit.diagnostics.optim_states import adam_eps_hazard, eps_text
from ampkit.diagnostics.range_audit import RangeAudit, range_fix, range_lines
from ampkit.diagnostics.range_grads import grad_lines, scale_fix
from ampkit.diagnostics.range_target import format_target
from ampkit.diagnostics.smoke import SmokeResult
from ampkit.diagnostics.underflow import FrozenLayer
from ampkit.records import Record

UNDERFLOW_DOMINATES = 0.01
"""Over 1% of the gradient elements flushing to zero at the run's loss scale is a real loss of signal."""
EARLY_SKIPS_DOMINATE = 2
"""Two or more skipped steps in the first steps, with finite losses, mean the initial scale is too high."""


@dataclass(kw_only=True)
class Evidence:
    """What doctor measured; every field may be missing (None) when that part did not run."""

    precision: str
    compute_dtype: str
    """"float32", "bfloat16" or "float16"."""
    loss_scaling: bool
    device_type: str
    native_bf16: bool
    init_scale: float
    clip_grad_norm: float
    injected: str | None = None
    nonfinite: Finding | None = None
    near_max: Finding | None = None
    nonfinite_loss_steps: list[int] = field(default_factory=list)
    scale: dict[str, Any] | None = None
    scale_range: ScaleRange | None = None
    flush_fraction: float | None = None
    """share of all gradient elements that flush to zero in fp16 at the run's final loss scale"""
    long_tail: LongTail | None = None
    smoke: SmokeResult | None = None
    smoke_fp32: SmokeResult | None = None
    fidelity: FidelityResult | None = None
    frozen_layers: list[FrozenLayer] = field(default_factory=list)
    """layers whose weights stopped changing (`ampkit.diagnostics.underflow`)"""
    range_audit: RangeAudit | None = None
    """the initial fp32 model's per-module ranges against the precision's format (`diagnostics.range_audit`)"""


@dataclass(frozen=True, kw_only=True)
class Advice(Record):
    rule: str
    severity: str
    """"fix" (do this), "warn" (worth a look) or "info"."""
    title: str
    evidence: list[str]
    fix: str
    """a flag, a code snippet, or a sentence"""
    settings: dict[str, Any] = field(default_factory=dict)
    """the fix as run settings `doctor --from RUN --try-fixes` can apply (`diagnostics.try_fixes.FIX_KEYS`'s
    values: keep_fp32, init_scale, min_scale, hysteresis, clip_grad_norm, precision); empty: no such form"""


def attribute_path(path: str) -> str:
    """Python expression reaching a module from `model`: "blocks.1.mlp" -> "model.blocks[1].mlp"."""
    out = "model"
    for part in path.split("."):
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


def _culprit(finding: Finding) -> str:
    """The module to keep in fp32: the finding's module, or its parent when the value appeared in code
    between modules (inputs / incoming gradient already bad)."""
    if finding.site in ("inputs", "grad_output") and "." in finding.module:
        return finding.module.rsplit(".", 1)[0]
    return finding.module


def fp32_fix_snippet(path: str, device_type: str) -> str:
    return (
        f"keep {path} in fp32. In its code, decorate the custom autograd Function's forward with "
        f'@torch.amp.custom_fwd(device_type="{device_type}", cast_inputs=torch.float32); or run the module in '
        f'an autocast-disabled region: with torch.autocast("{device_type}", enabled=False): '
        f"y = {attribute_path(path)}(x.float()); or with ampkit: "
        f'ampkit.diagnostics.keep_in_fp32(model, "{path}", device_type="{device_type}") '
        f"(doctor: --keep-fp32 {path})"
    )


def rule_keep_fp32(ev: Evidence) -> Advice | None:
    f = ev.nonfinite
    if f is None or ev.compute_dtype == "float32" or f.site in ("weights", "param_grad") or f.module == ROOT:
        return None
    path = _culprit(f)
    evidence = [f"step {f.step}, {f.phase}: {f.explanation}"]
    if ev.smoke_fp32 is not None and ev.smoke_fp32.passed:
        evidence.append(f"fp32 runs the same model cleanly (smoke test passed in {ev.smoke_fp32.steps_needed} steps)")
    evidence += _injected(ev, ": this finding may be that fault")
    return Advice(
        rule="keep_module_fp32",
        severity="fix",
        title=f"Keep {path} in fp32 ({f.cls} overflows in {ev.compute_dtype})",
        evidence=evidence,
        fix=fp32_fix_snippet(path, ev.device_type),
        settings={"keep_fp32": path},
    )


def rule_not_precision(ev: Evidence) -> Advice | None:
    f = ev.nonfinite
    if f is None or ev.compute_dtype != "float32":
        return None
    return Advice(
        rule="not_a_precision_problem",
        severity="fix",
        title=f"{f.module} goes non-finite in fp32 too: not a precision problem",
        evidence=[f"step {f.step}, {f.phase}: {f.explanation}", *_injected(ev)],
        fix="check that module's math and its inputs (data, learning rate); train with --guard so a "
        "bad step rolls back instead of killing the run",
    )


def rule_weights_corrupted(ev: Evidence) -> Advice | None:
    f = ev.nonfinite
    if f is None or f.site not in ("weights", "param_grad"):
        return None
    return Advice(
        rule="nonfinite_update",
        severity="fix",
        title=f"Non-finite values reached {f.module}'s {'weights' if f.site == 'weights' else 'gradients'}",
        evidence=[f"step {f.step}: {f.explanation}"],
        fix="clip gradients (--clip-grad-norm 1.0), lower the learning rate, and train with --guard "
        "(rolls back to the last finite checkpoint and skips the batch)",
        settings={"clip_grad_norm": 1.0},
    )


def rule_lower_init_scale(ev: Evidence) -> Advice | None:
    s = ev.scale
    if not s or not s.get("active") or ev.nonfinite_loss_steps or s.get("early_skipped", 0) < EARLY_SKIPS_DOMINATE:
        return None
    suggested = 4096.0
    if ev.scale_range is not None and ev.scale_range.representable:
        suggested = min(suggested, ev.scale_range.high_pow2)
    if suggested >= ev.init_scale:
        return None
    return _scale_advice(
        ev,
        "lower_init_scale",
        f"Lower init_scale from {ev.init_scale:g} to {suggested:g}",
        f"{s['early_skipped']} of the first steps were skipped for overflow with finite losses; "
        f"the scale backed off {s['initial']:g} -> {s['min']:g}",
        fix=f"--init-scale {suggested:g} (torch.amp.GradScaler(init_scale={suggested:g}))",
        settings={"init_scale": suggested},
    )


def rule_raise_init_scale(ev: Evidence) -> Advice | None:
    if not ev.loss_scaling or ev.flush_fraction is None or ev.flush_fraction < UNDERFLOW_DOMINATES:
        return None
    final = (ev.scale or {}).get("final") or ev.init_scale
    target = ev.scale_range.low_pow2 if ev.scale_range and ev.scale_range.representable else 2 * final
    if target <= final:
        return None
    return _scale_advice(
        ev,
        "raise_init_scale",
        f"Raise the loss scale to {target:g}: {100 * ev.flush_fraction:.1f}% of gradients flush to zero",
        f"at scale {final:g}, {100 * ev.flush_fraction:.2f}% of gradient elements are below fp16's "
        "smallest subnormal after scaling",
        fix=f"--init-scale {target:g} and --min-scale {target:g} (keeps backoffs from dropping below it)",
        settings={"init_scale": target, "min_scale": target},
    )


def _scale_advice(
    ev: Evidence, rule: str, title: str, seen: str, *, fix: str, settings: dict[str, Any] | None = None
) -> Advice:
    """A loss-scale fix: what was seen, then the range of loss scales that keeps the gradients representable."""
    evidence = [seen, *_range_evidence(ev)]
    return Advice(rule=rule, severity="fix", title=title, evidence=evidence, fix=fix, settings=settings or {})


def rule_unscaled_fp16(ev: Evidence) -> Advice | None:
    if (
        ev.compute_dtype != "float16"
        or ev.loss_scaling
        or ev.flush_fraction is None
        or ev.flush_fraction < UNDERFLOW_DOMINATES
    ):
        return None
    return _scale_advice(
        ev,
        "fp16_without_loss_scaling",
        f"{ev.precision} has no loss scaling: {100 * ev.flush_fraction:.1f}% of gradients flush to zero",
        f"{100 * ev.flush_fraction:.2f}% of gradient elements are below 2^-25, fp16's round-to-zero bound",
        fix="use fp16-mixed (fp32 weights + GradScaler) or bf16-mixed",
        settings={"precision": "fp16-mixed"},
    )


def rule_switch_to_bf16(ev: Evidence) -> Advice | None:
    if ev.compute_dtype != "float16" or not ev.native_bf16:
        return None
    s = ev.scale or {}
    trouble = []
    if ev.nonfinite is not None:
        trouble.append(f"non-finite values under fp16 ({ev.nonfinite.module}, {ev.nonfinite.phase})")
    if s.get("skipped"):
        trouble.append(f"{s['skipped']} loss-scaler skips in {s['steps']} steps")
    if ev.scale_range is not None and not ev.scale_range.representable:
        trouble.append("no single loss scale keeps these gradients inside fp16's range")
    if not trouble:
        return None
    return Advice(
        rule="switch_to_bf16",
        severity="fix" if len(trouble) > 1 else "warn",
        title="This device runs bf16 natively: bf16-mixed has fp32's exponent range and needs no loss scaling",
        evidence=trouble,
        fix="--precision bf16-mixed",
        settings={"precision": "bf16-mixed"},
    )


def rule_clip(ev: Evidence) -> Advice | None:
    tail = ev.long_tail
    if tail is None:
        return None
    evidence = [
        f"{tail.layer}'s gradient norm {tail.norm:.3g} is {tail.ratio:.0f}x the median layer's {tail.median:.3g}"
    ]
    if ev.clip_grad_norm > 0:
        return Advice(
            rule="gradient_long_tail",
            severity="warn",
            title=f"Gradient long tail at {tail.layer}",
            evidence=[*evidence, f"clipping is on (max norm {ev.clip_grad_norm:g})"],
            fix=f"inspect {tail.layer} (the seeds' explosion source); if it persists, lower the "
            "learning rate or keep that layer in fp32",
        )
    return Advice(
        rule="clip_gradients",
        severity="fix",
        title=f"Clip gradients: {tail.layer} dominates the norm",
        evidence=evidence,
        fix="--clip-grad-norm 1.0 (clip after unscaling)",
        settings={"clip_grad_norm": 1.0},
    )


def rule_fidelity(ev: Evidence) -> Advice | None:
    fid = ev.fidelity
    if fid is None or fid.first_below is None:
        return None
    layer = next(item for item in fid.layers if item.name == fid.first_below)
    cosine = "nan" if math.isnan(layer.cosine) else f"{layer.cosine:.4f}"
    return Advice(
        rule="layer_fidelity",
        severity="fix" if fid.verdict == "bad" else "warn",
        title=f"{fid.first_below} is the first layer below cosine {fid.threshold} against fp32",
        evidence=[
            f"{fid.first_below}: cosine {cosine}, relative error {layer.rel_error:.3g}; logits cosine "
            f"{fid.logits_cosine:.4f} ({fid.verdict})"
        ],
        fix=f"keep {fid.first_below} (or the op inside it) in fp32, or use a precision with more "
        "mantissa (bf16-mixed keeps fp32 weights; -true regimes round them)",
        settings={"keep_fp32": fid.first_below},
    )


def rule_smoke(ev: Evidence) -> Advice | None:
    low, ref = ev.smoke, ev.smoke_fp32
    if low is None or low.passed:
        return None
    if ref is not None and not ref.passed:
        return Advice(
            rule="smoke_fails_everywhere",
            severity="fix",
            title="The smoke test fails in fp32 too: the code, not the precision",
            evidence=[low.diagnosis, ref.diagnosis],
            fix="check the model, the loss and the learning rate before tuning precision",
        )
    return Advice(
        rule="smoke_fails",
        severity="fix",
        title=f"{low.precision} cannot overfit 16 samples",
        evidence=[low.diagnosis] + ([ref.diagnosis] if ref else []),
        fix="follow the fixes above; re-run doctor to confirm the smoke test passes",
    )


def _injected(ev: Evidence, caveat: str = "") -> list[str]:
    """The fault `--inject` placed, as a line of evidence (none without one)."""
    return [f"a fault was injected ({ev.injected}){caveat}"] if ev.injected else []


def rule_frozen_layers(ev: Evidence) -> Advice | None:
    """Weights that stopped changing: their updates round away (or their gradients flush to zero)."""
    if not ev.frozen_layers:
        return None
    first = ev.frozen_layers[0]
    names = ", ".join(f.name for f in ev.frozen_layers[:4]) + (", ..." if len(ev.frozen_layers) > 4 else "")
    evidence = [
        f"{f.name} ({f.dtype}) unchanged for {f.steps} optimizer steps since step {f.since_step}; "
        f"{100 * f.zero_grad_fraction:.0f}% of its gradient exactly zero, "
        f"{100 * f.flush_fraction:.0f}% flushing in fp16"
        for f in ev.frozen_layers[:4]
    ]
    return Advice(
        rule="frozen_layers",
        severity="fix",
        title=f"{len(ev.frozen_layers)} layer(s) froze: {names}",
        evidence=evidence,
        fix=first.fix,
    )


def rule_range_audit(ev: Evidence) -> Advice | None:
    """Parts of the model whose fp32 range does not fit the precision's format (fp16; bf16 in theory): an
    overflow before any loss scale can help (forward values). What would not fit fp16 under a wider
    format is a note (`RangeAudit.notes`). The rule keeps its name from when fp16 was the only target."""
    audit = ev.range_audit
    if audit is None:
        return None
    found = [o for o in audit.offenders if not o.kept_fp32]
    if not found:
        return None
    over = [o for o in found if o.status == "over"]
    names = ", ".join(o.module for o in found[:3]) + (", ..." if len(found) > 3 else "")
    one = len(found) == 1
    title = (
        f"{names} {'exceeds' if one else 'exceed'} {audit.format}'s range: "
        f"{'it overflows' if one else 'they overflow'} under {ev.precision}"
        if over
        else f"{names} {'comes' if one else 'come'} within one doubling of {audit.format}'s max under {ev.precision}"
    )
    return Advice(
        rule="range_exceeds_fp16",
        severity="fix" if over else "warn",
        title=title,
        evidence=range_lines(audit, found[:4]),
        fix=range_fix([o.module for o in (over or found)], format_target(audit.format)),
        settings={"keep_fp32": ",".join(o.module for o in (over or found))},
    )


def rule_scaled_grads(ev: Evidence) -> Advice | None:
    """Gradients x the initial loss scale that overflow the format before step 1 (`range_grads`): the
    scaler skips steps and halves until they fit (a warning); no scale fits at all: a fix."""
    audit = ev.range_audit
    if audit is None or not audit.grad_overflows:
        return None
    target = format_target(audit.format, loss_scale=audit.loss_scale)
    found = audit.grad_overflows
    names = ", ".join(o.module for o in found[:3]) + (", ..." if len(found) > 3 else "")
    fits = audit.fitting_scale is not None and audit.fitting_scale >= 1
    return Advice(
        rule="scaled_grads_overflow",
        severity="warn" if fits else "fix",
        title=f"Gradients x loss scale {audit.loss_scale:g} overflow {audit.format} before step 1: {names}",
        evidence=grad_lines(found, target, audit.batches),
        fix=scale_fix(audit.fitting_scale, target),
        settings={"init_scale": audit.fitting_scale} if fits else {},
    )


def rule_adam_eps_fp16(ev: Evidence) -> Advice | None:
    """AdamW's eps rounds to zero in the format the optimizer states live in (`optim_states`)."""
    hazard = adam_eps_hazard(ev.precision)
    if hazard is None:
        return None
    title, evidence, fix = eps_text(hazard)
    return Advice(rule="adam_eps_fp16", severity="warn", title=title, evidence=evidence, fix=fix)


def _range_evidence(ev: Evidence) -> list[str]:
    r = ev.scale_range
    if r is None:
        return []
    if not r.representable:
        return [f"no loss scale fits: underflow needs >= {r.low_pow2:g}, overflow needs <= {r.high_pow2:g}"]
    return [
        f"scales {r.low_pow2:g} .. {r.high_pow2:g} keep the gradients representable (max |g| {r.max_abs:.3g}, "
        f"<= {100 * r.flush_tolerance:g}% flushed)"
    ]


RULES: tuple[Callable[[Evidence], Advice | None], ...] = (
    rule_keep_fp32,
    rule_range_audit,
    rule_scaled_grads,
    rule_adam_eps_fp16,
    rule_not_precision,
    rule_weights_corrupted,
    rule_lower_init_scale,
    rule_raise_init_scale,
    rule_unscaled_fp16,
    rule_switch_to_bf16,
    rule_clip,
    rule_fidelity,
    rule_smoke,
    rule_frozen_layers,
)


def advise(ev: Evidence) -> list[Advice]:
    """Every rule's advice, fixes first; one "info" line when nothing is wrong."""
    found = [a for rule in RULES if (a := rule(ev)) is not None]
    found.sort(key=lambda a: {"fix": 0, "warn": 1}.get(a.severity, 2))
    if not found:
        found.append(
            Advice(
                rule="healthy",
                severity="info",
                title=f"No numeric problems found under {ev.precision}",
                evidence=_range_evidence(ev),
                fix="nothing to do",
            )
        )
    return found
