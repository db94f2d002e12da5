"""`ampkit plan`: the memory and compute ledger of a training step, for GPUs you do not have.

Per precision x optimizer x activation checkpointing: each ledger line at the step's peak
(parameters, gradients, optimizer states, fp32 master weights, weight copies, activations,
temporaries, framework reserve) in GiB, whether it fits a target GPU and the largest micro-batch and
sequence that do, FLOPs and step time, and the recommended precision with the cheapest change that
makes the run fit. `--trace` also runs one real step on fake tensors and compares.
Writes summary.json (schema "ampkit.plan/1") and report.html into the run directory.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from ampkit.cli import add_run_command, add_wide_flag
from ampkit.config import resolve_config
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.planner import build_plan
from ampkit.provenance import provenance
from ampkit.runs import create_run_dir, summary_marks_write_failure, write_json_atomic

PLANNED_DEVICE = "none: planned on this host (nothing measured on a device)"


def register(subparsers) -> argparse.ArgumentParser:
    parser = add_run_command(
        subparsers, "plan", PlanConfig, "Plan a training step's memory (GiB = 1024^3 B) and compute without the GPU."
    )
    add_wide_flag(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    config = resolve_config(PlanConfig, args, toml_path=args.config)
    if (config.gpu or "").strip().lower() == "list":  # the GPU table, every row with its source; no run directory
        from ampkit.plan.render.gpu_list import print_gpu_list
        from ampkit.report.console import make_console

        return print_gpu_list(make_console(wide=args.wide))
    if config.link.strip().lower() == "list":  # the link table, every row with its sources; no run directory
        from ampkit.plan.render.comms import print_link_list
        from ampkit.report.console import make_console

        return print_link_list(make_console(wide=args.wide))
    if config.task:
        return _run_task(config, args)
    desc = describe_model(config.model)  # bad model or config.json: refused before the run dir exists
    if config.lora.enabled:
        return _run_lora(config, args, desc)
    summary = build_plan(config, desc=desc)

    def show(summary: dict, run_dir) -> None:
        _print(summary, run_dir, wide=args.wide)

    def write_report(summary: dict, run_dir: Path) -> object:
        from ampkit.plan.render.report import write_plan_report  # with --json, rich loads after the answer

        return write_plan_report(summary, run_dir)

    return write_planned_run(args, "plan", summary, show=show, write_report=write_report)


def write_planned_run(
    args: argparse.Namespace,
    command: str,
    summary: dict,
    *,
    show: Callable[[dict, Path], None],
    write_report: Callable[[dict, Path], object],
) -> int:
    """`plan`'s and `kv`'s run directory (config.json, summary.json, report.html) and answer: the
    summary as JSON with --json, else `show(summary, run_dir)`."""
    summary = {"schema": summary["schema"], "command": command, **summary, "provenance": planned_provenance(summary)}
    run_dir = create_run_dir(args.out, command)
    with summary_marks_write_failure(run_dir, command):  # disk full: "status": "failed", exit 1
        write_json_atomic(run_dir / "config.json", summary["config"])
        write_json_atomic(run_dir / "summary.json", summary)
        if args.json:
            print(json.dumps(summary, indent=2), flush=True)
        else:
            show(summary, run_dir)
        write_report(summary, run_dir)  # after the answer is on screen: plotting takes a moment
    return 0


def planned_provenance(summary: dict) -> dict:
    """A plan's provenance: nothing ran on a device (the ledger is computed; a trace runs on fake tensors),
    unless `--formats --measure` timed GEMMs on one."""
    measured = (summary.get("formats") or {}).get("measured") or {}
    timed = measured.get("device") if measured and not measured.get("skipped") else None
    device = f"{timed} (--measure timed GEMMs on it; the rest is planned)" if timed else PLANNED_DEVICE
    return provenance(device=device, config=summary["config"])


def _print(summary: dict, run_dir, *, wide: bool = False) -> None:
    from ampkit.plan.render.comms import comm_table
    from ampkit.plan.render.report import (
        agreement_table,
        compute_table,
        has_traced,
        ledger_table,
        model_table,
        recommendation_lines,
    )
    from ampkit.report.console import make_console, print_run_dir

    console = make_console(wide=wide)
    traced = has_traced(summary)  # --trace, or a transformers architecture planned by its traced engine
    if summary.get("workload"):  # an image-text model: its parts and images (plan/vlm)
        from ampkit.plan.vlm.render import parts_table, vlm_model_table

        console.print(vlm_model_table(summary))
        console.print(ledger_table(summary, wide=wide))
        console.print(parts_table(summary))
    else:
        console.print(model_table(summary["model"]))
        console.print(ledger_table(summary, wide=wide))
    console.print(compute_table(summary, wide=wide))
    comm = comm_table(summary, wide=wide)
    if comm is not None:  # --parallel ddp|fsdp
        console.print(comm)
    if traced:
        console.print(agreement_table(summary, wide=wide))
    for line in recommendation_lines(summary["recommendation"], summary["target"]):
        console.print(line, markup=False)
    for precision, why in (summary.get("refused") or {}).items():
        console.print(f"not planned: {precision}: {why}", style="yellow", markup=False)
    if summary.get("fp8"):
        from ampkit.plan.analytic.fp8 import fp8_line

        console.print(fp8_line(summary["fp8"]), markup=False)
        if summary["fp8"].get("warning"):
            console.print(f"warning: {summary['fp8']['warning']}", style="yellow", markup=False)
    if summary.get("formats"):
        from ampkit.plan.render.payoff import payoff_tables

        for part in payoff_tables(summary["formats"], summary["model"]["name"]):
            if isinstance(part, str):
                console.print(part, markup=False, highlight=False)
            else:
                console.print(part)
    print_run_dir(console, run_dir, "summary.json, report.html")


def _run_task(config: PlanConfig, args: argparse.Namespace) -> int:
    """A task other than the language model: its own model traced on fake tensors, one setting a row."""
    from ampkit.plan.task_plan import build_task_plan, task_plan_table, write_task_plan_report
    from ampkit.report.console import make_console, print_run_dir
    from ampkit.tasks.load import image_args, load_task

    task = load_task(config.task, config.task_args, images=image_args(config))  # --freeze etc.: `--task vlm`'s
    summary = build_task_plan(config, task)  # a bad task: before the run dir

    def show(summary: dict, run_dir) -> None:
        console = make_console(wide=args.wide)
        console.print(task_plan_table(summary, wide=args.wide))
        console.print(summary["analytic_note"], markup=False)
        print_run_dir(console, run_dir, "summary.json, report.html")

    return write_planned_run(args, "plan", summary, show=show, write_report=write_task_plan_report)


def _run_lora(config: PlanConfig, args: argparse.Namespace, desc) -> int:
    """`--lora RANK`: the LoRA ledger rows and full fine-tuning vs LoRA vs QLoRA (`ampkit.plan.lora.plan`)."""
    from ampkit.plan.lora.plan import build_lora_plan, lora_rows_table, methods_table, write_lora_plan_report
    from ampkit.plan.render.report import model_table
    from ampkit.report.console import make_console, print_run_dir

    summary = build_lora_plan(config, desc=desc)  # a model or precision LoRA plans refuse: before the run dir

    def show(summary: dict, run_dir) -> None:
        console = make_console(wide=args.wide)
        console.print(model_table(summary["model"]))
        console.print(lora_rows_table(summary, wide=args.wide))
        console.print(methods_table(summary, wide=args.wide))
        for note in summary["notes"]:
            console.print(note, markup=False)
        print_run_dir(console, run_dir, "summary.json, report.html")

    return write_planned_run(args, "plan", summary, show=show, write_report=write_lora_plan_report)
