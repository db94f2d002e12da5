"""The planners' summary kinds: `ampkit plan` and `plan --trace` ("ampkit.plan/1"), `plan --lora`
("ampkit.plan-lora/1"; older ones: "ampkit.plan/1" with a "methods" table), `plan --task`
("ampkit.plan-task/1"), `ampkit kv` ("ampkit.kv/1") and `kv --from-bench` ("ampkit.kv-measured/1").
Memory in bytes (fields ending in `_gib`: GiB, 1024**3 bytes); docs/plan.md describes them."""

from __future__ import annotations

from ampkit.summaries.kind import PROVENANCE, SETTING, TARGET, Older, SummaryKind
from ampkit.summaries.spec import NUM, OPT_NUM, Absent, ListOf, MapOf, OneOf, Opt

LEDGER = {
    "engine": str,
    "setting": SETTING,
    "peak_moment": str,
    "lines_at_peak_bytes": MapOf(int),
    "total_bytes": int,
    "total_gib": NUM,
}
"""One engine's memory ledger of a step (`plan.ledger.Ledger.to_dict`): its lines at the step's peak."""

MODEL = {"name": str}
"""The planned model (`plan.describe.ModelDescription.to_dict`, or a transformers architecture's counts)."""

FORMATS = {
    "tokens": int,
    "candidates": ListOf({"format": str, "recipe": str, "label": str}),
    "assumptions": ListOf(str),
    "linears": ListOf({"name": str, "k": int, "n": int, "count": int, "head": bool, "gemms": ListOf(dict)}),
    "gpus": ListOf(
        {
            "gpu": str,
            "bf16_step_s": NUM,
            "gemm_share": NUM,
            "amdahl_bound": NUM,
            "other": MapOf(NUM),
            "formats": ListOf(
                {
                    "format": str,
                    "recipe": str,
                    "label": str,
                    "predicted": bool,
                    "note": Opt(str),
                    "kernel_only": OPT_NUM,
                    "with_overhead": OPT_NUM,
                    "step_speedup": OPT_NUM,
                    "converted_layers": ListOf(str),
                    "layers": ListOf(dict),
                    "filter": Opt(dict),
                }
            ),
        }
    ),
    "note": Opt(str),
    "measured": Opt(dict),
}
"""`plan --formats`: the payoff predictor per GPU and format (`plan.payoff.payoff_plan`), speedups over bf16."""

COLLECTIVE = {
    "kind": OneOf("all-gather", "reduce-scatter", "all-reduce"),
    "dtype": str,
    "dtype_bytes": int,
    "parameters": MapOf(int),
    "per_step": MapOf(int),
    "bytes": int,
    "ring_factor": NUM,
    "wire_bytes_per_gpu": NUM,
}
COMMUNICATION = {
    "parallel": OneOf("ddp", "fsdp"),
    "world_size": int,
    "nnodes": int,
    "grad_accum": int,
    "link": Opt({"name": str, "label": str, "each_way_gbs": NUM, "sources": ListOf(str), "chosen": str}),
    "gather_dtype": Opt(str),
    "options": ListOf(
        {
            "reduce_dtype": str,
            "collectives": ListOf(COLLECTIVE),
            "bytes_per_step": int,
            "wire_bytes_per_gpu": NUM,
            "comm_s": OPT_NUM,
            "compute_s": OPT_NUM,
            "step_s_no_overlap": OPT_NUM,
            "step_s_overlap": OPT_NUM,
            "bound": Opt(OneOf("compute", "communication")),
        }
    ),
}
"""A row's data-parallel communication per reduce dtype (`plan.analytic.comms.Communication`): bytes per
optimizer step, GB/s = 1e9 B/s each way, seconds; null under --parallel none."""

PLANNED = {
    "command": Absent(OneOf("plan")),  # Absent: the first plans' summaries had no "command"
    "units": MapOf(str),
    "config": dict,
    "model": MODEL,
    "target": Opt(TARGET),
    "provenance": Absent(PROVENANCE),
}
"""The keys every plan's summary opens with."""

PLAN = SummaryKind(
    name="plan",
    schema="ampkit.plan/1",
    title="ampkit plan (and plan --trace): the memory ledger per precision x optimizer x checkpointing",
    fields={
        **PLANNED,
        "engine": Absent(str),
        "trace_note": Absent(Opt(str)),
        "rows": ListOf(
            {
                "setting": SETTING,
                "analytic": Opt(LEDGER),
                "traced": Opt(LEDGER),
                "fit": Opt(dict),
                "communication": Absent(Opt(COMMUNICATION)),  # Absent: plans before it was planned
            }
        ),
        "recommendation": {"precision": Opt(str), "reason": str, "notes": ListOf(str)},
        "fp8": Absent(Opt(dict)),
        "refused": Absent(MapOf(str)),  # precision -> why its low-bit converter refused the model
        "formats": Absent(Opt(FORMATS)),
    },
)

PLAN_LORA = SummaryKind(
    name="plan-lora",
    schema="ampkit.plan-lora/1",
    title="ampkit plan --lora: the LoRA plan and full fine-tuning, LoRA and QLoRA side by side",
    fields={
        **PLANNED,
        "lora": dict,
        "rows": ListOf({"setting": SETTING, "lora": dict, "analytic": Opt(LEDGER), "fit": Opt(dict)}),
        "methods": {
            "precision": str,
            "reason": str,
            "setting": SETTING,
            "methods": ListOf({"method": str, "total_gib": NUM, "lines_at_peak_bytes": MapOf(int)}),
        },
        "notes": ListOf(str),
        # peft's print_trainable_parameters counts (Absent: plans written before they were recorded)
        "trainable": Absent({"trainable_parameters": int, "total_parameters": int, "trainable_percent": NUM}),
    },
    older=(Older(schema="ampkit.plan/1", has="methods"),),  # before plan --lora had its own schema id
)

PLAN_TASK = SummaryKind(
    name="plan-task",
    schema="ampkit.plan-task/1",
    title="ampkit plan --task: any task's training step traced on fake tensors",
    fields={
        "command": OneOf("plan"),
        "units": MapOf(str),
        "config": dict,
        "task": {"name": str, "unit": str},
        "engine": OneOf("traced"),
        "analytic_note": str,
        "target": Opt(TARGET),
        "rows": ListOf({"setting": SETTING, "traced": LEDGER, "flops_per_item": OPT_NUM}),
        "skipped": ListOf(str),
        "provenance": Absent(PROVENANCE),
    },
)

KV = SummaryKind(
    name="kv",
    schema="ampkit.kv/1",
    title="ampkit kv: the KV-cache budget per KV dtype on a GPU",
    fields={
        **{**PLANNED, "command": Absent(OneOf("kv")), "target": TARGET},
        "budget": {
            "capacity_bytes": int,
            "utilization": NUM,
            "usable_bytes": int,
            "weights_bytes": int,
            "activation_reserve_bytes": int,
            "overhead_bytes": int,
            "pool_bytes": int,
        },
        "kv": ListOf({"kv_dtype": str, "bytes_per_token": int, "max_tokens": int, "max_requests": int}),
    },
)

KV_MEASURED = SummaryKind(
    name="kv-measured",
    schema="ampkit.kv-measured/1",
    title="ampkit kv --from-bench: the KV-cache budget from a bench --inference run's measurements",
    fields={
        "command": OneOf("kv"),
        "config": dict,
        "from_bench": str,
        "model": MODEL,
        "target": TARGET,
        "context_len": int,
        "batched_tokens": int,
        "utilization": NUM,
        "measured": ListOf(
            {
                "weights": str,
                "kv_dtype": str,
                "weights_bytes": int,
                "activation_reserve_bytes": int,
                "kv_bytes_per_token": int,
                "pool_bytes": int,
                "max_tokens": int,
                "max_requests": int,
                "decode_tokens_per_s": OPT_NUM,
                "greedy_agreement": NUM,
            }
        ),
        "provenance": Absent(PROVENANCE),
    },
)
