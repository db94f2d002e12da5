"""Peak host memory of *building* a training run (no step taken): the transient copies a build makes.

Two cases (issue: no transient fp32 copy of the model):
- `1b` under `bf16-true` in one process: weights should be born in bf16 (~2.3 GiB for 1.24B
  parameters), not built in fp32 (~4.6 GiB) and then converted.
- `small` under FSDP2 with 2 ranks (gloo, CPU): each rank should hold its shard plus one block,
  never the full fp32 model.

Each case runs `ampkit.train.build_run` in a fresh process and reports the growth of the process's
peak RSS (ru_maxrss, KiB on Linux) over the RSS just before the build, in GiB (1024**3). That figure
includes the data, the process group and the lazy imports; the "model build" column isolates the
model: Linux's peak-RSS mark (VmHWM) is reset (`/proc/self/clear_refs` = 5) when `build_run` creates
the precision policy, just before the model, and read after `build_run` returns. Modules a build
imports lazily are imported before measuring.

    python benchmarks/build_memory.py            # both cases, table + benchmarks/results/build_memory.json
    python benchmarks/build_memory.py --case 1b-bf16-true
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GIB = 1024**3  # GiB is 1024**3, GB is 1000**3


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def _current_rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Reset this process's peak-RSS mark (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_since_reset_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def worker(model: str, precision: str, parallel: str, out: str) -> None:
    """Build the run and write {rank: growth} (called in a fresh process, or a torchrun rank)."""
    import torch

    import ampkit.train.build as build_module
    from ampkit.train import TrainConfig, build_run

    mark: dict = {}
    real_build_precision = build_module.build_precision

    def marking_build_precision(*args, **kwargs):  # build_run calls it right before building the model
        mark["rss"], mark["reset"] = _current_rss_bytes(), _reset_peak_rss()
        return real_build_precision(*args, **kwargs)

    build_module.build_precision = marking_build_precision
    # Load what a build imports lazily (FSDP2, DTensor, DDP, the meta-device kernels) before measuring,
    # so the figures count tensors, not code (~0.04 GiB for FSDP2 + DTensor, ~0.07 GiB for meta kernels).
    import torch.distributed.fsdp
    import torch.distributed.tensor
    import torch.nn.parallel

    with torch.device("meta"):
        torch.nn.Linear(2, 2)

    torch.set_num_threads(1)
    config = TrainConfig.of(
        model=model,
        precision=precision,
        parallel=parallel,
        seq_len=64,
        batch_size=1,
        eval_batches=1,
        steps=1,
        device="cpu",
    )
    before = _current_rss_bytes()
    objs = build_run(config)
    peak = _peak_rss_bytes()
    model_growth = _peak_rss_since_reset_bytes() - mark["rss"] if mark.get("reset") else None
    params = sum(p.numel() for p in objs.model.parameters())  # sharded: this rank's local DTensor shape
    rank = objs.parallel.rank
    weights = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in objs.model.parameters())
    record = {
        "rank": rank,
        "peak_growth_bytes": peak - before,
        "model_build_peak_growth_bytes": model_growth,
        "rss_before_bytes": before,
        "parameters": params,
        "local_elements": weights,
        "param_dtype": str(next(objs.model.parameters()).dtype).replace("torch.", ""),
    }
    Path(f"{out}.{rank}").write_text(json.dumps(record))
    objs.parallel.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_case(name: str) -> dict:
    model, precision, parallel = {
        "1b-bf16-true": ("1b", "bf16-true", "none"),
        "small-fsdp2-2ranks": ("small", "fp32", "fsdp"),
    }[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        argv = [str(Path(__file__).resolve()), "--worker", model, precision, parallel, out]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if parallel == "none":
            cmd = [sys.executable, *argv]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"localhost:{_free_port()}",
                "--max-restarts",
                "0",
                *argv,
            ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        ranks = sorted((json.loads(p.read_text()) for p in Path(tmp).glob("result.*")), key=lambda r: r["rank"])
    model_growth = [r["model_build_peak_growth_bytes"] for r in ranks]
    return {
        "case": name,
        "model": model,
        "precision": precision,
        "parallel": parallel,
        "ranks": ranks,
        "max_peak_growth_gib": max(r["peak_growth_bytes"] for r in ranks) / GIB,
        "max_model_build_growth_gib": None if None in model_growth else max(model_growth) / GIB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["1b-bf16-true", "small-fsdp2-2ranks"], action="append")
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "PRECISION", "PARALLEL", "OUT"))
    parser.add_argument("--label", default="", help="tag stored with the results (e.g. before/after)")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    from common import print_table, write_result

    cases = [run_case(name) for name in args.case or ["1b-bf16-true", "small-fsdp2-2ranks"]]
    rows = [
        [
            c["case"],
            c["ranks"][0]["param_dtype"],
            f"{c['ranks'][0]['local_elements']:,}",
            f"{c['max_peak_growth_gib']:.3f}",
            "-" if c["max_model_build_growth_gib"] is None else f"{c['max_model_build_growth_gib']:.3f}",
        ]
        for c in cases
    ]
    headers = ["case", "weights", "elements/rank", "peak RSS growth GiB (max over ranks)", "of which model build"]
    print_table(headers, rows)
    write_result("build_memory" + (f"_{args.label}" if args.label else ""), {"cases": cases})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
