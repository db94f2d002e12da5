"""`ampkit train`: a real training run with a chosen precision; checkpoints, resumes, logs tokens/s."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from ampkit.cli import add_run_command
from ampkit.config import config_to_toml, given_flags, resolve_config
from ampkit.distributed.checkpoint import check_resume_world_size
from ampkit.distributed.context import launch_env, rank_error, shared_run_dir
from ampkit.distributed.launch import relaunch, worker_argv
from ampkit.errors import TrainingError, UsageError
from ampkit.precision.overrides import applied_note
from ampkit.report.console import key_value_table
from ampkit.runs import create_run_dir
from ampkit.train import TrainConfig, build_run, run_training
from ampkit.train.config import resume_config
from ampkit.train.loggers import check_logger_available


def register(sub) -> argparse.ArgumentParser:
    parser = add_run_command(
        sub,
        "train",
        TrainConfig,
        "Train with a chosen precision; checkpoints, resumes, logs tokens/s.",
        json_help="print summary.json to stdout (no progress bar)",
    )
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=0,
        metavar="N",
        help="stop with a checkpoint after N steps in this invocation (resume later)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as TOML (usable with --config) and exit"
    )
    parser.add_argument(
        "--export",
        nargs=2,
        metavar=("KIND", "RUN_DIR"),
        help="write what a run trained, from its newest checkpoint: merged (a --lora run's merged model, or a full "
        "fine-tune of an hf: model: a Hugging Face folder, safetensors + config + tokenizer files, in the dtype "
        "it trained in) or adapter (a --lora run's peft adapter folder), to --out DIR or "
        "RUN_DIR/export-KIND-step-N; then exit",
    )
    parser.add_argument(
        "--export-dtype",
        metavar="DTYPE",
        help="with --export merged: write the weights in fp32, bf16 or fp16 (default: the dtype they trained in)",
    )
    parser.add_argument(
        "--export-overwrite",
        action="store_true",
        help="with --export: replace the --out folder when it exists and is not empty (default: refused)",
    )
    return parser


def _export(args: argparse.Namespace, console: Console) -> int:
    from ampkit.train.export import export_run

    if args.resume or args.config or given_flags(TrainConfig, args):
        raise UsageError("--export KIND RUN_DIR reads the run's saved config; drop the other settings (--out is kept)")
    kind, run_dir = args.export
    target = export_run(run_dir, kind, out=args.out, dtype=args.export_dtype, overwrite=args.export_overwrite)
    console.print(f"exported {kind} of {run_dir} to {target}")
    if args.json:
        print(json.dumps({"export": kind, "run_dir": str(run_dir), "path": str(target)}))
    return 0


def _resume_config(args: argparse.Namespace) -> tuple[TrainConfig, Path]:
    if args.out or args.config:
        raise UsageError("--resume continues in its own directory with its saved config; drop --out/--config")
    return resume_config(args.resume, given_flags(TrainConfig, args)), Path(args.resume)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if getattr(args, "export", None):
        return _export(args, console)
    if getattr(args, "export_dtype", None) or getattr(args, "export_overwrite", False):
        raise UsageError("--export-dtype and --export-overwrite go with --export KIND RUN_DIR")
    if args.resume:
        config, run_dir = _resume_config(args)
    else:
        config, run_dir = resolve_config(TrainConfig, args, toml_path=args.config), None
    if args.print_config:
        print(config_to_toml(config), end="")
        return 0
    if args.stop_after < 0:
        raise UsageError(f"--stop-after must be >= 0, got {args.stop_after}")
    parallel = config.parallel
    if parallel.nproc_per_node and launch_env() is None:  # --nproc-per-node N: this process becomes torchrun's launcher
        if parallel.nnodes > 1:
            raise UsageError(
                f"--nnodes {parallel.nnodes}: ampkit starts processes on this node only; start each node with "
                f"torchrun --nnodes {parallel.nnodes} --nproc-per-node {parallel.nproc_per_node} "
                "--rdzv-endpoint HOST:PORT -m ampkit train ... (docs/distributed.md)"
            )
        check_logger_available(config.log)  # once here, not once per rank
        if run_dir is not None:  # --resume: a sharded checkpoint of another world size, refused once here
            check_resume_world_size(run_dir, world_size=parallel.nproc_per_node)
        options = {
            "config": args.config,
            "out": args.out,
            "resume": args.resume,
            "stop-after": args.stop_after,
            "json": args.json,
        }
        return relaunch(
            nproc=parallel.nproc_per_node, module_argv=["train", *worker_argv(args, TrainConfig, options=options)]
        )
    objs = build_run(config)  # device check first (and joining the torchrun job), then data and model
    clean = False
    try:
        code = _train(objs, args, run_dir=run_dir, console=console)
        clean = True
        return code
    except (UsageError, TrainingError, RuntimeError) as err:
        named = rank_error(err, rank=objs.parallel.rank) if objs.parallel.distributed else err
        if named is err:  # one process, or not a user or peer problem: as it is (a traceback if unexpected)
            raise
        raise named from None
    finally:
        objs.parallel.close(clean=clean)


def _train(objs, args: argparse.Namespace, *, run_dir: Path | None, console: Console) -> int:
    main = objs.parallel.is_main  # rank 0 alone prints; every rank trains
    for warning in objs.warnings if main else ():
        console.print(f"[yellow]warning:[/] {warning}")
    if objs.lora is not None and main:
        console.print(objs.lora.line(), highlight=False, soft_wrap=True)  # the trainable count (peft's own rule)
    conversion = objs.policy.conversion()
    if conversion is not None and main:  # the low-bit formats: which Linears converted, which stay bf16
        console.print(conversion.note(), highlight=False, markup=False)
    if objs.policy.overridden and main:  # --keep-fp32 / --module-precision: the modules the policy kept
        console.print(applied_note(objs.policy.overridden), highlight=False, markup=False)
    run_dir = run_dir or shared_run_dir(objs.parallel, lambda: create_run_dir(args.out, "train"))
    summary = run_training(
        objs,
        run_dir,
        resume=bool(args.resume),
        console=console,
        show_progress=not args.json,
        stop_after=args.stop_after,
    )
    if args.json and main:
        print(json.dumps(summary, indent=2))
    elif main:
        _print_summary(console, summary, run_dir)
    return 0


def _processed_row(summary: dict) -> list[tuple[str, str]]:
    """Processed tokens/s beside the trained ones, where they differ (masked prompts: instruction data)."""
    trained, processed = summary.get("items_per_s"), summary.get("processed_per_s")
    if not trained or not processed or abs(processed - trained) <= 1e-9 * processed:
        return []
    images = summary.get("image_tokens_per_s")
    rows = [(f"processed {summary['unit']}/s (masked included)", f"{processed:,.0f}")]
    if images:  # a VLM: its image tokens are read, never trained
        rows.append(("  of which image tokens/s", f"{images:,.0f}"))
    return rows


def _print_summary(console: Console, summary: dict, run_dir: Path) -> None:
    """The end-of-run lines: metric and value (a value wraps between words), then the run directory."""
    data = summary.get("data") or {}
    rows = [
        *([("data", f"{data['corpus']} ({data['format']})")] if data.get("format") and data.get("corpus") else []),
        ("steps", f"{summary['steps']}"),
        ("first / final train loss", f"{summary['first_loss']:.4f} / {summary['final_loss']:.4f}"),
        ("held-out loss (start -> end)", _fmt_pair(summary["eval_loss_initial"], summary["eval_loss"])),
        (  # the progress bar's rate is its last window's: this one is the run's; trained items only
            f"{summary['unit']}/s (measured steps, stalls excluded)",
            f"{summary['items_per_s']:,.0f}" if summary["items_per_s"] else "-",
        ),
        *_processed_row(summary),
        ("step time median", f"{summary['step_ms_median']:.1f} ms" if summary["step_ms_median"] else "-"),
        ("skipped steps", f"{summary['skipped_steps']}"),
        ("final loss scale", f"{summary['final_loss_scale']:g}" if summary["final_loss_scale"] else "-"),
    ]
    if summary.get("guard", {}).get("enabled"):
        rows.append(("NaN guard rollbacks", f"{summary['guard']['rollbacks']}"))
    found = summary.get("diagnostics", {}).get("first_nonfinite")
    if found:
        rows.append(("first non-finite", f"{found['module']} ({found['phase']}, step {found['step']})"))
    rows += _slowest_rank_row(summary.get("ranks"))
    console.print(
        key_value_table(f"ampkit train · {summary['config']['precision']} · {summary['model']['preset']}", rows)
    )
    console.print(f"run directory: {run_dir}", highlight=False, markup=False, soft_wrap=True)


def _slowest_rank_row(ranks: list[dict] | None) -> list[tuple[str, str]]:
    """The slowest rank of a data-parallel run: its median step time and straggler score (report: every rank)."""
    scored = [r for r in ranks or [] if r["straggler"] is not None]
    if not scored:
        return []
    slowest = max(scored, key=lambda r: (r["straggler"], -r["rank"]))
    return [
        ("slowest rank", f"rank {slowest['rank']}: {slowest['step_ms_median']:.1f} ms, x{slowest['straggler']:.2f}")
    ]


def _fmt_pair(first, last) -> str:
    return " -> ".join("-" if v is None else f"{v:.4f}" for v in (first, last))
