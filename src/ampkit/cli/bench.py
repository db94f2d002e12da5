"""`ampkit bench`: train the same model on the same data from the same seed under every precision this
device supports, side by side; report tokens/s, step time, MFU, memory, fidelity and stability; recommend one.

Progress goes to stderr; the final table to stdout. `--json` prints summary.json to stdout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from rich.console import Console

from ampkit.bench import BenchConfig, run_bench
from ampkit.bench.config import GATE_NOT_HERE
from ampkit.bench.timing import process_age_s
from ampkit.cli import add_run_command, add_wide_flag
from ampkit.config import resolve_config
from ampkit.errors import UsageError
from ampkit.report.console import make_console, print_run_dir


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
    add_wide_flag(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    config = resolve_config(BenchConfig, args, toml_path=args.config)
    if config.serving.inference:
        return _run_inference(config, args)
    if args.sweep is not None:
        if config.gate:
            raise UsageError(GATE_NOT_HERE.format(mode="--sweep", why="one precision's switches, no fp32 run"))
        return _run_sweep(config, args)
    started = time.perf_counter() - process_age_s()  # the command's wall time counts from its process start
    summary, run_dir = run_bench(
        config, out=args.out, console=Console(stderr=True), show_progress=not args.json, started=started
    )
    code = _answer(args, summary, run_dir, show_bench)
    return code or int((summary.get("gate") or {}).get("exit_status") or 0)  # 3: the recommended one fails --gate


def _answer(args: argparse.Namespace, summary: dict, run_dir, show: Callable[..., None]) -> int:
    """summary.json on stdout under --json (nothing else), else the command's table at the terminal's width."""
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        show(make_console(wide=args.wide), summary, run_dir, wide=args.wide)
    return 0


def show_bench(out: Console, summary: dict, run_dir, *, wide: bool = False) -> None:
    """The answer on stdout: the side-by-side table, the profile, the recommendation and the train command."""
    from ampkit.bench.budget_text import took_line
    from ampkit.bench.render import (  # matplotlib loads with the report
        console_table,
        profile_table,
        recommendation_text,
        train_lines,
        why_lines,
    )

    out.print(console_table(summary, wide=wide))
    if summary.get("profile"):
        out.print(profile_table(summary, wide=wide))
        for line in why_lines(summary):
            out.print(line, highlight=False)
    rec_style = "bold green" if summary["recommendation"]["precision"] else "bold red"
    out.print(recommendation_text(summary), style=rec_style, highlight=False, markup=False)
    for i, line in enumerate(train_lines(summary)):  # the command (the second line) is copied whole: never wrapped
        out.print(line, highlight=False, markup=False, soft_wrap=i == 1)
    for line in summary["recommendation"]["advice"]:
        out.print(line, style="yellow", markup=False)
    print_run_dir(out, run_dir, "report.html, report.md, summary.json")
    took = took_line(summary)
    if took:
        out.print(took, highlight=False, markup=False)


def _run_sweep(config: BenchConfig, args: argparse.Namespace) -> int:
    from ampkit.bench.sweep import run_sweep, sweep_names_ok

    sweep_names_ok(args.sweep)  # unknown names are refused before anything runs
    summary, run_dir = run_sweep(config, names=args.sweep, out=args.out, console=Console(stderr=True))
    return _answer(args, summary, run_dir, show_sweep)


def show_sweep(out: Console, summary: dict, run_dir, *, wide: bool = False) -> None:
    from ampkit.bench.sweep import sweep_table

    out.print(sweep_table(summary, wide=wide))
    out.print(f"fastest: {summary['fastest']}", highlight=False, markup=False)
    print_run_dir(out, run_dir, "report.html, report.md, summary.json")


def _run_inference(config: BenchConfig, args: argparse.Namespace) -> int:
    from ampkit.bench.inference_run import run_inference_bench

    summary, run_dir = run_inference_bench(
        config, out=args.out, console=Console(stderr=True), show_progress=not args.json
    )
    return _answer(args, summary, run_dir, show_inference)


def show_inference(out: Console, summary: dict, run_dir, *, wide: bool = False) -> None:
    from ampkit.bench.inference_render import console_table

    out.print(console_table(summary, wide=wide))
    reason = summary["recommendation"]["reason"]
    out.print(f"Recommendation: {reason}", style="bold green", highlight=False, markup=False)
    print_run_dir(out, run_dir, "report.html, report.md, summary.json")
