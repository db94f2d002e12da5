"""`ampkit plan` and `ampkit kv` for a VLM: the plan's rows per precision x optimizer x checkpointing,
each with its parts, the recommendation with the cheapest change that fits, and the KV budget.

The summary is the causal LM's ("ampkit.plan/1": rows of setting, ledger, fit, compute), so the
plan's tables and report read it as they read any plan; a VLM adds `workload` (images per sample,
their tokens, the frozen parts), each row's `parts` (every part's parameters, gradients, optimizer
states, weight copies and activations in its precision) and the compute's text and image tokens.
`--seq-len` is the language model's sequence, image tokens included (0: 2048, or the images plus 256
text tokens when they take more, within the model's positions).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace
from typing import Any

from ampkit.errors import UsageError
from ampkit.plan.advice import base_precision, cheapest_fix, fp8_note
from ampkit.plan.config import DEFAULT_SEQ_LEN, KvConfig, PlanConfig
from ampkit.plan.describe.vlm import VLMDescription
from ampkit.plan.fit import Target, resolve_target
from ampkit.plan.kv.budget import KV_DTYPES, dtype_bytes, pool_budget
from ampkit.plan.overrides import part_precisions
from ampkit.plan.setting import GIB, Reserve, StepSetting
from ampkit.plan.vlm.compute import vlm_compute
from ampkit.plan.vlm.engine import VLMEngine
from ampkit.plan.vlm.workload import Workload, build_workload

PLAN_SCHEMA = "ampkit.plan/1"
KV_SCHEMA = "ampkit.kv/1"
MIN_TEXT_TOKENS = 256  # text tokens the default sequence leaves beside the images


def resolve_seq_len(desc: VLMDescription, workload: Workload, seq_len: int) -> int:
    """--seq-len, or (0) 2048, or the images plus MIN_TEXT_TOKENS when they need more, within positions."""
    if seq_len:
        return seq_len
    want = max(DEFAULT_SEQ_LEN, workload.image_tokens + MIN_TEXT_TOKENS)
    return min(want, desc.max_positions) if desc.max_positions else want


def _settings(config: PlanConfig) -> list[StepSetting]:
    combos = itertools.product(config.precision_list(), config.optimizer_list(), config.checkpointing_list())
    return [
        StepSetting(
            precision=p,
            optimizer=o,
            checkpointing=c,
            micro_batch=config.batch_size,
            seq_len=config.seq_len,
            grad_accum=config.grad_accum,
            world_size=config.world_size,
            parallel=config.parallel,
        )
        for p, o, c in combos
    ]


def _compute(desc: VLMDescription, work: Workload, setting: StepSetting, config: PlanConfig, target: Target | None):
    return vlm_compute(
        desc,
        work,
        precision=setting.precision,
        seq_len=setting.seq_len,
        samples=setting.micro_batch * setting.grad_accum,
        gpu=target.gpu if target else None,
        mfu=config.mfu,
        checkpointing=setting.checkpointing == "full",
    )


def _row(engine: VLMEngine, setting: StepSetting, config: PlanConfig, target: Target | None) -> dict[str, Any]:
    ledger = engine.ledger(setting)
    return {
        "setting": setting.to_dict(),
        "engine": engine.name,
        "ledger": ledger.to_dict(),
        "analytic": ledger.to_dict(),
        "traced": None,
        "agreement": None,
        "fit": engine.fit(setting, ledger.total, target.capacity_bytes).to_dict() if target else None,
        "trace_note": None,
        "parts": [p.to_dict() for p in engine.parts(setting)],
        "compute": _compute(engine.desc, engine.workload, setting, config, target),
    }


def _recommendation(engine: VLMEngine, config: PlanConfig, target: Target | None) -> dict[str, Any]:
    gpu = target.gpu if target else None
    precision, reason = base_precision(gpu)
    setting = replace(_settings(config)[0], precision=precision, checkpointing="none")
    ledger = engine.ledger(setting)
    out: dict[str, Any] = {
        "precision": precision,
        "reason": reason,
        "setting": setting.to_dict(),
        "total_gib": round(ledger.total / GIB, 3),
        "fits": None,
        "fix": None,
        "notes": [n for n in (fp8_note(gpu),) if n],
    }
    if target is None:
        return out
    out["fits"] = ledger.total <= target.capacity_bytes
    fix = cheapest_fix(engine.desc, setting, target.capacity_bytes, gpu=gpu, engine=engine)
    if fix is not None:
        out["fix"] = fix.to_dict()
    elif not out["fits"]:
        out["notes"].append("nothing up to FSDP over 1024 GPUs fits: fewer images, a shorter sequence or --freeze")
    out["compute"] = _compute(engine.desc, engine.workload, fix.setting if fix else setting, config, target)
    return out


def plan_workload(desc: VLMDescription, config: PlanConfig) -> tuple[Workload, PlanConfig]:
    """The workload of the plan's flags, and the config with its sequence resolved."""
    workload = build_workload(
        desc,
        images=config.images_per_sample,
        image_size=config.image_size,
        freeze=config.freeze,
        seq_len=config.seq_len,
    )
    parts = {p for p, n in desc.part_parameters.items() if n}
    if config.overrides:  # --keep-fp32 vision: that part's ledger in fp32 (`plan/overrides.py`)
        workload = replace(workload, part_precisions=part_precisions(config.overrides, parts))
    seq_len = resolve_seq_len(desc, workload, config.seq_len)
    if desc.max_positions and seq_len > desc.max_positions:
        raise UsageError(f"--seq-len {seq_len} exceeds {desc.name}'s {desc.max_positions} positions")
    if workload.text_tokens(seq_len) < 1:
        raise UsageError(
            f"{workload.images} image(s) take {workload.image_tokens} tokens, all of the model's {seq_len} "
            "positions: plan fewer --images-per-sample or a smaller --image-size"
        )
    return workload, replace(config, seq_len=seq_len)


def build_vlm_plan(config: PlanConfig, desc: VLMDescription) -> dict[str, Any]:
    """The plan's summary ("ampkit.plan/1", with the VLM's workload and parts)."""
    workload, config = plan_workload(desc, config)
    target = resolve_target(config.gpu, config.gpu_mem)
    reserve = Reserve(context_bytes=int(config.context_gib * GIB), fragmentation=config.fragmentation)
    engine = VLMEngine(desc, workload, reserve=reserve)
    rows = [_row(engine, setting, config, target) for setting in _settings(config)]
    return {
        "schema": PLAN_SCHEMA,
        "units": {
            "memory": "bytes; fields ending in _gib are GiB (1024**3 bytes)",
            "flops": "FLOPs",
            "rates": "FLOP/s",
            "time": "seconds",
            "tokens": "the language model's positions: text tokens and image tokens, told apart",
        },
        "config": asdict(config),
        "model": desc.to_dict(),
        "workload": workload.to_dict(),
        "engine": engine.name,
        "trace_note": None,
        "target": target.to_dict() if target else None,
        "rows": rows,
        "recommendation": _recommendation(engine, config, target),
        "fp8": None,
    }


def build_vlm_kv(config: KvConfig, desc: VLMDescription) -> dict[str, Any]:
    """`ampkit kv` for a VLM: per KV dtype, the self-attention cache per token and, for mllama, the
    cross-attention cache of each request's images (2 x fusion layers x KV heads x head dim x
    vision states, per image); a request is `--context-len` tokens (its image tokens included) and
    `--images-per-sample` images."""
    workload = build_workload(desc, images=config.images_per_sample, image_size=config.image_size, freeze="", seq_len=0)
    context = config.context_len or min(4096, desc.max_positions or 4096)
    if workload.image_tokens >= context:
        raise UsageError(
            f"--context-len {context}: the request's {workload.images} image(s) take {workload.image_tokens} tokens"
        )
    target = resolve_target(config.gpu, config.gpu_mem)
    assert target is not None, "KvConfig defaults --gpu"
    budget = pool_budget(desc, config, capacity=target.capacity_bytes)
    pool = max(0, int(budget["pool_bytes"]))
    lm = desc.language_stack
    rows = []
    for name in config.kv_dtype_list():
        size = dtype_bytes(name, KV_DTYPES, "--kv-dtypes")
        per_token = 2 * lm.layers * lm.kv_dim * size
        fusion = desc.fusion
        cross = 2 * fusion.layers * fusion.kv_dim * size * workload.cross_tokens if fusion is not None else 0
        per_request = context * per_token + cross
        rows.append(
            {
                "kv_dtype": name,
                "bytes_per_token": per_token,
                "cross_attention_bytes_per_request": cross,
                "bytes_per_request": per_request,
                "max_tokens": pool // per_token,
                "max_requests": pool // per_request,
            }
        )
    return {
        "schema": KV_SCHEMA,
        "units": {"memory": "bytes; fields ending in _gib are GiB (1024**3 bytes)", "tokens": "positions"},
        "config": asdict(replace(config, context_len=context)),
        "model": desc.to_dict(),
        "workload": workload.to_dict(),
        "target": target.to_dict(),
        "budget": budget,
        "kv": rows,
    }
