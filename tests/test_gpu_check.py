"""The GPU check script's --dry-run runs its code paths on CPU (the real run needs a CUDA device)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    names = [row["name"] for row in result["bench"]["precisions"]]
    assert names == result["sizes"]["precisions"]
    assert all(row["status"] != "failed" for row in result["bench"]["precisions"])
    assert result["train_1b"]["eager"]["tokens_per_s"] > 0
    assert result["planner"]["predicted_tensor_peak_bytes"] > 0
    assert "recommendation:" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_without_cuda_says_so():
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
