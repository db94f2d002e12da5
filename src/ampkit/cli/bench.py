"""`ampkit bench`: train the same model on the same data from the same seed under every precision this
device supports, side by side; report tokens/s, step time, MFU, memory, fidelity and stability; recommend one.

Progress goes to stderr; the final table to stdout. `--json` prints summary.json to stdout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from ampkit.bench import BenchConfig, run_bench
from ampkit.cli import add_run_command
from ampkit.config import resolve_config

WIDE_COLUMNS = 200


def register(sub) -> argparse.ArgumentParser:
    parser = add_run_command(
        sub,
        "bench",
        BenchConfig,
        "Measure every precision this device supports on the same model, data and seed: tokens/s, step time, MFU, "
        "peak memory, fidelity against fp32, stability; then recommend one. No arguments: the tiny model on the "
        "embedded corpus.",
        json_help="print summary.json to stdout (no progress bars)",
    )
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        default=None,
        metavar="NAMES",
        help="instead of precisions, compare throughput switches under one precision: all, or "
        "comma-separated names (baseline, bucket, pack, pack+checkpointing, pack+adamw-8bit, "
        "pack+compile, pack+dedup)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from ampkit.bench.render import (  # matplotlib loads with the report
        console_table,
        profile_table,
        recommendation_text,
        train_text,
        why_lines,
    )

    config = resolve_config(BenchConfig, args, toml_path=args.config)
    if config.serving.inference:
        return _run_inference(config, args)
    if args.sweep is not None:
        return _run_sweep(config, args)
    summary, run_dir = run_bench(config, out=args.out, console=Console(stderr=True), show_progress=not args.json)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    out = Console(width=None if sys.stdout.isatty() else WIDE_COLUMNS)  # a pipe or file gets the whole row
    out.print(console_table(summary))
    if summary.get("profile"):
        out.print(profile_table(summary))
        for line in why_lines(summary):
            out.print(line, highlight=False, soft_wrap=True)
    rec_style = "bold green" if summary["recommendation"]["precision"] else "bold red"
    out.print(f"[{rec_style}]{recommendation_text(summary)}[/]", highlight=False, soft_wrap=True)
    train = train_text(summary)
    if train:
        out.print(train, highlight=False, soft_wrap=True)
    for line in summary["recommendation"]["advice"]:
        out.print(f"[yellow]{line}[/]", soft_wrap=True)
    out.print(f"run directory: {run_dir} (report.html, report.md, summary.json)")
    return 0


def _run_sweep(config: BenchConfig, args: argparse.Namespace) -> int:
    from ampkit.bench.sweep import run_sweep, sweep_names_ok, sweep_table

    sweep_names_ok(args.sweep)  # unknown names are refused before anything runs
    summary, run_dir = run_sweep(config, names=args.sweep, out=args.out, console=Console(stderr=True))
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    out = Console(width=None if sys.stdout.isatty() else WIDE_COLUMNS)
    out.print(sweep_table(summary))
    out.print(f"fastest: {summary['fastest']}; run directory: {run_dir} (report.html, report.md, summary.json)")
    return 0


def _run_inference(config: BenchConfig, args: argparse.Namespace) -> int:
    from ampkit.bench.inference_render import console_table
    from ampkit.bench.inference_run import run_inference_bench

    summary, run_dir = run_inference_bench(
        config, out=args.out, console=Console(stderr=True), show_progress=not args.json
    )
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    out = Console(width=None if sys.stdout.isatty() else WIDE_COLUMNS)
    out.print(console_table(summary))
    out.print(f"[bold green]Recommendation: {summary['recommendation']['reason']}[/]", highlight=False, soft_wrap=True)
    out.print(f"run directory: {run_dir} (report.html, report.md, summary.json)")
    return 0
