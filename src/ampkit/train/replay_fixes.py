"""`doctor --from RUN --try-fixes`: the failing window replayed once per fix, each from the same checkpoint.

A fix is run settings (`ampkit.diagnostics.try_fixes`) applied to the run's saved config (`apply_fix`:
keep_fp32 joins the run's own --keep-fp32, the loss scaler's and the optimizer's settings replace theirs,
precision the run's). The run is then built fresh from that config (a replay changes the model: a keep-fp32
wraps forwards in place, the optimizer steps) and restored by the run's own checkpointer, its identity the
unfixed run's (a fix changes the precision, not which checkpoint is read). The window runs through
`ampkit.train.replay.replay_once`, the one replay the unfixed passes took (handed in bound to the run:
`replay_with_config`, so this module does not import replay.py, which calls it).

What the checkpoint would undo: the loss scale. The checkpoint restores the run's scaler, its scale
included, so an init-scale fix restarts the scale after the restore (`restart_loss_scale`); min-scale and
hysteresis are the scaler's settings, not its state, and apply as built. A bf16 policy takes no state from
an fp16 run's scaler (`AutocastPrecision.load_state_dict`). Memory: the unfixed run's objects stay while one
fixed run at a time is built beside them (each dropped before the next).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from ampkit.diagnostics.replay import ReplayPass
from ampkit.diagnostics.try_fixes import (
    SCALER_SETTINGS,
    Fix,
    FixOutcome,
    fix_label,
    fixes_to_try,
    outcome,
    try_fixes_block,
)
from ampkit.errors import UsageError
from ampkit.precision import ModuleOverrides, get_spec
from ampkit.train.build import RunObjects
from ampkit.train.config import TrainConfig


def apply_fix(config: TrainConfig, settings: dict[str, Any]) -> TrainConfig:
    """`config` with the fix's settings; the config's own checks run again (a bad value: UsageError)."""
    changes: dict[str, Any] = {}
    if "keep_fp32" in settings:
        changes["keep_fp32"] = ",".join(p for p in (config.keep_fp32, settings["keep_fp32"]) if p)
    if "precision" in settings:
        changes["precision"] = settings["precision"]
    scaler = {k: settings[k] for k in SCALER_SETTINGS if k in settings}
    if scaler:
        changes["scaler"] = dataclasses.replace(config.scaler, **scaler)
    if "clip_grad_norm" in settings:
        changes["optimizer"] = dataclasses.replace(config.optimizer, clip_grad_norm=settings["clip_grad_norm"])
    return dataclasses.replace(config, **changes)


def check_fixes(fixes: list[dict[str, Any]], *, config: TrainConfig, model: nn.Module) -> None:
    """`--also-try`'s fixes against the run, before any replay: each must apply to its config, a loss-scaler
    setting needs a precision with a loss scaler, and each keep-fp32 pattern must name a module."""
    for settings in fixes:
        label = fix_label(settings)
        try:
            fixed = apply_fix(config, settings)
            if "keep_fp32" in settings:
                ModuleOverrides.keep_fp32(settings["keep_fp32"]).resolve(model)
        except UsageError as err:
            raise UsageError(f"--also-try {label}: {err}") from None
        if any(k in settings for k in SCALER_SETTINGS) and not get_spec(fixed.precision).loss_scaling:
            raise UsageError(
                f"--also-try {label}: {fixed.precision} has no loss scaler, so a loss-scale setting changes "
                "nothing; try it on an fp16-mixed run, or with precision=fp16-mixed"
            )


def restart_loss_scale(objs: RunObjects, scale: float) -> None:
    """An init-scale fix after the checkpoint's restore: the scaler restarted at `scale` (its growth count
    at 0), through the policy's own state; a policy without a scaler (empty state) is left as it is."""
    state = objs.policy.state_dict()
    scaler = state.get("scaler")
    if scaler:
        objs.policy.load_state_dict(state | {"scaler": scaler | {"scale": float(scale), "_growth_tracker": 0}})


ReplayWith = Callable[[TrainConfig, Callable[[RunObjects], None] | None], ReplayPass]
"""`ampkit.train.replay.replay_with_config`, bound to the run and its window: a config (the fixed one) and
what to change after the checkpoint's restore -> the window's replay"""


def _replay_fixed(fix: Fix, *, config: TrainConfig, replay: ReplayWith) -> ReplayPass:
    """The window replayed with `fix`, by a run built fresh from the fixed config."""
    scale = fix.settings.get("init_scale")
    restart = (lambda objs: restart_loss_scale(objs, scale)) if scale is not None else None
    return replay(apply_fix(config, fix.settings), restart)


def run_fixes(
    *,
    advice: list[dict[str, Any]],
    also: list[dict[str, Any]],
    unfixed: ReplayPass,
    config: TrainConfig,
    replay: ReplayWith,
    window: dict[str, int],
    unit: str,
) -> dict[str, Any]:
    """Each fix of `advice` (with settings) and `also` replayed on the run of `config` (`_replay_fixed`);
    summary.json's `try_fixes`. `unfixed`: an unfixed replay of the window (each fix's cost is against its
    tokens/s); `window`: checkpoint, first, last. A fix the device or the run refuses when it is built (a
    precision this device lacks) is recorded with its reason, not run."""
    base = outcome(None, unfixed, last_step=window["last"], unfixed_rate=None)
    base = dataclasses.replace(base, cost_ratio=1.0 if base.tokens_per_s else None)
    results: list[FixOutcome] = []
    for fix in fixes_to_try(advice, also):
        try:
            replayed = _replay_fixed(fix, config=config, replay=replay)
        except UsageError as err:
            results.append(FixOutcome(fix=fix.label, source=fix.source, settings=dict(fix.settings), error=str(err)))
            continue
        results.append(outcome(fix, replayed, last_step=window["last"], unfixed_rate=base.tokens_per_s))
    return try_fixes_block(base, results, unit=unit, window=window)
