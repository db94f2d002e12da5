"""Resume is exact: 20 steps straight == 10 steps, stop, resume, 10 more (bitwise on CPU)."""

from __future__ import annotations

import pytest

from ampkit.runs import read_metrics
from ampkit.train.checkpoint import list_checkpoints
from helpers import TINY_ARGS


def _train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]


@pytest.mark.parametrize("precision", ["fp32", "fp16-mixed"])
def test_resume_is_bitwise_exact(tmp_path, run_cli, precision):
    # growth_interval 4 makes the loss scale change during the run, so the scaler state matters.
    # 12 steps, stopped at 6 (fp16's matmuls are emulated, and slow, on a CPU without AVX512-FP16/AMX)
    common = [*TINY_ARGS, "--precision", precision, "--growth-interval", "4", "--checkpoint-every", "3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_cli("train", *common, "--steps", "12", "--out", str(straight))[0] == 0
    assert run_cli("train", *common, "--steps", "12", "--stop-after", "6", "--out", str(split))[0] == 0
    code, _, err = run_cli("train", "--resume", str(split))
    assert code == 0, err
    a, b = _train_records(straight), _train_records(split)
    assert [r["step"] for r in b] == list(range(1, 13))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["grad_norm"] for r in a] == [r["grad_norm"] for r in b]
    assert [r["loss_scale"] for r in a] == [r["loss_scale"] for r in b]
    assert [r["lr"] for r in a] == [r["lr"] for r in b]
    if precision == "fp16-mixed":
        assert a[-1]["loss_scale"] > 65536.0  # the scale grew, so its state really round-tripped


def test_checkpoints_are_kept_last_k_and_complete(tmp_path, run_cli):
    out = tmp_path / "run"
    code, _, _ = run_cli(
        "train", *TINY_ARGS, "--steps", "6", "--checkpoint-every", "2", "--keep-checkpoints", "2", "--out", str(out)
    )
    assert code == 0
    names = [p.name for p in list_checkpoints(out)]
    assert names == ["step-00000004.pt", "step-00000006.pt"]
    assert not list((out / "checkpoints").glob("*.tmp"))
