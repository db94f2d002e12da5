"""Shared test constants and helpers (importable because pytest's `pythonpath` includes tests/)."""

import os
import resource
import signal
import subprocess
import sys

# A training run small enough for tests: tiny preset, short rows, few steps.
TINY_ARGS = ["--model", "tiny", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2", "--eval-batches", "2"]


def limit_file_size(limit_bytes: int):
    """A `preexec_fn`: no file larger than `limit_bytes` (RLIMIT_FSIZE, no privileges needed), and
    SIGXFSZ ignored, so an oversized write fails with EFBIG as on a full quota instead of killing."""

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return preexec


def ampkit_process(*argv: str, file_size_limit: int | None = None, timeout: float = 600, **kwargs):
    """`python -m ampkit ARGV` in a fresh process; returns the CompletedProcess (text output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    env.pop("RANK", None)
    preexec = limit_file_size(file_size_limit) if file_size_limit else None
    return subprocess.run(
        [sys.executable, "-m", "ampkit", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=preexec,
        **kwargs,
    )
