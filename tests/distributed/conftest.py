"""Fixtures for the distributed tests: 2 CPU ranks over gloo, loopback only, every launch with a timeout.

The `launch` fixture carries the helpers (`launch.ampkit(...)`, `launch.torchrun(...)`, ...), since
test modules here are not importable from each other."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ampkit.runs import read_metrics
from helpers import run_ampkit

HERE = Path(__file__).resolve().parent
LAUNCH_TIMEOUT_S = 120  # a tiny 2-rank run takes ~10 s here; a hang must fail, not block the suite
# Tiny runs: the tiny preset, 32-token rows, 2 sequences per micro-batch, a few steps.
TINY = ["--model", "tiny", "--seq-len", "32", "--batch-size", "2", "--warmup-steps", "2", "--eval-batches", "2"]


def free_port() -> int:
    """A free loopback port (bound to port 0, then released) for torchrun's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}
    env.pop("RANK", None)  # never inherit a torchrun identity
    env.pop("WORLD_SIZE", None)
    return env


def ampkit(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m ampkit ...` as its own process (`--nproc 2` makes it torchrun's launcher; forked from the
    warm process where it can be, tests/warm_ampkit.py)."""
    return run_ampkit(argv, env=_env(env), timeout=LAUNCH_TIMEOUT_S)


def torchrun(script: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc-per-node 2` with a c10d rendezvous on a free port."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{free_port()}",
        "--max-restarts",
        "0",
        str(script),
        *argv,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=_env(None))


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("event") == "train"}


@pytest.fixture(scope="session")
def launch() -> SimpleNamespace:
    return SimpleNamespace(
        ampkit=ampkit,
        torchrun=torchrun,
        train_losses=train_losses,
        free_port=free_port,
        TINY=TINY,
        HERE=HERE,
        FSDP_FP32=FSDP_FP32,
    )


# The uninterrupted FSDP2 fp32 run: checked against one process (test_equivalence) and against a
# stopped-and-resumed run and a run that lost a rank (test_checkpoint_resume).
FSDP_FP32 = [
    *TINY,
    "--precision",
    "fp32",
    "--steps",
    "4",
    "--grad-accum",
    "2",
    "--checkpoint-every",
    "2",
    "--parallel",
    "fsdp",
]


@pytest.fixture(scope="session")
def fsdp_fp32_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp-fp32") / "run"
    proc = ampkit("train", *FSDP_FP32, "--nproc", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
