"""Any task trains data-parallel: 2 ranks == 1 process with the same global batch, for DDP and for
FSDP2 (the convnet's residual blocks are its FSDP2 units; the mlp, naming none, is one unit, the root)."""

from __future__ import annotations

import math

import pytest

from ampkit.cli import main

COMMON = ["--steps", "3", "--batch-size", "4", "--warmup-steps", "1", "--eval-batches", "1"]


@pytest.mark.parametrize(("task", "mode"), [("mlp", "ddp"), ("mlp", "fsdp"), ("convnet", "fsdp")])
def test_two_ranks_train_a_task_like_one_process(tmp_path, launch, task, mode):
    single = tmp_path / "single"
    assert main(["train", "--task", task, *COMMON, "--grad-accum", "2", "--out", str(single), "--json"]) == 0
    out = tmp_path / mode
    proc = launch.ampkit(
        "train", "--task", task, *COMMON, "--parallel", mode, "--nproc", "2", "--out", str(out), "--json"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    one, two = launch.train_losses(single), launch.train_losses(out)
    assert sorted(two) == [1, 2, 3]
    # convnet: BatchNorm normalises over each rank's own micro-batch, as it does per micro-batch in one
    # process with --grad-accum 2 (no SyncBatchNorm): the same statistics, so the same losses.
    assert all(math.isclose(one[s], two[s], rel_tol=1e-5) for s in one), (one, two)
