"""`ampkit bench --sweep`: one precision, the throughput switches side by side (batching, activation
checkpointing, 8-bit optimizer states, compile, dedup), each combination in its own worker process on
the same model and seed, so a user sees what each switch buys on their device.

Rows are compared with the `baseline` combination (pad batching, AdamW, nothing else). tokens/s counts
trained tokens (real, with a loss), so packing's gain is a real gain; processed tokens/s (masked ones
too, padding not) stands beside it. No fidelity column: the switches change the batches (packing,
dedup), so logits on "the same batch" do not exist across rows.

The padding column is `ampkit data stats`'s figure for the row's batching and dedup (one epoch of the
sampler's own batches: `ampkit.data.stats`), the same number `ampkit data stats --seq-len N` prints,
not the few measured steps' share; a `--task` of the user's own (no token data to measure) shows the
measured steps' share instead (`padding_source` says which).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console, Group

from ampkit.bench.candidates import candidate_spec
from ampkit.bench.config import BenchConfig
from ampkit.bench.parallel import refuse_ranks
from ampkit.bench.runner import WORKERS_DIR, plan_bench, run_worker, worker_timeout_s
from ampkit.bench.timing import summarize_steps
from ampkit.bench.zygote import warm_workers
from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.data.stats import WAY_OF_BATCHING, DataStats, data_stats
from ampkit.errors import UsageError
from ampkit.precision import REFERENCE
from ampkit.provenance import summary_header
from ampkit.report.console import Footnotes, column_format, columns, compact_table
from ampkit.runs import (
    SUMMARY_FILE,
    create_run_dir,
    make_dir,
    remove_quietly,
    summary_marks_write_failure,
    write_json_atomic,
)
from ampkit.train.features import feature_set_unavailable, get_feature_sets

if TYPE_CHECKING:
    from ampkit.bench.runner import BenchPlan
    from ampkit.bench.zygote import Zygote
    from ampkit.train.features import FeatureSet

SWEEP_SCHEMA_VERSION = 1
BASELINE = "baseline"


def run_sweep(
    config: BenchConfig, *, names: str = "", out: str | None = None, console: Console | None = None
) -> tuple[dict[str, Any], Path]:
    """Every chosen feature combination under one precision; returns (summary, run directory)."""
    console = console or Console(stderr=True)
    refuse_ranks(config.parallel, "--sweep")
    plan = plan_bench(config)  # the same up-front checks as a precision bench
    # the bench adds the fp32 reference itself: what the user chose besides it is the precision to sweep under
    chosen = [p for p in plan.precisions if not candidate_spec(p).is_reference] if config.precisions else []
    if len(chosen) > 1:
        raise UsageError("--sweep compares switches under ONE precision: pass a single --precisions value")
    precision = chosen[0] if chosen else REFERENCE
    feature_sets = get_feature_sets("" if names in ("", "all") else names)
    if BASELINE not in [fs.name for fs in feature_sets]:
        feature_sets = [fs for fs in get_feature_sets(BASELINE)] + feature_sets
    run_dir = create_run_dir(out, "bench-sweep")
    with summary_marks_write_failure(run_dir, "bench-sweep", console):  # disk full: "status": "failed", exit 1
        make_dir(run_dir / WORKERS_DIR)
        write_json_atomic(run_dir / "config.json", {**plan.config.to_dict(), "sweep": [fs.name for fs in feature_sets]})
        device = torch.device(plan.info.type)
        started, rows = time.perf_counter(), []
        padding = SweepPadding(plan.config)
        with warm_workers(  # as bench's workers
            device_type=device.type, distributed=plan.config.parallel.distributed, workers=run_dir / WORKERS_DIR
        ) as zygote:
            for fs in feature_sets:
                why = feature_set_unavailable(fs, device=device)
                if why:
                    rows.append({"variant": fs.name, "settings": fs.settings(), "status": "skipped", "error": why})
                    console.print(f"[yellow]{fs.name} skipped:[/] {why}", soft_wrap=True)
                    continue
                console.print(f"measuring {fs.name} ({precision}) ...")
                rows.append(padding.fill(_measure(fs, precision, plan, run_dir, zygote)))
        summary = _summary(plan, precision, rows, run_dir, wall_s=time.perf_counter() - started)
        write_json_atomic(run_dir / SUMMARY_FILE, summary)
        render_sweep_report(summary, run_dir)
    return summary, run_dir


def _measure(fs: FeatureSet, precision: str, plan: BenchPlan, run_dir: Path, zygote: Zygote | None) -> dict[str, Any]:
    workers = run_dir / WORKERS_DIR
    stem = fs.name.replace("+", "_")
    paths = {
        k: workers / f"{stem}.{s}"
        for k, s in (("job", "job.json"), ("result", "result.json"), ("log", "log"), ("fidelity", "fidelity.pt"))
    }
    write_json_atomic(
        paths["job"],
        {
            "config": plan.config.to_dict(),
            "precision": precision,
            "features": fs.settings(),
            "result_path": str(paths["result"]),
            "fidelity_path": str(paths["fidelity"]),
        },
    )
    timeout_s = worker_timeout_s(plan.config)
    death = run_worker(paths["job"], paths["log"], on_event=lambda event: None, timeout_s=timeout_s, zygote=zygote)
    if not plan.config.keep_tensors:  # the sweep compares no fidelity: its captures are not needed
        remove_quietly(paths["fidelity"])
    base = {"variant": fs.name, "settings": fs.settings(), "log": str(paths["log"].relative_to(run_dir))}
    if not paths["result"].is_file():
        return {**base, "status": "failed", "error": death or "worker exited without a result"}
    result = json.loads(paths["result"].read_text(encoding="utf-8"))
    if result["status"] != "ok":
        return {**base, "status": "failed", "error": result["error"]}
    stats = summarize_steps(result["step_s"], result["tokens"], result["slots"])
    processed = result.get("processed") or result["tokens"]  # a worker before the token account: no masks
    return {
        **base,
        "status": "ok",
        "error": None,
        "measured_steps": stats.measured_steps,
        "tokens_per_s": stats.items_per_s,
        # the ratio first: exactly 1.0 where nothing is masked (a * b / b need not be a in floating point)
        "processed_per_s": stats.items_per_s * (sum(processed) / max(1, sum(result["tokens"]))),
        "step_ms_median": stats.step_ms_median,
        # the measured steps' share (processed / slots); `SweepPadding.fill` puts data stats' figure here
        "padding_fraction": 1.0 - sum(processed) / max(1, sum(result["slots"])),
        "padding_source": "measured steps",
        "peak_memory_bytes": result["memory"]["peak_bytes"],
        "final_loss": result["loss_curve"][-1],
        "throughput": result.get("throughput"),
    }


class SweepPadding:
    """Each row's padding share from `ampkit data stats` (its batching and dedup, the sweep's data, sequence
    length and batch size), computed once per (batching, dedup); a `--task` of the user's own keeps the
    measured steps' share."""

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self._stats: dict[str, DataStats] = {}

    def fill(self, row: dict[str, Any]) -> dict[str, Any]:
        if row["status"] != "ok" or self.config.model.task:
            return row
        batching, dedup = row["settings"]["batching"], row["settings"]["dedup"]
        stats = self._stats.get(dedup)
        if stats is None:
            stats = self._stats[dedup] = self._data_stats(dedup)
        return {
            **row,
            "padding_fraction": stats.padding_waste[WAY_OF_BATCHING[batching]],
            "padding_source": "data stats",
        }

    def _data_stats(self, dedup: str) -> DataStats:
        data = self.config.data
        return data_stats(
            data.data,
            tokenizer=tokenizer_for_model(self.config.model.model),
            seq_len=data.seq_len,
            batch_size=data.batch_size,
            train_on=data.train_on,
            text_field=data.text_field,
            chat_template=data.chat_template or None,
            dedup=dedup,
        )


def _summary(plan: BenchPlan, precision: str, rows: list[dict], run_dir: Path, *, wall_s: float) -> dict[str, Any]:
    base = next((r for r in rows if r["variant"] == BASELINE and r["status"] == "ok"), None)
    for row in rows:
        if base and row["status"] == "ok":
            row["vs_baseline"] = {
                "tokens_per_s": row["tokens_per_s"] / base["tokens_per_s"],
                "memory": row["peak_memory_bytes"] / base["peak_memory_bytes"],
            }
    ok = [r for r in rows if r["status"] == "ok"]
    best = max(ok, key=lambda r: r["tokens_per_s"]) if ok else None
    return {
        "schema": "ampkit.bench-sweep/1",
        "schema_version": SWEEP_SCHEMA_VERSION,
        "command": "bench-sweep",
        **summary_header(info=plan.info, config=plan.config.to_dict(), wall_s=wall_s),
        "precision": precision,
        "device": {"type": plan.info.type, "name": plan.info.name},
        "rows": rows,
        "fastest": best["variant"] if best else None,
    }


SWEEP_HEADERS = ["switches", "tokens/s", "vs base", "step ms", "padding", "peak MiB", "mem vs base"]
SWEEP_LEGEND = (
    "tokens/s: trained tokens (with a loss); padding: ampkit data stats' share of slots for the row's batching; "
    "ratios against the baseline (pad batching, AdamW, no checkpointing, no compile)"
)
PROCESSED_HEADER = "processed/s"
PROCESSED_LEGEND = "processed/s: tokens read, masked ones too (prompts), padding not"


def shows_processed(rows: list[dict[str, Any]]) -> bool:
    """Whether processed tokens/s differ from the trained ones anywhere (masked prompts): then they get
    their own column beside them; on text data they are the same number."""
    return any(
        abs(r.get("processed_per_s", r["tokens_per_s"]) - r["tokens_per_s"]) > 1e-9 * r["tokens_per_s"]
        for r in rows
        if r["status"] == "ok"
    )


def sweep_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    """One row per combination of switches; a combination that did not run shows its status as a footnote
    (`wide`: a status column, and the error in it). Processed tokens/s beside the trained ones where they
    differ (`shows_processed`); at 80 columns "mem vs base" then makes room for them (`wide` keeps it)."""
    notes = Footnotes()
    ok = [r for r in summary["rows"] if r["status"] == "ok"]
    vs = [(r.get("vs_baseline") or {}) for r in ok]
    processed = shows_processed(summary["rows"])
    formats = {
        "tokens/s": column_format([r["tokens_per_s"] for r in ok], sig=2, most=1),
        PROCESSED_HEADER: column_format([r.get("processed_per_s") for r in ok], sig=2, most=1),
        "vs base": column_format([v.get("tokens_per_s") for v in vs], sig=3, most=2, suffix="x"),
        "step ms": column_format([r["step_ms_median"] for r in ok], sig=3, most=1),
        "padding": column_format([100 * r["padding_fraction"] for r in ok], decimals=1, suffix="%"),
        "peak MiB": column_format([r["peak_memory_bytes"] / 2**20 for r in ok], decimals=0),
        "mem vs base": column_format([v.get("memory") for v in vs], decimals=2, suffix="x"),
    }
    shown = [
        h for h in formats if (h != PROCESSED_HEADER or processed) and (wide or not processed or h != "mem vs base")
    ]
    cells = dict(zip((r["variant"] for r in ok), zip(*(formats[h] for h in shown))))
    rows = []
    for r in summary["rows"]:
        row_numbers = list(cells.get(r["variant"], ["-"] * len(shown)))
        if wide:
            rows.append([r["variant"], r["status"], *row_numbers, r.get("error") or ""])
        else:
            failed = f"{r['variant']}: {r['status']}: {r.get('error')}" if r["status"] != "ok" else None
            rows.append([notes.mark(r["variant"], failed), *row_numbers])
    title = f"ampkit bench --sweep · {summary['precision']} · {summary['device']['name']}"
    legend = [SWEEP_LEGEND, *([PROCESSED_LEGEND] if processed else [])]
    if wide:
        headers = [SWEEP_HEADERS[0], "status", *shown, "error"]
        return compact_table(title, columns(headers, names=2, notes=1), rows, notes=legend)
    return compact_table(title, columns([SWEEP_HEADERS[0], *shown]), rows, notes=[*legend, *notes.lines()])


def _report_row(r: dict[str, Any]) -> list[str]:
    """The report's cells of one row (a row that did not run: zeros, its status beside them)."""
    return [
        r["variant"],
        r["status"],
        f"{r.get('tokens_per_s', 0):,.0f}",
        f"{r.get('processed_per_s', r.get('tokens_per_s', 0)):,.0f}",
        f"{(r.get('vs_baseline') or {}).get('tokens_per_s', 0):.2f}x",
        f"{r.get('step_ms_median', 0):.0f}",
        f"{r.get('padding_fraction', 0):.1%}" + (" (measured)" if r.get("padding_source") == "measured steps" else ""),
        f"{r.get('peak_memory_bytes', 0) / 2**20:,.0f}",
    ]


def render_sweep_report(summary: dict[str, Any], run_dir: Path) -> tuple[Path, Path]:
    """report.html (bars of trained and processed tokens/s and memory per combination) and report.md, from
    summary.json alone."""
    from ampkit.report import Report, as_stored, plt

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    title = f"ampkit bench --sweep: {summary['precision']} on {summary['device']['name']}"
    report = Report(title, provenance=summary.get("provenance"))
    report.text(
        f"Fastest: {summary['fastest']}. Trained tokens/s counts the tokens with a loss (not padding, not "
        "masked prompts); processed tokens/s the tokens read (masked ones too). Padding is ampkit data "
        "stats' share of slots for the row's batching and dedup (one epoch of the sampler's batches). "
        "Ratios are against the baseline (pad batching, AdamW, no checkpointing, no compile), all in one run.",
        kind="note",
    )
    ok = [r for r in summary["rows"] if r["status"] == "ok"]
    headers = ["switches", "status", "trained tokens/s", "processed tokens/s", "vs baseline", "step ms"]
    report.table([*headers, "padding", "peak MiB"], [_report_row(r) for r in summary["rows"]])
    for r in summary["rows"]:
        if r["status"] != "ok":
            report.text(f"{r['variant']}: {r['status']}: {r['error']}", kind="warn")
    if ok:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
        names = [r["variant"] for r in ok]
        if shows_processed(ok):
            processed = [r.get("processed_per_s", r["tokens_per_s"]) for r in ok]
            axes[0].barh(names, processed, color="#c7d3e8", label="processed (masked too)")
        axes[0].barh(names, [r["tokens_per_s"] for r in ok], color="#4c72b0", label="trained")
        axes[0].set_title("tokens/s (higher is better)")
        axes[0].legend(fontsize=8)
        axes[1].barh(names, [r["peak_memory_bytes"] / 2**20 for r in ok], color="#dd8452")
        axes[1].set_title("peak memory, MiB (lower is better)")
        report.figure(fig, "what each combination of switches buys")
    return report.write(run_dir)


def sweep_names_ok(names: str) -> None:
    """Validate `--sweep NAMES` before anything runs (UsageError lists the known names)."""
    if names not in ("", "all"):
        get_feature_sets(names)
