"""Assemble a plan: every configuration's ledger, fit and compute, and the advice (the summary).

`build_plan(config)` returns the `summary.json` document (schema "ampkit.plan/1"); `build_kv(config)`
the `ampkit kv` one ("ampkit.kv/1"). Memory fields are bytes unless named *_gib (GiB = 1024**3).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any

from ampkit.hardware import GpuSpec
from ampkit.hardware.links import LinkSpec, default_link, lookup_link
from ampkit.plan.advice import base_precision, cheapest_fix, fix_settings, fp8_note
from ampkit.plan.analytic.comms import step_communication
from ampkit.plan.analytic.compute import step_compute
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.config import DEFAULT_SEQ_LEN, KvConfig, PlanConfig
from ampkit.plan.describe import ModelDescription, describe_model
from ampkit.plan.describe.vlm import VLMDescription
from ampkit.plan.engines import hf_traced_engine, primary_engine
from ampkit.plan.fit import Target, resolve_target
from ampkit.plan.kv.budget import kv_budget, pool_budget
from ampkit.plan.numerics import get_numerics
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.overrides import adjust_weights, kept_parameters, meta_model, states_delta, weights_delta
from ampkit.plan.setting import GIB, TENSOR_LINES, Ledger, Reserve, StepSetting
from ampkit.precision import ConversionRefused, LowBitPrecision, build_precision, get_spec

PLAN_SCHEMA = "ampkit.plan/1"
KV_SCHEMA = "ampkit.kv/1"
TOTAL_TOLERANCE = 0.05  # analytic vs traced, on the tensor peak
LINE_TOLERANCE = 0.10  # per line ...
LINE_FLOOR = 0.01  # ... or within 1% of the tensor peak, for lines too small for a ratio to mean much
UNITS = {
    "memory": "bytes; fields ending in _gib are GiB (1024**3 bytes)",
    "flops": "FLOPs",
    "rates": "FLOP/s",
    "time": "seconds",
}


def ledger_kwargs(config: PlanConfig) -> dict[str, Any]:
    """The engines' and searches' `reserve` keyword, from --context-gib and --fragmentation."""
    return {"reserve": Reserve(context_bytes=int(config.context_gib * GIB), fragmentation=config.fragmentation)}


def settings_of(config: PlanConfig) -> list[StepSetting]:
    combos = itertools.product(config.precision_list(), config.optimizer_list(), config.checkpointing_list())
    return [_setting(config, precision=p, optimizer=o, checkpointing=c) for p, o, c in combos]


def _setting(config: PlanConfig, *, precision: str, optimizer: str, checkpointing: str) -> StepSetting:
    """A step with `config`'s batch, sequence and parallelism."""
    return StepSetting(
        precision=precision,
        optimizer=optimizer,
        checkpointing=checkpointing,
        micro_batch=config.batch_size,
        seq_len=config.seq_len or DEFAULT_SEQ_LEN,  # 0: not resolved for a model (a task's plan)
        grad_accum=config.grad_accum,
        world_size=config.world_size,
        parallel=config.parallel,
    )


def agreement(analytic: Ledger, traced: Ledger) -> dict[str, Any]:
    """Relative differences, analytic vs traced; `within` applies the acceptance tolerances."""
    peak = traced.tensor_peak
    lines, within = {}, abs(analytic.tensor_peak - peak) <= TOTAL_TOLERANCE * peak
    for line in TENSOR_LINES:
        a, t = analytic.at_peak[line], traced.at_peak[line]
        rel = (a - t) / t if t else (0.0 if a == 0 else None)
        ok = abs(a - t) <= max(LINE_TOLERANCE * t, LINE_FLOOR * peak)
        within = within and ok
        lines[line] = {"analytic_bytes": a, "traced_bytes": t, "relative": rel, "within": ok}
    total_rel = (analytic.tensor_peak - peak) / peak if peak else 0.0
    return {"tensor_peak_relative": total_rel, "lines": lines, "within": within}


def _row(
    desc: ModelDescription, setting: StepSetting, config: PlanConfig, target: Target | None, engines, kept: dict
) -> dict:
    """One setting's row; `kept`: the overridden parameters per dtype (`plan/overrides.py`), in its weights."""
    primary, traced_engine = engines
    kwargs = ledger_kwargs(config)
    ledger = adjust_weights(primary.ledger(setting), kept)
    analytic = primary.name == "analytic"
    row: dict[str, Any] = {
        "setting": setting.to_dict(),
        "engine": primary.name,
        "ledger": ledger.to_dict(),
        "analytic": ledger.to_dict() if analytic else None,
        "traced": None if analytic else ledger.to_dict(),
        "agreement": None,
        "fit": None,
        "trace_note": None if analytic else f"traced only (no analytic ledger for this architecture): {primary.note}",
    }
    if analytic and (config.trace or traced_engine is not None):
        row.update(_traced(desc, setting, ledger, kwargs, traced_engine))
    if target is not None:
        row["fit"] = primary.fit(setting, ledger.total, target.capacity_bytes).to_dict()
    row["compute"] = _compute(desc, setting, gpu=target.gpu if target else None, mfu=config.mfu)
    row["communication"] = _communication(desc, setting, config, target, row["compute"]["step_s_at_mfu"])
    if kept:
        row["module_precision"] = _kept_block(config, kept, setting)
    return row


def _kept_block(config: PlanConfig, kept: dict, setting: StepSetting) -> dict[str, Any]:
    """What the row counts of the module overrides: their parameters per dtype, the weights' change."""
    return {
        "overrides": str(config.overrides),
        "parameters": {str(dtype).removeprefix("torch."): n for dtype, n in kept.items()},
        "weights_delta_bytes": weights_delta(kept, setting.precision, shards=setting.shards),
        "optimizer_states_delta_bytes": states_delta(kept, setting),
        "counted": "weights, their optimizer states and gradients (at the peak: the share alive) in the "
        "regime's dtype; activations at the step's precision",
    }


def comm_link(config: PlanConfig, target: Target | None) -> tuple[LinkSpec | None, str]:
    """The link a plan times communication over, and how it was chosen: `--link`, else the default (the
    GPU's own node link, InfiniBand NDR across nodes; none without a GPU on one node)."""
    if config.link:
        return lookup_link(config.link), "--link"
    gpu = target.gpu.name if target is not None and target.gpu is not None else None
    return default_link(gpu, nnodes=config.nnodes), "default"


def _communication(
    desc: ModelDescription, setting: StepSetting, config: PlanConfig, target: Target | None, compute_s: float | None
) -> dict[str, Any] | None:
    """The row's data-parallel communication per reduce dtype (`plan/analytic/comms.py`); None for one process."""
    link, chosen = comm_link(config, target)
    comm = step_communication(
        desc,
        setting,
        reduce_dtypes=config.reduce_dtype_list(),
        link=link,
        chosen=chosen,
        nnodes=config.nnodes,
        compute_s=compute_s,
    )
    return comm.to_dict() if comm is not None else None


def _compute(desc: ModelDescription, setting: StepSetting, *, gpu: GpuSpec | None, mfu: float) -> dict[str, Any]:
    """FLOPs and step time of one optimizer step of `setting` (its micro-batches x sequence x accumulation)."""
    tokens = setting.micro_batch * setting.seq_len * setting.grad_accum
    return step_compute(
        desc,
        precision=setting.precision,
        seq_len=setting.seq_len,
        tokens_per_step=tokens,
        gpu=gpu,
        mfu=mfu,
        checkpointing=setting.checkpointing == "full",
    ).to_dict()


def _traced(desc: ModelDescription, setting: StepSetting, analytic: Ledger, kwargs, engine=None) -> dict[str, Any]:
    """The traced ledger beside the analytic one: `engine` (a transformers model's own modules) or
    `plan/traced/trace.py` (ampkit's model)."""
    if engine is not None:
        traced = engine.ledger(setting)
        return {"traced": traced.to_dict(), "agreement": agreement(analytic, traced), "trace_note": engine.note}
    from ampkit.plan.traced.trace import trace_blocker, traced_ledger  # fake-tensor machinery: only when asked for

    why = trace_blocker(desc, setting)
    if why is not None:
        return {"trace_note": f"analytic only: {why}"}
    traced = traced_ledger(desc, setting, **kwargs)
    return {"traced": traced.to_dict(), "agreement": agreement(analytic, traced)}


def recommendation(desc: ModelDescription, config: PlanConfig, target: Target | None, engine=None) -> dict[str, Any]:
    """The precision for this GPU, its figures, and the cheapest fix when it does not fit (`engine`:
    the plan's primary engine, `plan/engines.py`; the analytic one by default)."""
    gpu = target.gpu if target else None
    precision, reason = base_precision(gpu)
    setting = _setting(config, precision=precision, optimizer=config.optimizer_list()[0], checkpointing="none")
    kwargs = ledger_kwargs(config)
    traced = engine is not None and engine.name == "traced"
    ledger = engine.ledger(setting) if traced else analytic_ledger(desc, setting, **kwargs)
    out: dict[str, Any] = {
        "precision": precision,
        "reason": reason,
        "setting": setting.to_dict(),
        "total_gib": round(ledger.total / GIB, 3),
        "fits": None,
        "fix": None,
        "notes": [n for n in (fp8_note(gpu),) if n],
    }
    if target is not None:
        out["fits"] = ledger.total <= target.capacity_bytes
        fix = cheapest_fix(desc, setting, target.capacity_bytes, gpu=gpu, engine=engine if traced else None, **kwargs)
        if fix is not None:
            out["fix"] = fix.to_dict()
        elif not out["fits"]:
            out["notes"].append("nothing up to FSDP over 1024 GPUs fits: shorten the sequence or plan a smaller model")
        out["compute"] = _compute(desc, fix.setting if fix else setting, gpu=gpu, mfu=config.mfu)
    return out


def build_plan(config: PlanConfig, *, desc: ModelDescription | None = None) -> dict[str, Any]:
    desc = desc or describe_model(config.model)
    if isinstance(desc, VLMDescription):  # an image-text model: its parts and images (plan/vlm)
        from ampkit.plan.vlm.planner import build_vlm_plan

        return build_vlm_plan(config, desc)
    config.text_only()
    config = config.for_model(desc.max_positions)  # --seq-len 0: 2048, or the model's positions when fewer
    target = resolve_target(config.gpu, config.gpu_mem)
    cache = _trace_cache(desc, config)
    primary = primary_engine(desc, cache=cache, **ledger_kwargs(config))
    engines = (primary, hf_traced_engine(desc, primary, cache=cache, **ledger_kwargs(config)))
    refused = _refusals(desc, config)
    settings = [s for s in settings_of(config) if s.precision not in refused]
    if engines[1] is not None:  # the rows' traces (and their fits'), two processes where there are two cores
        fits = target is not None and engines[1] is primary
        extra = _sure_fix_search(desc, config, target) if target is not None and fits else []
        try:
            engines[1].prefetch(settings, capacity=target.capacity_bytes if target and fits else None, extra=extra)
        except ConversionRefused:  # a low-bit converter refused the model: its rows say so, the rest trace on demand
            pass
    kept = kept_parameters(desc, config.overrides)  # --keep-fp32's weights in their regime's dtype
    rows = _rows(desc, settings, config, target, engines, refused, kept)
    return {
        "schema": PLAN_SCHEMA,
        "units": UNITS,
        "config": _config_dict(config),
        "model": desc.to_dict(),
        "engine": primary.name,
        "trace_note": engines[1].note if engines[1] is not None else None,
        "target": target.to_dict() if target else None,
        "rows": rows,
        "recommendation": recommendation(desc, config, target, primary),
        "fp8": _fp8_block(desc, config, target),
        "refused": refused,
        "formats": _formats_block(desc, config, target),
    }


def _refusals(desc: ModelDescription, config: PlanConfig) -> dict[str, str]:
    """{precision: why} for the low-bit precisions whose converter refuses the model (no Linear meets the
    format's shape rule, the native one's where it is stricter: NVFP4's kernels want 128-multiples),
    each checked on the model built on the meta device (`LinearConverter.classify`: a dry run). A plan
    is about the hardware: a format without training kernels yet (mxfp4) is planned all the same."""
    low_bit = [name for name in config.precision_list() if get_spec(name).converts_linears]
    model = meta_model(desc) if low_bit else None
    refused: dict[str, str] = {}
    if model is None:
        return refused
    for name in low_bit:
        policy = build_precision(name, device_type="cpu")
        assert isinstance(policy, LowBitPrecision), "a precision that converts Linears builds a LowBitPrecision"
        try:
            policy.converter().classify(model, kernels=False)
        except ConversionRefused as err:
            refused[name] = str(err)
    return refused


def _rows(
    desc: ModelDescription,
    settings: list[StepSetting],
    config: PlanConfig,
    target: Target | None,
    engines,
    refused,
    kept: dict,
):
    """The rows of `settings` (the refused precisions aside: `_refusals`); a plan of refused precisions
    only is refused, in the converter's words. A converter that refuses only when traced (the shared
    trace of a memory class) adds its precision to `refused`."""
    rows: list[dict[str, Any]] = []
    for setting in settings:
        if setting.precision in refused:
            continue
        try:
            rows.append(_row(desc, setting, config, target, engines, kept))
        except ConversionRefused as err:
            refused[setting.precision] = str(err)
    if not rows and refused:
        raise ConversionRefused(next(iter(refused.values())))
    return rows


def _sure_fix_search(desc: ModelDescription, config: PlanConfig, target: Target) -> list[StepSetting]:
    """The steps the recommendation's cheapest fix will trace (`advice.fix_settings`), when its step
    surely does not fit: its weights, gradients and optimizer states alone, all alive at the optimizer
    step, exceed the GPU (a guess only decides what is traced early, never a number)."""
    precision, _ = base_precision(target.gpu)
    setting = _setting(config, precision=precision, optimizer=config.optimizer_list()[0], checkpointing="none")
    tensors = desc.parameter_tensors()
    param_bytes = get_numerics(precision).param_bytes
    states = optimizer_state_bytes(setting.optimizer, tensors, param_bytes=param_bytes)
    if 2 * param_bytes * sum(tensors) + states <= target.capacity_bytes:
        return []
    return fix_settings(setting, target.gpu)


def _trace_cache(desc: ModelDescription, config: PlanConfig):
    """The traced engine's disk cache (`--trace-cache`), for the models that engine plans."""
    from ampkit.plan.describe.hf import HFDescription

    if not isinstance(desc, HFDescription):
        return None
    from ampkit.plan.traced.cache import open_cache

    return open_cache(config.trace_cache)


def _fp8_block(desc: ModelDescription, config: PlanConfig, target: Target | None) -> dict[str, Any] | None:
    """Per Linear, whether fp8 pays on the target GPU (only when fp8 is among the precisions)."""
    from ampkit.plan.analytic.fp8 import fp8_plan

    native_fp8 = any(get_spec(p).native_low_bit and get_spec(p).matmul_key == "fp8" for p in config.precision_list())
    if not native_fp8 or target is None:
        return None
    return fp8_plan(desc, micro_batch=config.batch_size, seq_len=config.seq_len, gpu=target.gpu)


def _formats_block(desc: ModelDescription, config: PlanConfig, target: Target | None) -> dict[str, Any] | None:
    """`--formats`: the payoff predictor on the target GPU, or on every GPU of the table; `--measure`
    times the GEMMs where a CUDA GPU is present (`plan/payoff/`)."""
    if not config.formats:
        return None
    from ampkit.plan.payoff import parse_formats, payoff_plan

    block = payoff_plan(
        desc,
        formats=config.formats,
        micro_batch=config.batch_size,
        seq_len=config.seq_len,
        grad_accum=config.grad_accum,
        shards=config.world_size if config.parallel == "fsdp" else 1,
        gpu=target.gpu if target else None,
    )
    if config.measure and block["linears"]:
        from ampkit.plan.payoff.measure import measure_formats

        block["measured"] = measure_formats(block, parse_formats(config.formats))
    return block


def _config_dict(config) -> dict[str, Any]:
    return asdict(config)


def build_kv(config: KvConfig, *, desc: ModelDescription | None = None) -> dict[str, Any]:
    desc = desc or describe_model(config.model)
    if isinstance(desc, VLMDescription):  # self-attention and cross-attention caches (plan/vlm)
        from ampkit.plan.vlm.planner import build_vlm_kv

        return build_vlm_kv(config, desc)
    config = config.for_model(desc.max_positions)  # --context-len 0: 4096, or the model's positions when fewer
    target = resolve_target(config.gpu, config.gpu_mem)
    assert target is not None, "KvConfig defaults --gpu when neither --gpu nor --gpu-mem is given"
    budget = pool_budget(desc, config, capacity=target.capacity_bytes)
    budgets = [
        kv_budget(desc, kv_dtype=name, pool_bytes=int(budget["pool_bytes"]), context_len=config.context_len).to_dict()
        for name in config.kv_dtype_list()
    ]
    return {
        "schema": KV_SCHEMA,
        "units": UNITS,
        "config": _config_dict(config),
        "model": desc.to_dict(),
        "target": target.to_dict(),
        "budget": budget,
        "kv": budgets,
    }
