"""Where a run came from: the `provenance` block every summary.json carries.

A report shows the date, the ampkit and torch versions, the device and the command line; `ampkit
report RUN_DIR` re-renders it later, elsewhere, byte for byte. So those facts are recorded here, once,
when the run is made, and the reports read them from summary.json, never from the clock or the
environment of the process that renders.

The command line is the one `ampkit.cli.main` was given (`invoked_as`); the Python API, which has no
command line, records None and the report says so.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from ampkit import __version__

LAUNCHER_COMMAND_LINE_ENV = "AMPKIT_LAUNCHER_COMMAND_LINE"  # set by `train --nproc N` for its ranks only
_ARGV: ContextVar[tuple[str, ...] | None] = ContextVar("ampkit_argv", default=None)


@contextlib.contextmanager
def invoked_as(argv: Sequence[str]) -> Iterator[None]:
    """While a command runs: its argv after `ampkit` (recorded in the summaries it writes)."""
    token = _ARGV.set(tuple(argv))
    try:
        yield
    finally:
        _ARGV.reset(token)


def command_line() -> str | None:
    """`ampkit ARGS...` exactly as given (shell-quoted), or None outside the command line. A rank that
    `train --nproc N` launched records its launcher's command line, the one the user typed."""
    launched = os.environ.get(LAUNCHER_COMMAND_LINE_ENV)
    if launched:
        return launched
    argv = _ARGV.get()
    return None if argv is None else shlex.join(["ampkit", *argv])


@contextlib.contextmanager
def handed_to_ranks() -> Iterator[None]:
    """While `--nproc N` runs its ranks: they inherit this process's command line (restored after)."""
    before, line = os.environ.get(LAUNCHER_COMMAND_LINE_ENV), command_line()
    if line:
        os.environ[LAUNCHER_COMMAND_LINE_ENV] = line
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LAUNCHER_COMMAND_LINE_ENV, None)
        else:
            os.environ[LAUNCHER_COMMAND_LINE_ENV] = before


def torch_version() -> str | None:
    """torch's version without importing it where it is not loaded yet (`plan`, `kv`)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def device_text(info) -> str:
    """One line naming a `DeviceInfo`: "NVIDIA H200 (cuda:0, sm_90, 139.8 GiB)"."""
    where = info.type if info.index is None else f"{info.type}:{info.index}"
    model = f" [{info.gpu_model}]" if getattr(info, "gpu_model", None) else ""
    memory_gib = info.total_memory_bytes / 1024**3  # GiB is 1024**3 bytes
    arch = "" if info.arch_label in (info.type, info.kind) else f", {info.arch_label}"
    return f"{info.name}{model} ({where}{arch}, {memory_gib:.1f} GiB)"


def provenance(*, device: str, config: dict[str, Any] | None) -> dict[str, Any]:
    """The block stored under summary["provenance"]: created (UTC), versions, device, command line and
    the resolved config (the settings the run used, every default included)."""
    return {
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ampkit_version": __version__,
        "torch_version": torch_version(),
        "device": device,
        "command_line": command_line(),
        "config": config,
    }


def summary_header(*, info, config: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The keys every bench summary.json opens with after its schema: versions, created (UTC), the run's
    wall seconds, the provenance block and the resolved config (the same dict twice: readers of schema 1
    read the top-level one)."""
    return {
        "ampkit_version": __version__,
        "torch_version": torch_version(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": wall_s,
        "provenance": provenance(device=device_text(info), config=config),
        "config": config,
    }
