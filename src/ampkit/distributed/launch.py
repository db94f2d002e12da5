"""`ampkit train --nproc-per-node N` (alias `--nproc N`): start N processes on this node through torchrun's launcher.

This is `torchrun --standalone --nproc-per-node N -m ampkit train ...` called in-process
(`torch.distributed.run`): a local rendezvous on a free loopback port, one worker per rank, and
the whole job stopped when one worker fails. Several nodes need torchrun itself, with rendezvous
flags (docs/distributed.md). When a worker fails, the error is one line naming every failed rank
and its exit code or signal; the failed rank's own message is printed above it by that rank. A rank
that hung (its peers timed out waiting for it at a collective, `--dist-timeout-s`, and left a note
in the rank folder, `distributed.context.leave_rank_note`) is named as the one that hung.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

from ampkit.config import given_flags
from ampkit.distributed.context import RANK_DIR_ENV, read_rank_notes
from ampkit.errors import RunInterrupted, TrainingError
from ampkit.provenance import handed_to_ranks

EXIT_USAGE = 2


def worker_argv(
    args: argparse.Namespace, config_cls, *, skip: tuple[str, ...] = ("nproc_per_node",), options: dict[str, Any]
) -> list[str]:
    """The command line each worker runs: every config flag the user gave (minus `skip`), then
    `options` (flag name -> value; True means a bare switch, None/False/0 are left out)."""
    argv: list[str] = []
    for name, value in given_flags(config_cls, args).items():  # a section's settings too, by their own names
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    for name, value in options.items():
        if value is True:
            argv.append("--" + name)
        elif value not in (None, False, 0, ""):
            argv += ["--" + name, str(value)]
    return argv


def relaunch(*, nproc: int, module_argv: list[str]) -> int:
    """Run `python -m ampkit MODULE_ARGV` as `nproc` ranks on this node; returns the exit code.

    A job whose workers failed with a usage error (or rank 0 alone did, RUN_DIR being in use, and
    the launcher stopped the others) returns 2 (each already printed why); any other failure raises
    `TrainingError` naming the failed ranks. SIGTERM/SIGINT sent to this process
    are passed on to every worker by torchrun (each stops gracefully at the same step, after a
    checkpoint) and raise `RunInterrupted` here (exit code 128 + signal)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    launcher_args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0", "--module", "ampkit", *module_argv]
    )
    with _rank_folder() as folder:
        try:
            with handed_to_ranks():  # the ranks' summaries record the command line typed here
                torchrun(launcher_args)
        except ChildFailedError as err:
            codes = {failure.exitcode for failure in err.failures.values()}
            if EXIT_USAGE in codes and codes <= {EXIT_USAGE, -signal.SIGTERM}:  # the rest stopped by the launcher
                return EXIT_USAGE
            notes = read_rank_notes(folder)
            raise TrainingError(describe_failures(err.failures, nproc=nproc, notes=notes)) from None
        except SignalException as err:  # the launcher was signalled: torchrun forwarded it to every worker
            raise RunInterrupted(
                f"stopped by {signal.Signals(err.sigval).name}: torchrun passed it on to every rank, "
                f"which stop together at a log step and checkpoint; continue with --resume RUN_DIR "
                f"--nproc-per-node {nproc}",
                signum=int(err.sigval),
            ) from None
    return 0


@contextlib.contextmanager
def _rank_folder() -> Iterator[str]:
    """The folder the ranks leave their notes in ($AMPKIT_RANK_DIR, handed to every worker through
    the environment torchrun copies): the caller's when set, else a temporary one, removed after."""
    given = os.environ.get(RANK_DIR_ENV)
    if given:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="ampkit-ranks-") as folder:
        os.environ[RANK_DIR_ENV] = folder
        try:
            yield folder
        finally:
            os.environ.pop(RANK_DIR_ENV, None)


def describe_failures(failures: dict[int, Any], *, nproc: int, notes: dict[int, dict[str, Any]] | None = None) -> str:
    """One line naming each failed rank and how it ended, the root cause first. A rank its peers timed
    out waiting for (`notes`: the ranks that left `timed_out`) comes first, named as hung; then the
    ranks that failed on their own, before those that failed because of a peer (their notes say
    `timed_out` or `lost_contact`); ranks the launcher itself stopped (SIGTERM, after another rank
    failed) after those; within each, the order they failed (timestamps are whole seconds: within
    one, a rank killed by a signal before one that exited, then by rank)."""
    waited = {rank for rank, note in (notes or {}).items() if note.get("timed_out")}
    lost = {rank for rank, note in (notes or {}).items() if note.get("lost_contact")}
    hung = {rank for rank in failures if waited and rank not in waited}

    def order(item):
        rank, failure = item
        by_itself = (rank not in hung, rank in waited | lost, failure.exitcode == -signal.SIGTERM)
        return (*by_itself, failure.timestamp, failure.exitcode >= 0, rank)  # same second: a signal's death first

    ordered = sorted(failures.items(), key=order)
    parts = [f"rank {rank} {_how(failure.exitcode, hung=rank in hung, notes=notes)}" for rank, failure in ordered]
    return (
        "distributed job failed: " + "; ".join(parts) + " (each rank's own error is printed above; "
        f"complete checkpoints are intact: continue with --resume RUN_DIR --nproc-per-node {nproc})"
    )


def _how(exitcode: int, *, hung: bool = False, notes: dict[int, dict[str, Any]] | None = None) -> str:
    if hung:
        waited = sorted(rank for rank, note in (notes or {}).items() if note.get("timed_out"))
        timeout = max(float(notes[rank].get("timeout_s", 0)) for rank in waited) if notes else 0
        who = ", ".join(f"rank {rank}" for rank in waited)
        waits = f"{who} timed out after {timeout:g} s waiting for it at a collective, --dist-timeout-s"
        return f"hung ({waits}) and {_how(exitcode)}"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"
