"""The bench's summary kinds: `ampkit bench` ("ampkit.bench/2", `bench --lora` too), `bench --inference`
("ampkit.bench-inference/1") and `bench --sweep` ("ampkit.bench-sweep/1"). docs/bench.md describes each
field of "ampkit.bench/2"; docs/inference.md and docs/throughput.md the other two."""

from __future__ import annotations

from ampkit.summaries.kind import CAPABILITIES, PROVENANCE, Older, SummaryKind
from ampkit.summaries.spec import NUM, OPT_NUM, Absent, ListOf, MapOf, OneOf, Opt

TIMING = {
    "items_per_s": NUM,
    "items_per_s_all": NUM,
    "processed_per_s": Absent(NUM),
    "image_tokens_per_s": Absent(OPT_NUM),  # a VLM's image tokens among the processed items
    "measured_s": NUM,
    "step_ms_median": NUM,
    "step_ms_p10": NUM,
    "step_ms_p90": NUM,
    "step_ms_min": NUM,
    "step_ms_max": NUM,
    "step_ms": ListOf(NUM),
}
MEMORY = {
    "kind": str,
    "peak_bytes": int,
    "run_bytes": int,
    "step_peak_bytes": Absent(Opt(int)),
    "predicted_bytes": Absent(Opt(int)),
    "predicted_source": Absent(Opt(str)),
    "predicted_note": Absent(Opt(str)),
    "predicted_ratio": Absent(OPT_NUM),
    "rank_peak_bytes": Absent(ListOf(int)),  # every rank's peak, rank order (one item in one process)
}
SHARES: dict[str, object] = {
    key: NUM for key in ("matmul", "norm", "elementwise", "casts", "optimizer", "data", "other")
}
SHARES["communication"] = Absent(NUM)  # collectives (bench --parallel); summaries before it have none
PROFILE = {
    "step_ms": NUM,
    "ms": SHARES,
    "shares": SHARES,
    "top_ops": ListOf(list),
    "matmul_ratio": Absent(OPT_NUM),
    "amdahl_speedup": Absent(OPT_NUM),
}
BUDGET_ENTRY = {
    "mode": str,
    "few_steps": bool,
    "reason": Opt(str),
    "batch_size": Opt(int),
    "warmup_steps": Opt(int),
    "fidelity_rows": Opt(int),
    "estimated_step_s": OPT_NUM,
    "measured_step_s": OPT_NUM,
    "estimated_total_s": OPT_NUM,
    "max_measure_s": OPT_NUM,
    "measured_s": NUM,
    # the worker's phases (seconds): process start to the run built (of it, to its imports done), its
    # fidelity captures, its warmup steps, fp32's GEMM probe, and the whole process as the parent saw it
    "startup_s": Absent(OPT_NUM),
    "imports_s": Absent(OPT_NUM),
    "started": Absent(Opt(str)),  # "forked" from the bench's warm process (bench/zygote.py) or "cold"
    "fidelity_s": Absent(OPT_NUM),
    "warmup_s": Absent(OPT_NUM),
    "probe_s": Absent(OPT_NUM),
    "worker_s": Absent(OPT_NUM),
}
FIDELITY = {
    "logits_cosine": OPT_NUM,
    "logits_max_abs_diff": OPT_NUM,
    "loss": OPT_NUM,
    "loss_diff": OPT_NUM,
    "grad_cosine": OPT_NUM,
    "grad_elements": int,
    "verdict": str,
    "passed": bool,
    "loss_curve": {"steps_compared": int, "max_gap": OPT_NUM, "mean_gap": OPT_NUM, "final_gap": OPT_NUM},
    "rows": Absent(int),
}
GATE = {
    "gate": NUM,
    "first_step": int,
    "last_step": int,
    "steps_compared": int,
    "max_gap": OPT_NUM,  # null: a non-finite loss (an infinite gap) or no step compared
    "worst_step": Opt(int),
    "passed": bool,
    "reason": Opt(str),
}
RULE = {"rule": str, "text": str, "evidence": dict}  # the seeds' decision rules that fired (`bench/rules.py`)
PRECISION = {
    "name": str,
    "status": OneOf("ok", "failed", "not-timed", "interrupted"),
    "error": Opt(str),
    "native": bool,
    "native_note": str,
    "steps": Opt({"warmup": int, "measured": int, "stalled": int}),
    "timing": Opt(TIMING),
    "mfu": Opt(
        {"value": OPT_NUM, "peak_flops": OPT_NUM, "peak_source": str, "peak_dtype": str, "note": Absent(Opt(str))}
    ),
    "memory": Opt(MEMORY),
    "loss": Opt(
        {
            "first": OPT_NUM,
            "final": OPT_NUM,
            "last": OPT_NUM,
            "curve": ListOf(OPT_NUM),
            "at_common_step": Absent(OPT_NUM),
        }
    ),
    "stability": Opt(
        {
            "stable": bool,
            "reason": Opt(str),
            "skipped_steps": int,
            "nonfinite_loss_steps": int,
            "nonfinite_grad_steps": int,
            "final_loss_scale": OPT_NUM,
        }
    ),
    "vs_fp32": Opt({"speedup": NUM, "steps_compared": int, "memory_ratio": NUM, "same_batches": Absent(bool)}),
    "fidelity": Opt(FIDELITY),
    "files": {"result": str, "log": str, "fidelity": Opt(str)},
    "budget": Absent(Opt(BUDGET_ENTRY)),
    "profile": Absent(Opt(PROFILE)),
    # the low-bit formats: {precision, format, emulated, converted: [names], kept: {name: why}}
    "conversion": Absent(Opt(dict)),
    # the worker's ranks: mode, world_size (with backend and reduce_dtype under bench --parallel)
    "parallel": Absent(Opt({"mode": str, "world_size": int, "backend": Absent(str), "reduce_dtype": Absent(str)})),
    # --gate: the loss gap to fp32's at the matched steps after warm-up (`bench/gate.py`)
    "gate": Absent(Opt(GATE)),
}
PEAK = {"peak_flops": OPT_NUM, "source": str, "dtype": str}
TRAIN = {
    "command": str,
    "batch_size": int,
    "batch_source": Opt(str),
    "batch_note": Opt(str),
    "expected_items_per_s": OPT_NUM,
    "measured_batch_size": Opt(int),
}
FIELDS = {
    "schema_version": OneOf(2),
    "command": OneOf("bench"),
    # every precision ran, or a stop signal ended the bench after the ones listed (a summary marked "failed"
    # by a write error is no bench summary: it lacks the rest)
    "status": Absent(OneOf("completed", "interrupted")),
    "interrupted": Absent(Opt({"signal": str, "during": Opt(str), "finished": ListOf(str)})),
    "ampkit_version": str,
    "torch_version": str,
    "created_utc": str,
    "wall_s": NUM,
    "config": dict,
    "host_load": Opt({"cpus": int, "start": Opt(ListOf(NUM)), "end": Opt(ListOf(NUM))}),
    "device": {
        "type": str,
        "name": str,
        "gpu_model": Opt(str),
        "compute_capability": Opt(ListOf(int)),
        "total_memory_bytes": int,
        **CAPABILITIES,
        "cpu_threads": int,
    },
    "unit": str,
    "task": {"name": str, "unit": str},
    "model": {
        "preset": str,
        "parameters": Opt(int),
        "flops_per_item": OPT_NUM,
        "flops_source": Opt(str),
        "flops_formula": Opt(str),
    },
    "data": {"corpus": Opt(str), "seq_len": Opt(int), "batch_size": int},
    "reference": str,
    "parallel": Absent(Opt({"mode": str, "nproc_per_node": int, "reduce_dtypes": ListOf(str)})),
    "warnings": ListOf(str),
    "loss_common_step": Absent(Opt(int)),
    "profile": Absent(
        Opt(
            {
                "categories": dict,
                "reference_matmul_share": NUM,
                "ceiling_2x": NUM,
                "ceiling_unbounded": OPT_NUM,
                "cast_threshold": NUM,
            }
        )
    ),
    "peaks": Absent(Opt(dict)),
    "provenance": Absent(PROVENANCE),
    "budget": Absent(
        Opt(
            {
                "budget_s": NUM,
                "timed_precisions": int,
                "measured_s": NUM,
                "fidelity_s": NUM,
                "startup_s": NUM,
                "worker_startup_s": Absent(NUM),
                "warmup_s": Absent(NUM),
                "parent_s": Absent(NUM),
                "expected_s": OPT_NUM,
                "wall_s": NUM,
                "finished_s": Absent(NUM),
                "bound_s": OPT_NUM,
                "within_bound": Opt(bool),
            }
        )
    ),
    "precisions": ListOf(PRECISION),
    "recommendation": {
        "precision": Opt(str),
        "reason": str,
        "disqualified": dict,
        "advice": ListOf(str),
        "train": Absent(Opt(TRAIN)),
        "rules": Absent(ListOf(RULE)),
    },
    "gate": Absent(
        Opt(
            {
                "gate": NUM,
                "recommended": Opt(str),
                "passed": Opt(bool),
                "exit_status": OneOf(0, 3),
                "candidates": MapOf(bool),
                "line": Opt(str),
            }
        )
    ),
}


BENCH = SummaryKind(
    name="bench",
    schema="ampkit.bench/2",
    title="ampkit bench (and bench --lora): every precision side by side",
    fields=FIELDS,
)

HEADER = {
    "ampkit_version": str,
    "torch_version": str,
    "created_utc": str,
    "wall_s": NUM,
    "provenance": Absent(PROVENANCE),
    "config": dict,
}
"""The keys every bench mode's summary opens with (`ampkit.provenance.summary_header`)."""

CONFIGURATION = {
    "weights": str,
    "kv_dtype": str,
    "status": OneOf("ok"),  # a configuration that cannot run stops the bench (one line, exit 2)
    "prefill_tokens_per_s": OPT_NUM,
    "ttft_ms": OPT_NUM,
    "decode_tokens_per_s": OPT_NUM,
    "weights_bytes": int,
    "kv_cache_bytes": int,
    "kv_bytes_per_token": int,
    "activation_peak_bytes": int,
    "greedy_agreement": NUM,
    "logits_cosine": NUM,
    "kv_bytes_per_token_formula": int,
}
"""One weights x KV-cache dtype configuration of `bench --inference` (bytes; tokens/s over the batch)."""

INFERENCE = SummaryKind(
    name="bench-inference",
    schema="ampkit.bench-inference/1",
    title="ampkit bench --inference: serving measured per weights and KV-cache dtype",
    fields={
        "command": OneOf("bench"),
        "mode": OneOf("inference"),
        **HEADER,
        "device": {"type": str, "name": str, "total_memory_bytes": int},
        "model": {
            "name": str,
            "parameters": int,
            "n_layers": int,
            "kv_heads": int,
            "head_dim": int,
            "max_seq_len": Opt(int),
        },
        "units": MapOf(str),
        "configurations": ListOf(CONFIGURATION),
        "recommendation": {"weights": str, "kv_dtype": str, "reason": str, "below_fidelity": MapOf(str)},
    },
)

SWEEP_ROW = {
    "variant": str,
    "settings": Absent(dict),
    "status": OneOf("ok", "failed", "skipped"),
    "error": Opt(str),
    "log": Absent(str),
    "measured_steps": Absent(int),
    "tokens_per_s": Absent(NUM),
    "processed_per_s": Absent(NUM),
    "step_ms_median": Absent(NUM),
    "padding_fraction": Absent(NUM),
    "padding_source": Absent(OneOf("data stats", "measured steps")),
    "peak_memory_bytes": Absent(int),
    "final_loss": Absent(OPT_NUM),
    "throughput": Absent(Opt(dict)),
    "vs_baseline": Absent({"tokens_per_s": NUM, "memory": NUM}),
}
"""One combination of switches (a row that did not run: its status and error only)."""

SWEEP = SummaryKind(
    name="bench-sweep",
    schema="ampkit.bench-sweep/1",
    title="ampkit bench --sweep: throughput switches side by side under one precision",
    fields={
        "schema_version": Absent(OneOf(1)),
        "command": OneOf("bench-sweep"),
        **{key: Absent(spec) for key, spec in HEADER.items()},
        "precision": str,
        "device": {"type": str, "name": str},
        "rows": ListOf(SWEEP_ROW),
        "fastest": Opt(str),
    },
    older=(Older(schema=None, command="bench-sweep"),),  # a sweep before it had a schema: its rows alone
)
