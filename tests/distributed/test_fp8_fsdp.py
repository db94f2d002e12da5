"""fp8 under FSDP2: torchao's float8 all-gather of the weights (emulated on CPU, 2 ranks over gloo)."""

from __future__ import annotations

import math


def test_fp8_trains_under_fsdp2_with_float8_all_gather(tmp_path, launch):
    out = tmp_path / "fsdp-fp8"
    proc = launch.ampkit(
        "train",
        *launch.TINY,
        "--precision",
        "fp8-emulated",
        "--steps",
        "2",
        "--parallel",
        "fsdp",
        "--nproc",
        "2",
        "--out",
        str(out),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert launch.train_losses(out) and all(math.isfinite(v) for v in launch.train_losses(out).values())
