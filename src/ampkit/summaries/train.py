"""The training runs' summary kinds: `ampkit train` ("ampkit.train/1"; older summaries: `"command": "train"`
and no "schema") and `ampkit doctor` ("ampkit.doctor/1"). docs/train.md and docs/doctor.md describe them."""

from __future__ import annotations

from ampkit.summaries.kind import PROVENANCE, WARNINGS, Older, SummaryKind
from ampkit.summaries.spec import NUM, OPT_NUM, Absent, ListOf, MapOf, OneOf, Opt

TASK = {"name": str, "unit": str}
"""`tasks.optional.describe(task)`: its name and unit, then whatever the task reports (preset, corpus, ...)."""

RANK_TIMES = {"rank": int, "windows": int, "step_ms_median": OPT_NUM, "step_ms_p90": OPT_NUM, "straggler": OPT_NUM}
"""One rank's step times over its measured log windows and its median over the fastest rank's (`train.rank_times`)."""

TRAIN = SummaryKind(
    name="train",
    schema="ampkit.train/1",
    title="ampkit train: one training run",
    fields={
        "schema_version": OneOf(1),
        "command": OneOf("train"),
        "ampkit_version": str,
        "provenance": Absent(PROVENANCE),  # Absent: summaries before "schema" lack it (and task, unit, ...)
        "status": OneOf("completed", "stopped", "failed", "diverged"),
        "error": Opt(str),
        "config": dict,
        "device": {"type": str, "name": str},
        "warnings": WARNINGS,
        "task": Absent(TASK),
        "unit": Absent(str),
        "model": {"preset": str, "parameters": Opt(int)},
        "data": {"corpus": Opt(str), "format": Absent(Opt(str))},
        "steps": int,
        "tokens": int,
        "first_loss": OPT_NUM,
        "final_loss": OPT_NUM,
        "eval_loss_initial": OPT_NUM,
        "eval_loss": OPT_NUM,
        "eval_history": ListOf({"step": int, "eval_loss": OPT_NUM}),
        "items_per_s": Absent(OPT_NUM),
        "tokens_per_s": OPT_NUM,
        "processed_per_s": Absent(OPT_NUM),
        "image_tokens_per_s": Absent(OPT_NUM),  # a VLM's image tokens among the processed ones
        "step_ms_median": OPT_NUM,
        "skipped_steps": int,
        "final_loss_scale": OPT_NUM,
        "peak_memory": dict,
        "throughput": Absent(dict),
        "lora": Absent(Opt(dict)),
        "wall_s": NUM,
        "guard": Absent({"enabled": bool}),
        "diagnostics": Absent(dict),
        "parallel": Absent({"mode": str, "world_size": int}),
        "ranks": Absent(Opt(ListOf(RANK_TIMES))),  # a data-parallel run that completed or stopped
    },
    older=(Older(schema=None, command="train"),),
)

ADVICE = {
    "rule": str,
    "severity": OneOf("fix", "warn", "info"),
    "title": str,
    "evidence": ListOf(str),
    "fix": str,
    "settings": Absent(dict),  # the fix as run settings (--try-fixes applies them); summaries before it lack it
}
"""One finding -> fix (`diagnostics.advice.Advice`)."""

WHAT_IF = {
    "batches": int,
    "reference": str,
    "formats": ListOf(str),
    "format_range_binades": MapOf(NUM),
    "tensors": ListOf(str),
    "head": Opt(str),
    "layers": ListOf({"name": str, "in_features": int, "out_features": int, "formats": MapOf(dict)}),
    "keep_bf16": MapOf(ListOf({"layer": str, "why": str})),
    "notes": ListOf(str),
}
"""`doctor --what-if`: each Linear's GEMM inputs rounded to each format (`diagnostics.whatif`)."""

RANGE_AUDIT = {
    "format": str,
    "max": NUM,
    "smallest_normal": NUM,
    "near_bits": NUM,
    "batches": int,
    "modules": ListOf(
        {
            "name": str,
            "cls": str,
            "calls": int,
            "output_max": OPT_NUM,
            "input_max": OPT_NUM,
            "weight_max": OPT_NUM,
            "headroom_bits": OPT_NUM,
            "underflow_fraction": OPT_NUM,
            "status": OneOf("over", "near", "ok"),
            "output_grad_max": Absent(OPT_NUM),
            "weight_grad_max": Absent(OPT_NUM),
            "grad_scaled_max": OPT_NUM,
        }
    ),
    "offenders": ListOf(
        {
            "module": str,
            "origin": str,
            "site": OneOf("outputs", "weights"),
            "max_abs": NUM,
            "headroom_bits": NUM,
            "status": OneOf("over", "near"),
            "kept_fp32": bool,
            "fix": str,
        }
    ),
    "min_headroom_bits": OPT_NUM,
    "tightest": Opt(str),
    "notes": ListOf(str),
    # added with the backward side (`diagnostics.range_grads`); absent in summaries written before it
    "loss_scale": Absent(NUM),
    "grad_max": Absent(OPT_NUM),
    "fitting_scale": Absent(OPT_NUM),
    "grad_overflows": Absent(
        ListOf({"module": str, "site": str, "grad_max": NUM, "scaled_max": NUM, "headroom_bits": NUM})
    ),
}
"""doctor's range audit: each module's fp32 range (activations, weights, gradients x the initial loss scale)
against the diagnosed precision's format (`diagnostics.range_audit`, `range_target`)."""

REPLAY_PASS = {
    "steps": ListOf(int),
    "losses": ListOf(OPT_NUM),
    "grad_norms": ListOf(OPT_NUM),
    "nonfinite_loss_steps": ListOf(int),
    "first_nonfinite": Opt(dict),
    "fired_steps": ListOf(int),
    "error": Opt(str),
}
"""One replay of the window (`diagnostics.replay.ReplayPass`): the steps it ran, their losses and gradient norms,
where it first went non-finite (null: it stayed finite) and the steps an injected fault fired at."""

REPLAY = {
    "source": {
        "from": str,
        "run_dir": str,
        "checkpoint": str,
        "checkpoint_step": int,
        "recorded": Opt(str),
        "recorded_failure_step": Opt(int),
        "recorded_finding": Opt(dict),
        "recorded_device": Opt(str),
        "replay_device": Opt(str),
    },
    "window": {"first": int, "last": int},
    "passes_run": int,
    "passes": ListOf(REPLAY_PASS),
    "attribution": {
        "verdict": OneOf("numerics", "transient", "inconclusive"),
        "reason": str,
        "site": Opt({"step": int, "module": str, "phase": str}),
        "note": str,
    },
}
"""`doctor --from RUN_DIR[@STEP]`: the train run's window replayed from its checkpoint, each pass's outcome and
the verdict (`diagnostics.replay`: "numerics" repeats, "transient" did not, "inconclusive" disagreed)."""

FIX_OUTCOME = {
    "fix": str,
    "source": str,
    "settings": dict,
    "finite": bool,
    "first_nonfinite_step": Opt(int),
    "where": Opt(str),
    "steps_run": int,
    "tokens_per_s": OPT_NUM,
    "cost_ratio": OPT_NUM,
    "error": Opt(str),
}
"""One window replayed with one fix, or without (`diagnostics.try_fixes.FixOutcome`)."""

TRY_FIXES = {
    "unit": str,
    "window": {"checkpoint": int, "first": int, "last": int},
    "unfixed": FIX_OUTCOME,
    "fixes": ListOf(FIX_OUTCOME),
    "note": str,
}
"""`doctor --from RUN --try-fixes`: the window replayed with each fix (`diagnostics.try_fixes`)."""

DOCTOR = SummaryKind(
    name="doctor",
    schema="ampkit.doctor/1",
    title="ampkit doctor: one precision's numerics diagnosed",
    fields={
        "command": OneOf("doctor"),
        "ampkit_version": str,
        # "failed" (with "error"): a write failed after the summary was written (`runs.summary_marks_write_failure`)
        "status": OneOf("healthy", "problems", "interrupted", "failed"),
        "interrupted": Absent(Opt({"signal": str, "during": Opt(str), "finished": ListOf(str)})),
        "provenance": Absent(PROVENANCE),
        "config": dict,
        "device": {"type": str, "name": str, "native_bf16": bool},
        "warnings": WARNINGS,
        "task": Absent(TASK),
        "model": {"preset": str, "parameters": Opt(int)},
        "inject": Opt({"spec": str, "fired_steps": list}),
        "run": {"steps": int, "losses": ListOf(OPT_NUM), "grad_norms": ListOf(OPT_NUM), "error": Opt(str)},
        "locator": dict,
        "scale": {"active": bool, "points": ListOf({"step": int, "scale": OPT_NUM, "skipped": bool})},
        "gradients": {"scale_range": Opt(dict), "long_tail": Opt(dict), "steps": ListOf(dict)},
        "updates": {"frozen_layers": ListOf(dict), "steps": ListOf(dict)},
        "lora": Absent(Opt(dict)),
        "smoke": MapOf({"precision": str, "passed": bool}),
        "fidelity": Opt(dict),
        "what_if": Absent(Opt(WHAT_IF)),
        "range_audit": Absent(Opt(RANGE_AUDIT)),
        "replay": Absent(Opt(REPLAY)),  # doctor --from RUN: the replayed window and its verdict
        "try_fixes": Absent(Opt(TRY_FIXES)),  # doctor --from RUN --try-fixes: each fix on that window
        "advice": ListOf(ADVICE),
        "wall_s": NUM,
    },
)
