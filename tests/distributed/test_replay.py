"""`doctor --from` of a data-parallel run: its sharded (DCP) checkpoint read whole in one process
(`read_sharded_whole`), the job's global batch replayed as `grad_accum x world_size` micro-batches of the one
stream the ranks were dealt: the replayed losses are the job's, and the injected fault is convicted."""

from __future__ import annotations

import json

import pytest

from ampkit.cli import main
from ampkit.diagnostics.inject import parse_fault_spec
from ampkit.distributed.checkpoint import list_sharded

FAULT = "blocks.1.mlp:forward:nan@5"
REL = 1e-5  # fp32 DDP vs one process: reduction order only (test_equivalence's tolerance)


@pytest.mark.slow
def test_a_ddp_run_replays_in_one_process(tmp_path, launch, capsys):
    out = tmp_path / "ddp"
    argv = [*launch.TINY, "--steps", "6", "--checkpoint-every", "2", "--parallel", "ddp", "--detect-nonfinite"]
    proc = launch.ampkit("train", *argv, "--inject", FAULT, "--nproc", "2", "--out", str(out))
    assert proc.returncode == 1 and "non-finite loss" in proc.stderr  # diverged at step 5
    assert [p.name for p in list_sharded(out)] == ["step-00000002.dcp", "step-00000004.dcp"]
    capsys.readouterr()
    assert main(["doctor", "--from", f"{out}@3", "--replays", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["replay"]["source"]["checkpoint_step"] == 2 and summary["replay"]["window"] == {
        "first": 3,
        "last": 5,
    }
    spec = parse_fault_spec(FAULT)
    assert summary["replay"]["attribution"]["site"] == {"step": 5, "module": spec.module, "phase": spec.phase}
    job = launch.train_losses(out)  # the mean over ranks of the job's steps 3 and 4
    assert summary["run"]["losses"][:2] == pytest.approx([job[3], job[4]], rel=REL)
