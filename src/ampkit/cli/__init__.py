"""`ampkit` entry point.

Each command lives in its own module `ampkit.cli.<name>` exposing
`register(subparsers) -> argparse.ArgumentParser` and `run(args) -> int`.
User mistakes surface as `UsageError`: one line on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from ampkit import __version__
from ampkit.errors import RunInterrupted, TrainingError, UsageError

# Order is the order shown in `ampkit --help`.
COMMANDS = ("bench", "train", "doctor", "plan", "kv", "hw", "report")

EXIT_USAGE = 2
EXIT_FAILED = 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (problem + where to look), exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _available_commands():
    for name in COMMANDS:
        module_name = f"ampkit.cli.{name}"
        if importlib.util.find_spec(module_name) is not None:
            yield name, importlib.import_module(module_name)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ampkit",
        description="Choose, prove and run the right numeric precision for PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"ampkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, module in _available_commands():
        command_parser = module.register(sub)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad flag (already printed on one line)
        return exc.code if isinstance(exc.code, int) else 0
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except UsageError as err:
        print(f"ampkit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RunInterrupted as err:
        print(f"ampkit {args.command}: {err}", file=sys.stderr)
        return 128 + err.signum
    except TrainingError as err:
        print(f"ampkit {args.command}: run failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"ampkit {args.command}: interrupted", file=sys.stderr)
        return 130
