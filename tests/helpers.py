"""Shared test constants and helpers (importable because pytest's `pythonpath` includes tests/)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warm_ampkit import WarmAmpkit

# A training run small enough for tests: tiny preset, short rows, few steps.
TINY_ARGS = ["--model", "tiny", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2", "--eval-batches", "2"]
# A bench of a built-in task short enough for tests: half a second of measured steps per precision.
QUICK_TASK_BENCH = ["--budget-s", "0.5", "--min-steps", "3", "--max-steps", "12", "--warmup-steps", "1"]


def train_losses(run_dir) -> dict[int, float]:
    """step -> training loss of a run directory's metrics.jsonl (floats as written: bitwise comparable)."""
    from ampkit.runs import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("event") == "train"}


REAL_RUNS: dict[str, list[str]] = {
    # a real two-precision bench on the tiny model: 1 warmup (2 untimed steps) and 3 measured steps each,
    # with a convergence gate every candidate passes (tests/bench/test_gate.py reads its gaps)
    "bench": [
        "bench",
        "--precisions",
        "fp32,bf16-mixed",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--gate",
        "10",
    ],
    # bench with LoRA adapters, fp32 and bf16-mixed (tests/bench/test_bench_lora.py compares them on the
    # adapters' gradients; bf16's 1 warmup + 2 steps are emulated, hence slow, on an AVX2-only CPU)
    "bench-lora": [
        "bench",
        "--lora",
        "4",
        "--precisions",
        "fp32,bf16-mixed",
        "--model",
        "tiny",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
    ],
    # serving: fp32 and bf16 weights, each with its own KV dtype and fp8 (fp32/fp32 among them)
    "bench-inference": [
        "bench",
        "--inference",
        "--weights",
        "fp32,bf16",
        "--kv-dtypes",
        "weights,fp8",
        "--prompt-len",
        "16",
        "--gen-tokens",
        "4",
        "--infer-batch",
        "2",
        "--repeats",
        "1",
    ],
    # a sweep under fp32 (baseline, then each variant in its own worker), --json: stdout is summary.json
    "sweep": [
        "bench",
        "--sweep",
        "pack,pack+checkpointing",
        "--seq-len",
        "48",
        "--batch-size",
        "4",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--json",
    ],
    "train": ["train", *TINY_ARGS, "--precision", "fp16-mixed", "--steps", "3"],  # fp16: a loss-scale curve
    # doctor without the smoke test: 3 fp32 steps (tests/cli/test_report_roundtrip.py, tests/report/test_browser.py)
    "doctor": ["doctor", "--precision", "fp32", "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--no-smoke"],
    "hw": ["hw", "--quick", "--device", "cpu"],
    # the planners and data stats (a second or two each): every summary kind has a real run here
    "plan": ["plan", "--model", "tiny", "--seq-len", "64", "--gpu", "T4"],
    "plan-task": ["plan", "--task", "mlp", "--precisions", "fp32,bf16-mixed", "--checkpointing", "none"],
    "plan-lora": ["plan", "--model", "tiny", "--seq-len", "64", "--lora", "8", "--gpu", "T4"],
    "kv": ["kv", "--model", "tiny", "--gpu", "A100-80GB"],
    "kv-from-bench": ["kv", "--from-bench", "real-run:bench-inference", "--gpu", "A100-80GB"],
    "data-stats": ["data", "stats", "default", "--seq-len", "64"],
}
"""Real small runs that several test modules only read (tests/report/test_console_width.py prints their
tables at 80 columns; tests/cli/test_report_roundtrip.py renders their reports again byte for byte;
tests/summaries/test_published.py validates their summaries against the published JSON Schemas;
tests/bench/test_bench_cli.py and test_sweep.py check the bench's and the sweep's summary and report;
tests/report/test_browser.py opens the bench's, the train's and the doctor's report.html in Chromium)."""
REAL_RUN_COLUMNS = 80
REAL_RUN_DIR = "real-run:"
"""An argument `real-run:NAME` of a `REAL_RUNS` entry stands for that real run's directory (run first)."""


def limit_file_size(limit_bytes: int):
    """A `preexec_fn`: no file larger than `limit_bytes` (RLIMIT_FSIZE, no privileges needed), and
    SIGXFSZ ignored, so an oversized write fails with EFBIG as on a full quota instead of killing."""

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return preexec


_WARM: dict[str, WarmAmpkit] = {}


def warm_ampkit() -> WarmAmpkit:
    """This pytest worker's warm process (tests/warm_ampkit.py), made at the first use, started at the first command."""
    from warm_ampkit import WarmAmpkit

    if "it" not in _WARM:
        _WARM["it"] = WarmAmpkit()
    return _WARM["it"]


def run_ampkit(argv, *, env: dict[str, str], timeout: float, cwd=None, file_size_limit: int | None = None, **kwargs):
    """`python -m ampkit ARGV` with `env`, forked from the warm process where a child of it starts as a cold
    process would (tests/warm_ampkit.py says when), else cold; returns the CompletedProcess (text output)."""
    from warm_ampkit import WarmGone

    warm = warm_ampkit()
    env = {**env, **warm.rank_env()}  # torchrun's ranks, if any, fork from it too (tests/warm_python)
    if not kwargs.keys() - {"input"} and warm.can_run(env):
        try:
            return warm.run(list(argv), env=env, cwd=cwd, timeout=timeout, fsize=file_size_limit, **kwargs)
        except WarmGone as err:
            print(f"tests/warm_ampkit.py: {err}; starting commands cold from now on", file=sys.stderr)
    warm.note_cold(argv, env)
    preexec = limit_file_size(file_size_limit) if file_size_limit else None
    return subprocess.run(
        [sys.executable, "-m", "ampkit", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        preexec_fn=preexec,
        **kwargs,
    )


def ampkit_process(*argv: str, file_size_limit: int | None = None, timeout: float = 600, **kwargs):
    """`python -m ampkit ARGV` as its own process (forked from the warm process where it can be: `run_ampkit`);
    returns the CompletedProcess (text output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the suite (tests/conftest.py)
    env.pop("RANK", None)
    return run_ampkit(argv, env=env, timeout=timeout, file_size_limit=file_size_limit, **kwargs)


def cpu_runs_fp8_matmuls() -> bool:
    """Whether this CPU's oneDNN multiplies float8 (`torch._scaled_mm`): AMX/AVX512-FP16 Xeons do; an
    AVX2-only CPU (or `ONEDNN_MAX_CPU_ISA=AVX2`) cannot create the primitive."""
    import torch

    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True
