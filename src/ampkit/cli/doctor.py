"""`ampkit doctor`: numerics diagnosis of a precision on a model.

Audits each module's fp32 range against fp16's (before training), finds the first module and phase
where inf/nan appears, forecasts fp16 gradient underflow and overflow, records the loss-scale
trajectory, runs the 16-sample smoke test and the per-layer fidelity check, and maps the findings
to fixes. Writes summary.json, report.html and report.md
into the run directory; `--json` prints the summary on stdout.

Try it: `ampkit doctor --precision fp16-mixed --unsafe-op blocks.1.mlp` (a demo op that overflows
in fp16), then again with `--keep-fp32 blocks.1.mlp` (the advised fix).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console

from ampkit.cli import add_run_command, add_wide_flag
from ampkit.config import resolve_config
from ampkit.diagnostics.config import DoctorConfig, doctor_defaults
from ampkit.diagnostics.doctor import run_doctor
from ampkit.diagnostics.doctor_report import print_console, write_report
from ampkit.errors import RunInterrupted, UsageError
from ampkit.hardware import describe_device, pick_device
from ampkit.plan.fit_check import check_fit, vocab_size_for
from ampkit.report.console import make_console
from ampkit.runs import (
    SUMMARY_FILE,
    create_run_dir,
    release_run_dir,
    remove_quietly,
    summary_marks_write_failure,
    write_json_atomic,
)
from ampkit.tasks.load import is_language_model


def register(sub) -> argparse.ArgumentParser:
    parser = add_run_command(
        sub,
        "doctor",
        DoctorConfig,
        "Numerics diagnosis: range audit (each module's fp32 range against fp16's), first non-finite module "
        "(forward and backward), gradient underflow/overflow forecast, loss-scale trajectory, smoke overfit test, "
        "per-layer fidelity against fp32, advice.",
        json_help="print summary.json to stdout",
    )
    add_wide_flag(parser)
    return parser


def _check_fits(config: DoctorConfig, *, device) -> None:
    """The diagnostic run's step (AdamW, no accumulation or checkpointing: `run_doctor`'s) against
    the device, before any model is built; `--no-fit-check` skips it."""
    if config.fit_check:
        check_fit(
            model=config.model.model,
            precision=config.precision,
            batch_size=config.batch_size,
            seq_len=config.seq_len,
            device=device,
            vocab_size=vocab_size_for(config.model.model),
            command="doctor",
            lora=config.lora,
            overrides=config.overrides,  # --keep-fp32: those weights in fp32
            images=config.model.image_args(),  # an hf: VLM: its images and frozen parts
        )


def run(args: argparse.Namespace) -> int:
    config = resolve_config(DoctorConfig, args, toml_path=args.config)
    if config.from_run:  # a train run's failing window, replayed with the run's own settings
        return _run_from(config, args)
    device = pick_device(config.device)
    resolved, _ = doctor_defaults(config, describe_device(device))  # "0 = auto" filled in (run_doctor does too)
    if is_language_model(config.model.task):  # the planner's ledger plans language models
        _check_fits(resolved, device=device)  # before any model is built
    console = Console(stderr=True)
    run_dir = create_run_dir(args.out, "doctor")
    write_json_atomic(run_dir / "config.json", dataclasses.asdict(resolved))
    try:
        result = run_doctor(
            config,
            progress=lambda line: console.print(f"[dim]doctor:[/] {line}", highlight=False),
            warn=lambda line: console.print(f"[yellow]warning:[/] {line}", soft_wrap=True),  # as bench and train
        )
    except UsageError:
        release_run_dir(run_dir)
        _remove_config_and_dir(run_dir)
        raise
    summary = result.summary
    with summary_marks_write_failure(run_dir, "doctor", console):  # disk full: "status": "failed", exit 1
        write_json_atomic(run_dir / SUMMARY_FILE, summary)
        write_report(summary, run_dir)
    if result.signum is not None:
        stopped = summary["interrupted"]
        raise RunInterrupted(
            f"interrupted by {stopped['signal']} during the {stopped['during']} (parts finished: "
            f"{', '.join(stopped['finished']) or 'none'}); what was measured is in {run_dir / SUMMARY_FILE}",
            signum=result.signum,
        )
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_console(make_console(wide=args.wide), summary, run_dir)
    return 0


def _run_from(config: DoctorConfig, args: argparse.Namespace) -> int:
    """`doctor --from RUN_DIR[@STEP]` (`ampkit.train.replay`): train's resume machinery, then the replays
    (and with --try-fixes each fix's); a bad RUN_DIR, STEP or fix is refused before any run directory is made."""
    from ampkit.train.doctor_api import replay_to_dir

    console = Console(stderr=True)
    fixes = ", then each fix" if config.try_fixes or config.also_try else ""
    console.print(f"[dim]doctor:[/] replaying {config.from_run} ({config.replays} replays{fixes})", highlight=False)
    summary, run_dir = replay_to_dir(config, args.out, console=console)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_console(make_console(wide=args.wide), summary, run_dir)
    return 0


def _remove_config_and_dir(path: Path) -> None:
    """A bad --inject path is found once the model exists: leave no run directory behind."""
    remove_quietly(path / "config.json")
    try:
        path.rmdir()
    except OSError:
        pass
