"""`ampkit doctor`: a numerics diagnosis of one precision on one model, end to end.

Order (each part can be skipped; all share the same seed, model and data):
    device check -> model (+ demo unsafe op, + fp32 fixes) -> fault spec resolved against the model
    0. range audit: the initial model's per-module |activation|, |weight| and |gradient x loss scale| in
       fp32 against the precision's format (fp16, bf16 or fp32)
    1. diagnostic run: `steps` real training steps (the `train` step itself, `Trainer.train_step`)
       with the non-finite locator, gradient statistics and the fault injector attached as hooks;
       the loss-scale trajectory is read from the policy after each step
    2. gradient snapshot in fp32 -> loss-scale range, long-tail layer
    3. smoke test (overfit 16 samples) under the precision and under fp32
    4. per-layer fidelity against fp32
    5. advice
With `--lora RANK` every model is the task's base with LoRA adapters (`ampkit.lora`), its base stored in
the dtype the diagnosed precision implies (fp32 for the fp32 references); the diagnostic run also
measures the adapters' updates lost to rounding and names layers that froze (`ampkit.diagnostics.underflow`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ampkit import __version__
from ampkit.core import build_trainer
from ampkit.core.signals import StopRequests
from ampkit.diagnostics.advice import Advice, Evidence, advise
from ampkit.diagnostics.config import DoctorConfig, doctor_defaults
from ampkit.diagnostics.diagnosed_step import diagnosed_step
from ampkit.diagnostics.gradstats import (
    GradientStatistics,
    StepGradStats,
    layer_of,
    long_tail,
    loss_scale_range,
)
from ampkit.diagnostics.inject import FaultInjector, resolve_module
from ampkit.diagnostics.layer_fidelity import FidelityResult, compare_layers
from ampkit.diagnostics.locator import Finding, NonFiniteLocator
from ampkit.diagnostics.range_audit import RangeAudit, run_range_audit
from ampkit.diagnostics.range_target import precision_target
from ampkit.diagnostics.scale import ScaleTrajectory
from ampkit.diagnostics.smoke import SmokeConfig, SmokeResult, run_smoke_test
from ampkit.diagnostics.underflow import FROZEN_AFTER, FrozenLayer, StepUpdateStats, UpdateUnderflowMeter
from ampkit.diagnostics.unsafe import insert_unsafe_op
from ampkit.diagnostics.whatif import run_what_if
from ampkit.errors import RunInterrupted
from ampkit.hardware import describe_device, pick_device
from ampkit.lora.build import build_lora_model, check_lora_available
from ampkit.precision import (
    REFERENCE,
    build_precision,
    check_supported,
    get_spec,
)
from ampkit.provenance import device_text, provenance
from ampkit.tasks import optional
from ampkit.tasks.check import check_first_batch, check_loss
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import build_task

SCHEMA = "ampkit.doctor/1"
SMOKE_SAMPLES = 16  # the seeds' smoke test: memorize 16 samples
DIAGNOSTIC_WEIGHT_DECAY = 0.1  # as `ampkit train`'s default: the diagnostic run is a short training run


@dataclass
class RunRecord:
    """The diagnostic run, step by step (host values)."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    grad_stats: list[StepGradStats] = field(default_factory=list)
    trajectory: ScaleTrajectory = field(default_factory=ScaleTrajectory)
    locator: dict[str, Any] = field(default_factory=dict)
    nonfinite: Finding | None = None
    """the first non-finite value the loss scaler did not absorb"""
    near_max: Finding | None = None
    scaler_overflows: list[Finding] = field(default_factory=list)
    """backward infs/nans on steps the loss scaler skipped: its normal overflow handling, located"""
    fired: list[int] = field(default_factory=list)
    error: str | None = None
    updates: list[StepUpdateStats] = field(default_factory=list)
    """per step: the updates lost to rounding and the fp16 flush, per layer"""
    frozen: list[FrozenLayer] = field(default_factory=list)

    @property
    def nonfinite_loss_steps(self) -> list[int]:
        return [i + 1 for i, v in enumerate(self.losses) if not math.isfinite(v)]


@dataclass
class DoctorResult:
    config: DoctorConfig
    summary: dict[str, Any]
    run: RunRecord
    advice: list[Advice]
    smoke: dict[str, SmokeResult]
    fidelity: FidelityResult | None
    range_audit: RangeAudit | None = None
    signum: int | None = None
    """the stop signal that interrupted it (the summary says `"status": "interrupted"`), or None"""


ModelHook = Callable[[nn.Module], nn.Module | None]


class _Setup:
    """Device, model factory and data shared by every part of the diagnosis."""

    def __init__(self, config: DoctorConfig, model_hook: ModelHook | None, task=None):
        self.device = pick_device(config.device)
        self.info = describe_device(self.device)
        config, self.warnings = doctor_defaults(config, self.info)
        self.config = config
        self.emulated = bool(check_supported(config.precision, self.info))  # its warnings are emulation's
        check_lora_available(config.lora, device=self.device, precision=config.precision)
        self.spec = get_spec(config.precision)
        self.task = task if task is not None else build_task(config.task_spec())  # the workload (`ampkit.tasks`)
        self.model_hook = model_hook
        probe = self.fresh_model()  # validates --inject, --unsafe-op paths before any work
        config.overrides.resolve(probe)  # --keep-fp32's patterns too: one line naming a pattern that matches nothing
        if config.fault:
            resolve_module(probe, config.fault.module)
        self.parameters = sum(p.numel() for p in probe.parameters())
        self.sampler = self.task.train_stream(batch_size=config.batch_size, seed=config.seed)
        self._data_start = self.sampler.state_dict()
        self.first_batch = self.sampler.next_batch().to(self.device)
        self.sampler.load_state_dict(self._data_start)
        if not isinstance(self.task, LanguageModelTask):  # a user's task: its first batch must make sense first
            self._check_first_batch(probe)

    def _check_first_batch(self, probe: nn.Module) -> None:
        """The task's first batch under the diagnosed precision, the probe as every part runs it (converted:
        a -true regime's weights); its loss must be finite in fp32 only (non-finite in the diagnosed
        precision is what doctor diagnoses: a SigLIP-like overflow under fp16)."""
        reference = self.spec.is_reference
        policy = self.policy()
        converted = policy.convert_module(probe)
        check_first_batch(self.task, converted, self.first_batch, device=self.device, policy=policy, finite=reference)
        if not reference:
            fp32 = build_precision(REFERENCE, device_type=self.device.type)
            check_loss(self.task, self.fresh_model(REFERENCE), self.first_batch, policy=fp32)

    def fresh_sampler(self):
        """The data stream from its first batch (tokenizing the corpus once, not per part)."""
        self.sampler.load_state_dict(self._data_start)
        return self.sampler

    def fresh_model(self, precision: str | None = None) -> nn.Module:
        """The same initial weights every call (seeded), with the demo op and fp32 fixes applied; with
        `--lora`, the base stored as `precision` (default: the diagnosed one) implies, adapted."""
        cfg = self.config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model = self._build(precision or cfg.precision)
            if cfg.unsafe_op:
                insert_unsafe_op(model, cfg.unsafe_op)
            if self.model_hook is not None:
                model = self.model_hook(model) or model
        return model.to(self.device)

    def _build(self, precision: str) -> nn.Module:
        cfg = self.config
        if not cfg.lora.enabled:
            return self.task.build_model(device=self.device, seed=cfg.seed)
        return build_lora_model(self.task, cfg.lora, precision=precision, device=self.device, seed=cfg.seed)[0]

    def policy(self):
        cfg = self.config
        return build_precision(
            cfg.precision,
            device_type=self.device.type,
            scaler=cfg.scaler,
            overrides=cfg.overrides,  # --keep-fp32: the fix applies where the policy prepares each model
        )


def diagnostic_run(setup: _Setup, record: RunRecord | None = None, *, stop: Callable[[], None] = lambda: None):
    """`steps` training steps with the locator, gradient statistics and the injector attached, into
    `record` (returned). `stop()` is called before each step (it raises to interrupt: `record` then
    holds the steps done)."""
    cfg, record = setup.config, record if record is not None else RunRecord()
    policy = setup.policy()
    model = policy.convert_module(setup.fresh_model())
    trainer = build_trainer(
        model,
        policy,
        setup.fresh_sampler(),
        device=setup.device,
        optimizer="adamw",
        lr=cfg.lr,
        weight_decay=DIAGNOSTIC_WEIGHT_DECAY,
        warmup_steps=min(5, cfg.steps),
        total_steps=cfg.steps,
        min_lr_ratio=0.1,
        clip_grad_norm=cfg.clip_grad_norm,
        loss_fn=setup.task.loss,
        count_fn=setup.task.count,
    )
    locator = NonFiniteLocator(model, ring_size=cfg.ring_size)
    stats = GradientStatistics(model, every=1, scale_fn=policy.loss_scale)
    frozen_after = max(1, min(FROZEN_AFTER, cfg.steps // 2))
    updates = UpdateUnderflowMeter(model, trainer.optimizer, frozen_after=frozen_after, scale_fn=policy.loss_scale)
    injector = FaultInjector(model, cfg.fault) if cfg.fault else None
    record.trajectory.start(policy.loss_scale())
    hooks = [h for h in (injector, locator, stats, updates) if h is not None]
    for hook in hooks:
        hook.attach()
    try:
        with policy.run_context():
            _run_steps(trainer, policy, (locator, stats, updates), record, cfg.steps, stop=stop)
    finally:
        for hook in hooks:
            hook.detach()
        record.frozen = updates.frozen
        record.locator = locator.summary()
        record.nonfinite, record.near_max = locator.first_nonfinite, locator.first_near_max
        record.fired = list(injector.fired) if injector else []
    return record


def _run_steps(trainer, policy, meters, record: RunRecord, steps: int, *, stop: Callable[[], None]) -> None:
    locator, stats, updates = meters
    for step in range(1, steps + 1):
        stop()
        locator.begin_step(step)
        stats.begin_step(step)
        updates.begin_step(step)
        if diagnosed_step(trainer, policy, locator, stats, record, step) is None:  # the loss scale collapsed
            trainer.optimizer.zero_grad(set_to_none=True)
            break
        record.updates.extend(updates.drain())


def gradient_snapshot(setup: _Setup):
    """True-scale fp32 gradients of the initial model on one batch: the distribution fp16 must hold."""
    model = setup.fresh_model(REFERENCE)
    batch = setup.first_batch
    loss, _ = setup.task.loss(model, batch)  # fp32 model, no policy: the true-scale reference gradients
    loss.backward()
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    layer_sq: dict[str, float] = {}
    for name, grad in named:
        layer_sq[layer_of(name)] = layer_sq.get(layer_of(name), 0.0) + grad.float().pow(2).sum().item()
    norms = {k: math.sqrt(v) for k, v in layer_sq.items()}
    return loss_scale_range([g for _, g in named]), long_tail(norms), norms


class _StopCheck:
    """A smoke-test observer: `stop()` before each step (it raises to interrupt)."""

    def __init__(self, stop: Callable[[], None]):
        self.stop = stop

    def begin_step(self, step: int) -> None:
        self.stop()


def smoke_tests(
    setup: _Setup, results: dict[str, SmokeResult] | None = None, *, stop: Callable[[], None] = lambda: None
) -> dict[str, SmokeResult]:
    """The overfit test under the precision (with the fault, if any) and under fp32 (never faulted),
    into `results` (returned); `stop()` is called before each step (it raises to interrupt). fp32's
    run is the control that convicts a failing precision: where the precision is emulated (slow) and
    passed, it is not needed and not run."""
    cfg, results = setup.config, results if results is not None else {}
    batch = optional.smoke_batch(setup.task, samples=SMOKE_SAMPLES, seed=cfg.seed).to(setup.device)
    smoke_cfg = SmokeConfig(seq_len=cfg.smoke_seq_len, max_steps=cfg.smoke_steps)
    for name in dict.fromkeys([cfg.precision, REFERENCE]):
        if name != cfg.precision and setup.emulated and results[cfg.precision].passed:
            break
        policy = setup.policy() if name == cfg.precision else build_precision(REFERENCE, device_type=setup.device.type)
        model = policy.convert_module(setup.fresh_model(name))
        injector = FaultInjector(model, cfg.fault).attach() if cfg.fault and name == cfg.precision else None
        observers: list = [_StopCheck(stop), *([injector] if injector else [])]
        try:
            results[name] = run_smoke_test(model, policy, batch, task=setup.task, config=smoke_cfg, observers=observers)
        finally:
            if injector:
                injector.detach()
    return results


def _final_flush_fraction(stats: list[StepGradStats]) -> float | None:
    for step in reversed(stats):
        total = sum(t.numel for t in step.tensors)
        if total:
            return sum(t.flush_fraction * t.numel for t in step.tensors) / total
    return None


def run_doctor(
    config: DoctorConfig,
    *,
    model_hook: ModelHook | None = None,
    progress: Callable[[str], None] = lambda message: None,
    warn: Callable[[str], None] = lambda message: None,
    task=None,
) -> DoctorResult:
    """The whole diagnosis. `model_hook(model)` may modify (or replace) each freshly built model,
    e.g. to insert a custom op; `progress` receives one line per part; `warn` each warning, before
    the run (an emulated precision: slow, and the shorter defaults chosen); `task`: a task object
    (the Python API), by default the one `config.model.task` names.

    SIGINT/SIGTERM end it at the next step: the parts finished make the summary (`"status":
    "interrupted"`, `"interrupted"`: the signal, the part it stopped, the parts finished; no advice),
    and `DoctorResult.signum` is set (the caller writes it, then exits 128 + signal)."""
    started = time.perf_counter()
    setup = _Setup(config, model_hook, task)
    config = setup.config
    for warning in setup.warnings:
        warn(warning)
    parts = _Parts()
    with StopRequests() as stops:
        try:
            _run_parts(setup, parts, progress, stop=lambda: stops.check("doctor interrupted"))
        except RunInterrupted:
            pass
    interrupted = None
    if stops.signum is not None:
        interrupted = {"signal": stops.name, "during": parts.current, "finished": parts.finished}
        advice: list[Advice] = []
    else:
        advice = advise(_evidence(setup, parts))
    summary = build_summary(
        setup,
        parts.run,
        parts.scale_range,
        parts.tail,
        parts.layer_norms,
        parts.smoke,
        parts.fidelity,
        advice,
        wall_s=time.perf_counter() - started,
        interrupted=interrupted,
        what_if=parts.what_if,
        range_audit=parts.range_audit,
    )
    return DoctorResult(
        config=config,
        summary=summary,
        run=parts.run,
        advice=advice,
        smoke=parts.smoke,
        fidelity=parts.fidelity,
        range_audit=parts.range_audit,
        signum=stops.signum,
    )


@dataclass
class _Parts:
    """What the diagnosis has measured so far (an interrupted one writes these)."""

    run: RunRecord = field(default_factory=RunRecord)
    scale_range: Any = None
    tail: Any = None
    layer_norms: dict[str, float] = field(default_factory=dict)
    smoke: dict[str, SmokeResult] = field(default_factory=dict)
    fidelity: FidelityResult | None = None
    what_if: dict[str, Any] | None = None
    range_audit: RangeAudit | None = None
    current: str | None = None
    finished: list[str] = field(default_factory=list)

    def begin(self, part: str, progress: Callable[[str], None], line: str) -> None:
        if self.current is not None:
            self.finished.append(self.current)
        self.current = part
        progress(line)

    def end(self) -> None:
        if self.current is not None:
            self.finished.append(self.current)
        self.current = None


def _run_parts(setup: _Setup, parts: _Parts, progress: Callable[[str], None], *, stop: Callable[[], None]) -> None:
    """The diagnosis's parts in order, each into `parts`; `stop()` raises between steps to interrupt."""
    config = setup.config
    if config.range_audit:
        fmt = precision_target(config.precision).format
        line = f"range audit: fp32 |activation|, |weight|, |grad| per module vs {fmt} ({config.range_batches} batches)"
        parts.begin("range audit", progress, line)
        parts.range_audit = range_audit(setup)
        stop()
    line = f"diagnostic run: {config.steps} steps of {config.precision} with the locator attached"
    parts.begin("diagnostic run", progress, line)
    diagnostic_run(setup, parts.run, stop=stop)
    stop()
    parts.begin("gradient snapshot", progress, "gradient snapshot: loss-scale range and per-layer norms")
    parts.scale_range, parts.tail, parts.layer_norms = gradient_snapshot(setup)
    if config.smoke:
        stop()
        parts.begin("smoke test", progress, "smoke test: overfit 16 samples")
        smoke_tests(setup, parts.smoke, stop=stop)
    if config.fidelity and not setup.spec.is_reference:
        stop()
        parts.begin("per-layer fidelity", progress, "per-layer fidelity against fp32")
        model = setup.fresh_model(REFERENCE)  # fp32 weights (a LoRA base too); compare_layers converts a copy
        parts.fidelity = compare_layers(
            model,
            setup.first_batch,
            precision=setup.policy(),
            device_type=setup.device.type,
            loss_fn=setup.task.loss,
            blocks=optional.repeated_blocks(setup.task, model),
        )
    if config.what_if:
        stop()
        formats = config.what_if_format_list()
        line = f"what-if ledger: {config.what_if_batches} fp32 batches, each Linear in {len(formats)} formats"
        parts.begin("what-if ledger", progress, line)
        parts.what_if = what_if_ledger(setup, formats)
    parts.end()


def range_audit(setup: _Setup) -> RangeAudit:
    """The range audit (`diagnostics.range_audit`) of the task's initial fp32 model on the diagnosis's
    first batches, through the step's own forward-and-loss and backward under the fp32 policy, against
    the diagnosed precision's format and initial loss scale (`range_target.precision_target`)."""
    model = setup.fresh_model(REFERENCE)
    policy = build_precision(REFERENCE, device_type=setup.device.type)
    sampler = setup.fresh_sampler()
    batches = (sampler.next_batch().to(setup.device) for _ in range(setup.config.range_batches))
    blocks = optional.repeated_blocks(setup.task, model)
    target = precision_target(setup.config.precision, loss_scale=setup.policy().loss_scale())
    return run_range_audit(
        model,
        batches,
        policy=policy,
        loss_fn=setup.task.loss,
        blocks=blocks,
        keep_fp32=setup.config.fp32_paths,
        target=target,
    )


def what_if_ledger(setup: _Setup, formats: list[str]) -> dict[str, Any]:
    """The what-if ledger (`diagnostics.whatif`) of the task's fp32 model on the diagnosis's first
    batches, through the step's own forward-and-loss and the fp32 policy's backward."""
    model = setup.fresh_model(REFERENCE)
    policy = build_precision(REFERENCE, device_type=setup.device.type)
    sampler = setup.fresh_sampler()
    batches = (sampler.next_batch().to(setup.device) for _ in range(setup.config.what_if_batches))
    return run_what_if(model, batches, policy=policy, loss_fn=setup.task.loss, formats=formats)


def _evidence(setup: _Setup, parts: _Parts) -> Evidence:
    cfg, spec, run, smoke = setup.config, setup.spec, parts.run, parts.smoke
    return Evidence(
        precision=cfg.precision,
        compute_dtype=str(spec.compute_dtype).replace("torch.", ""),
        loss_scaling=spec.loss_scaling,
        device_type=setup.device.type,
        native_bf16=setup.info.native_bf16,
        init_scale=cfg.scaler.init_scale,
        clip_grad_norm=cfg.clip_grad_norm,
        injected=cfg.inject or None,
        nonfinite=run.nonfinite,
        near_max=run.near_max,
        nonfinite_loss_steps=run.nonfinite_loss_steps,
        scale=run.trajectory.summary(),
        scale_range=parts.scale_range,
        flush_fraction=_final_flush_fraction(run.grad_stats),
        long_tail=parts.tail,
        smoke=smoke.get(cfg.precision),
        smoke_fp32=smoke.get(REFERENCE) if not spec.is_reference else None,
        fidelity=parts.fidelity,
        frozen_layers=run.frozen,
        range_audit=parts.range_audit,
    )


def _run_blocks(run: RunRecord) -> dict[str, Any]:
    """summary.json's `run`, `locator` and `scale`: the diagnostic run's losses, findings and loss scale."""
    trajectory = run.trajectory
    return {
        "run": {
            "steps": len(run.losses),
            "losses": run.losses,
            "grad_norms": run.grad_norms,
            "nonfinite_loss_steps": run.nonfinite_loss_steps,
            "error": run.error,
        },
        "locator": run.locator | {"scaler_overflows": [f.to_dict(frames=False) for f in run.scaler_overflows]},
        "scale": trajectory.summary()
        | {
            "points": [
                {"step": s, "scale": v, "skipped": k}
                for s, v, k in zip(trajectory.steps, trajectory.scales, trajectory.skipped)
            ]
        },
    }


def build_summary(
    setup: _Setup,
    run: RunRecord,
    scale_range,
    tail,
    layer_norms,
    smoke,
    fidelity,
    advice,
    *,
    wall_s: float,
    interrupted: dict[str, Any] | None = None,
    what_if: dict[str, Any] | None = None,
    range_audit: RangeAudit | None = None,
) -> dict[str, Any]:
    """doctor's summary.json (schema "ampkit.doctor/1"); an interrupted diagnosis (`interrupted`:
    `signal`, `during`, `finished`) holds the parts it finished, `gradients.scale_range` null before
    the gradient snapshot."""
    cfg = setup.config
    fixes = [a for a in advice if a.severity == "fix"]
    return {
        "schema": SCHEMA,
        "command": "doctor",
        "ampkit_version": __version__,
        "status": "interrupted" if interrupted else ("problems" if fixes else "healthy"),
        "interrupted": interrupted,
        "provenance": provenance(device=device_text(setup.info), config=asdict(cfg)),
        "config": asdict(cfg),
        "device": {"type": setup.device.type, "name": setup.info.name, "native_bf16": setup.info.native_bf16},
        "warnings": setup.warnings,
        "task": optional.describe(setup.task),
        "model": {
            "preset": setup.task.name,
            "parameters": setup.parameters,
            "unsafe_op": cfg.unsafe_op or None,
            "fp32_modules": cfg.fp32_paths,
        },
        "inject": {"spec": cfg.inject, "fired_steps": run.fired} if cfg.inject else None,
        **_run_blocks(run),
        "gradients": {
            "scale_range": scale_range.to_dict() if scale_range is not None else None,
            "long_tail": tail.to_dict() if tail else None,
            "layer_norms_fp32": layer_norms,
            "steps": [s.to_dict() for s in run.grad_stats],
        },
        "updates": {
            "frozen_layers": [f.to_dict() for f in run.frozen],
            "steps": [u.to_dict() for u in run.updates],
        },
        "lora": cfg.lora.describe(cfg.precision) if cfg.lora.enabled else None,
        "smoke": {name: r.to_dict() for name, r in smoke.items()},
        "fidelity": fidelity.to_dict() if fidelity else None,
        "what_if": what_if,
        "range_audit": range_audit.to_dict() if range_audit else None,
        "replay": None,  # doctor --from RUN: the replayed window and its verdict (diagnostics/replay.py)
        "try_fixes": None,  # doctor --from RUN --try-fixes: each fix on that window (diagnostics/try_fixes.py)
        "advice": [a.to_dict() for a in advice],
        "wall_s": wall_s,
    }
