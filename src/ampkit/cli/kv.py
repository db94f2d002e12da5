"""`ampkit kv`: the KV-cache token budget of serving a model on a GPU, side by side per KV dtype.

bytes/token = 2 x layers x KV heads x head dim x bytes(KV dtype); pool = GPU memory x utilization
- weights - activation reserve - non-torch overhead; max tokens and concurrent requests at a context
length. Writes summary.json (schema "ampkit.kv/1") and report.html into the run directory.
"""

from __future__ import annotations

import argparse

from ampkit.cli import add_run_command, add_wide_flag
from ampkit.cli.plan import write_planned_run
from ampkit.config import resolve_config
from ampkit.plan.config import KvConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.planner import build_kv
from ampkit.plan.render.report import kv_budget_lines, kv_table, write_kv_report
from ampkit.report.console import make_console, print_run_dir


def register(subparsers) -> argparse.ArgumentParser:
    parser = add_run_command(
        subparsers,
        "kv",
        KvConfig,
        "How many tokens and requests a GPU's KV cache holds, per KV dtype (GiB = 1024^3 B).",
    )
    add_wide_flag(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    config = resolve_config(KvConfig, args, toml_path=args.config)
    if (config.gpu or "").strip().lower() == "list":  # the GPU table, as `plan --gpu list`
        from ampkit.plan.render.gpu_list import print_gpu_list

        return print_gpu_list(make_console(wide=args.wide))
    if config.from_bench:
        return _run_measured(config, args)
    desc = describe_model(config.model)
    summary = build_kv(config, desc=desc)

    def show(summary: dict, run_dir) -> None:
        _print(summary, run_dir, wide=args.wide)

    return write_planned_run(args, "kv", summary, show=show, write_report=write_kv_report)


def _print(summary: dict, run_dir, *, wide: bool = False) -> None:
    console = make_console(wide=wide)
    for line in kv_budget_lines(summary):
        console.print(line, markup=False)
    console.print(kv_table(summary))
    if summary["budget"]["pool_bytes"] <= 0:
        console.print(
            "[yellow]warning:[/] nothing is left for the KV cache: use a larger GPU, lower-precision "
            "weights (--weight-dtype) or a smaller --batched-tokens"
        )
    print_run_dir(console, run_dir, "summary.json, report.html")


def _run_measured(config: KvConfig, args: argparse.Namespace) -> int:
    """`--from-bench RUN_DIR`: the budget from an inference bench's measured bytes and activations."""
    from ampkit.plan.kv.measured import measured_budget, measured_table, read_bench, write_measured_report

    assert config.from_bench is not None  # the caller checked
    summary = measured_budget(config, read_bench(config.from_bench))

    def show(summary: dict, run_dir) -> None:
        console = make_console(wide=args.wide)
        console.print(measured_table(summary))
        print_run_dir(console, run_dir, "summary.json, report.html")

    return write_planned_run(args, "kv", summary, show=show, write_report=write_measured_report)
