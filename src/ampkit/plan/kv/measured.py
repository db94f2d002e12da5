"""`ampkit kv --from-bench RUN_DIR`: the KV-cache budget from what `ampkit bench --inference` measured.

Per measured configuration (weights x KV dtype): the pool is the target's memory x utilization less
the measured weights, the measured activation peak of a prefill (scaled from the bench's prefill to
`--batched-tokens` tokens: activations grow with the tokens a forward batches) and the non-torch
overhead; tokens = pool / the measured KV bytes per token. Units: bytes (GiB shown, 1024**3).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ampkit.errors import UsageError
from ampkit.plan.fit import resolve_target
from ampkit.plan.kv.budget import kv_pool_bytes
from ampkit.plan.setting import GIB

BENCH_SCHEMA = "ampkit.bench-inference/1"


def configuration_rows(records: list[dict[str, Any]], cells: Callable[[dict[str, Any]], list[str]]) -> list[list[str]]:
    """A row per serving configuration (the bench's, or `ampkit kv --from-bench`'s): the weights' and the
    KV cache's dtypes, then `cells(record)`."""
    return [[r["weights"], r["kv_dtype"], *cells(r)] for r in records]


def read_bench(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(
            f"--from-bench {run_dir}: no readable summary.json; pass an 'ampkit bench --inference' run"
        ) from None
    if summary.get("schema") != BENCH_SCHEMA:
        raise UsageError(
            f"--from-bench {run_dir}: not an 'ampkit bench --inference' run (schema {summary.get('schema')!r})"
        )
    return summary


def measured_budget(config, bench: dict[str, Any]) -> dict[str, Any]:
    """The summary of `ampkit kv --from-bench` (schema "ampkit.kv-measured/1")."""
    config = config.for_model(bench["model"].get("max_seq_len") or 0)  # --context-len 0: the default, capped
    target = resolve_target(config.gpu, config.gpu_mem)
    assert target is not None, "KvConfig defaults --gpu when neither --gpu nor --gpu-mem is given"
    serving = bench["config"]["serving"]
    measured_tokens = serving["infer_batch"] * serving["prompt_len"]
    overhead = int(config.overhead_gib * GIB)
    rows = []
    for c in bench["configurations"]:
        activations = int(c["activation_peak_bytes"] * config.batched_tokens / measured_tokens)
        pool = kv_pool_bytes(
            capacity=target.capacity_bytes,
            utilization=config.utilization,
            weights=c["weights_bytes"],
            activation_reserve=activations,
            overhead=overhead,
        )
        tokens = max(0, pool) // c["kv_bytes_per_token"]
        rows.append(
            {
                "weights": c["weights"],
                "kv_dtype": c["kv_dtype"],
                "weights_bytes": c["weights_bytes"],
                "activation_reserve_bytes": activations,
                "kv_bytes_per_token": c["kv_bytes_per_token"],
                "pool_bytes": pool,
                "max_tokens": int(tokens),
                "max_requests": int(tokens // config.context_len),
                "decode_tokens_per_s": c["decode_tokens_per_s"],
                "greedy_agreement": c["greedy_agreement"],
            }
        )
    return {
        "schema": "ampkit.kv-measured/1",
        "command": "kv",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "from_bench": str(config.from_bench),
        "model": bench["model"],
        "target": target.to_dict(),
        "context_len": config.context_len,
        "batched_tokens": config.batched_tokens,
        "utilization": config.utilization,
        "measured": rows,
    }


def measured_table(summary: dict[str, Any]):
    from ampkit.report.console import columns, compact_table

    title = (
        f"ampkit kv --from-bench · {summary['model']['name']} on {summary['target']['name']} · "
        f"{summary['context_len']}-token requests"
    )
    return compact_table(title, columns(HEADERS, names=2), _rows(summary))


HEADERS = ["weights", "KV", "KV B/token", "pool GiB", "max tokens", "requests", "agreement"]


def _rows(summary: dict[str, Any]) -> list[list[str]]:
    def cells(r: dict[str, Any]) -> list[str]:
        pool_gib = r["pool_bytes"] / GIB
        counts = f"{r['max_tokens']:,}", f"{r['max_requests']:,}"
        return [f"{r['kv_bytes_per_token']:,}", f"{pool_gib:.2f}", *counts, f"{r['greedy_agreement']:.0%}"]

    return configuration_rows(summary["measured"], cells)


def write_measured_report(summary: dict[str, Any], run_dir) -> tuple:
    from ampkit.report import Report, as_stored

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    title = f"ampkit kv --from-bench: {summary['model']['name']} on {summary['target']['name']}"
    report = Report(title=title, provenance=summary.get("provenance"))
    report.text(
        f"From the measurements of {summary['from_bench']}: weights, the prefill's activation peak (scaled "
        f"to {summary['batched_tokens']} batched tokens) and the KV bytes per token; GiB = 1024^3 bytes.",
        kind="note",
    )
    report.table(HEADERS, _rows(summary))
    return report.write(run_dir)
