"""`ampkit` entry point.

Each command lives in its own module `ampkit.cli.<name>` exposing
`register(subparsers) -> argparse.ArgumentParser` and `run(args) -> int`. Only the module of the
command being run is imported (torch, matplotlib and the training stack cost ~1-2 s to import);
the others appear in `ampkit --help` through their one-line summaries below.
User mistakes surface as `UsageError`: one line on stderr, exit code 2, no traceback.
A run directory's lock (`ampkit.runs.lock_run_dir`) is held until the command returns; `train
--resume RUN_DIR` (and `train --out DIR` into an existing empty folder) takes it before torch is
imported, so a second process on it is refused at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ampkit import __version__
from ampkit.errors import RunDiverged, RunInterrupted, TrainingError, UsageError
from ampkit.provenance import invoked_as
from ampkit.runs import lock_fresh_out, lock_resumed_run, release_run_dirs
from ampkit.shutdown import end_process

# Order is the order shown in `ampkit --help`.
COMMANDS = {
    "bench": "every precision side by side on this device, with a recommendation",
    "train": "train a model under a chosen precision",
    "doctor": "why a run goes NaN, which layer, and the fix",
    "plan": "memory and compute ledger for a model on a GPU you may not have",
    "kv": "KV-cache token budget for serving, per KV dtype",
    "hw": "what this device can do: native dtypes, TF32, measured matmul throughput",
    "data": "token shards of a corpus (prepare); what a data set costs (stats)",
    "report": "re-render a run's report (HTML with plots, Markdown) from summary.json",
    "launch": "how a cluster starts a train run: torchrun line, sbatch script, Kubeflow TrainJob",
}

EXIT_USAGE = 2
EXIT_FAILED = 1


def add_command(subparsers, name: str, description: str) -> argparse.ArgumentParser:
    """Command `name`'s parser: its one-line summary from COMMANDS for `ampkit --help`, `description`
    for its own --help."""
    return subparsers.add_parser(name, help=COMMANDS[name], description=description)


def add_run_command(subparsers, name: str, config_cls, description: str, **flag_options) -> argparse.ArgumentParser:
    """A run-writing command's parser: `add_command`'s, with a flag per `config_cls` field and
    --config, --out and --json (`ampkit.config.add_command_flags`, which takes `flag_options`)."""
    from ampkit.config import add_command_flags

    parser = add_command(subparsers, name, description)
    add_command_flags(parser, config_cls, command=name, **flag_options)
    return parser


def add_wide_flag(parser: argparse.ArgumentParser) -> None:
    """--wide: every column of the console tables (the default fits the terminal, COLUMNS, else 80)."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print every column of the tables, however wide (default: the main columns, fitting the terminal "
        "or COLUMNS, else 80; report.html and summary.json hold everything)",
    )


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (problem + where to look), exit code 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _selected_command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ampkit",
        description="Choose, prove and run the right numeric precision for PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"ampkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    selected = _selected_command(sys.argv[1:] if argv is None else argv)
    for name, summary in COMMANDS.items():
        if name == selected:
            module = importlib.import_module(f"ampkit.cli.{name}")
            module.register(sub).set_defaults(_run=module.run)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _lock_early(argv: list[str]) -> None:
    """`train --resume RUN_DIR` (or `--out DIR`, an existing empty folder): lock it now, before
    importing torch (~1 s), so that a second process on it is refused at once."""
    if _selected_command(argv) != "train":
        return
    given = _flag_value(argv, "--nproc-per-node") or _flag_value(argv, "--nproc")  # torchrun's name, or its alias
    nproc = int(given) if given and given.isdigit() else None
    if (run_dir := _flag_value(argv, "--resume")) is not None:
        lock_resumed_run(run_dir, nproc=nproc)
    elif (out := _flag_value(argv, "--out")) is not None:
        lock_fresh_out(out, nproc=nproc)


def main(argv: list[str] | None = None) -> int:
    argv_ = sys.argv[1:] if argv is None else argv
    try:
        _lock_early(argv_)
    except (UsageError, TrainingError) as err:
        print(f"ampkit train: {'error' if isinstance(err, UsageError) else 'run failed'}: {err}", file=sys.stderr)
        return EXIT_USAGE if isinstance(err, UsageError) else EXIT_FAILED
    try:
        with invoked_as(argv_):  # the command line the summaries record
            return _main(argv)
    finally:
        release_run_dirs()


def console_main() -> None:
    """The `ampkit` command (and `python -m ampkit`): `main`, then the end of the process without the
    interpreter's teardown of torch's and transformers' modules (`shutdown.end_process`: threads joined,
    atexit handlers run, output flushed), which took 0.7-2.5 s after the last line on the project's 2-core
    machines, in every train rank, bench and plan alike."""
    end_process(main(sys.argv[1:]))


def _main(argv: list[str] | None) -> int:
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad flag (already printed on one line)
        return exc.code if isinstance(exc.code, int) else 0
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command == "train" and getattr(args, "resume", None):  # `--res DIR` (an abbreviation) too
            lock_resumed_run(args.resume, nproc=args.nproc_per_node)
        return int(args._run(args) or 0)
    except UsageError as err:
        print(f"ampkit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RunInterrupted as err:
        print(f"ampkit {args.command}: {err}", file=sys.stderr)
        return 128 + err.signum
    except RunDiverged as err:
        print(f"ampkit {args.command}: run diverged: {err}", file=sys.stderr)
        return EXIT_FAILED
    except TrainingError as err:
        print(f"ampkit {args.command}: run failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # stdout closed early (e.g. `ampkit ... --json | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"ampkit {args.command}: interrupted", file=sys.stderr)
        return 130
