"""The safety net under `--parallel`: an inf injected in the backward of a block on rank 1 of 2.

Both ranks must decide together (the guard's all-reduced flag), roll back together to the sharded
step-2 checkpoint, and go on as one process would: a 1-rank `--grad-accum 2` run with the same fault
on the same micro-batch (rank 1's batch of step 3 is that run's 6th micro-batch: the sampler deals
batch r, r + W, ... to rank r). Had one rank not rolled back, its replica (DDP) or shards (FSDP2)
would keep the non-finite update and the later losses would be nan, or the job would hang.
The locator runs on each rank; the summary and report name rank 1 and the block. Under DDP the
gradient meters run too (rank 0's, written by rank 0; FSDP2 refuses them: sharded gradients).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from ampkit.cli import main
from ampkit.core.parallel import LocalRun
from ampkit.diagnostics.train_hooks import build_train_diagnostics
from ampkit.errors import UsageError
from ampkit.sections import GuardSection

FAULT_STEP, STEPS = 3, 5
NET = ["--precision", "fp32", "--steps", str(STEPS), "--guard", "--checkpoint-every", "2", "--detect-nonfinite"]
RANK1_FAULT = ["--inject", f"blocks.0:backward:inf@{FAULT_STEP}", "--inject-rank", "1"]
REL = 1e-5  # fp32 DDP / FSDP2 vs one process: reduction order only (test_equivalence's tolerance)


def _events(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == kind]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, launch):
    out = tmp_path_factory.mktemp("guard-1") / "run"
    fault = ["--inject", f"blocks.0:backward:inf@{2 * FAULT_STEP}"]  # the 2nd micro-batch of step 3
    code = main(["train", *launch.TINY, *NET, "--grad-accum", "2", *fault, "--out", str(out), "--json"])
    assert code == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_fault_on_rank_1_rolls_every_rank_back_as_one_process_would(tmp_path, launch, one_process, mode):
    out = tmp_path / mode
    meters = ["--grad-stats-every", "2"] if mode == "ddp" else []
    argv = [*launch.TINY, *NET, *RANK1_FAULT, *meters, "--parallel", mode, "--nproc", "2", "--out", str(out)]
    proc = launch.ampkit("train", *argv, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    if meters:  # rank 0's statistics at steps 2 and 4, and the updates of the replicated weights
        assert [r["step"] for r in _events(out, "grad_stats")] == [2, 4]
        assert [r["step"] for r in _events(out, "update_stats")] == [2, 4]
    [rollback] = _events(out, "rollback")
    assert (rollback["step"], rollback["to_step"]) == (FAULT_STEP, 2)
    # the reduced gradient norm is the job's: every rank saw it, and said so in the agreed reason
    assert "non-finite gradient norm" in rollback["reason"] and rollback["reason"].endswith("on every rank")
    got, want = launch.train_losses(out), launch.train_losses(one_process)  # after the rollback: the re-run step
    assert sorted(got) == list(range(1, STEPS + 1)) == sorted(want)
    for step in want:
        assert math.isclose(got[step], want[step], rel_tol=REL), (step, got[step], want[step])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["guard"]["rollbacks"] == 1 and summary["status"] == "completed"
    first = summary["diagnostics"]["first_nonfinite"]
    assert (first["rank"], first["module"], first["phase"], first["step"]) == (1, "blocks.0", "backward", FAULT_STEP)
    assert summary["diagnostics"]["inject"]["fired_steps"] == {"0": [], "1": [FAULT_STEP]}  # rank 1 alone
    assert [e["rank"] for e in _events(out, "nonfinite")] == [1]
    assert "blocks.0 (backward, step 3, rank 1)" in (out / "report.md").read_text()


def test_a_fault_rank_past_the_world_size_is_one_line(launch, capsys):
    argv = ["train", *launch.TINY, "--steps", "1", *RANK1_FAULT[:-1], "2", "--parallel", "ddp", "--nproc", "2"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "--inject-rank 2 is past the job's 2 rank(s) (0..1)" in err
    assert len(err.strip().splitlines()) == 1


def test_a_fault_rank_is_checked_against_the_joined_world():
    """Under a bare torchrun the world size is known only once the process has joined the job."""
    fault = GuardSection(inject="blocks.0:backward:inf@3", inject_rank=1)
    objs = SimpleNamespace(parallel=LocalRun(), model=None, policy=None, optimizer=None)  # refused before any hook
    with pytest.raises(UsageError, match=r"--inject-rank 1 is past the job's 1 rank\(s\)"):
        build_train_diagnostics(objs, fault, micro_batches=1)
