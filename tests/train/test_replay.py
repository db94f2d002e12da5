"""`ampkit.train.replay`: `--from RUN_DIR[@STEP]` read, and the checkpoint and window chosen from a run's
record (the replay itself, end to end: tests/diagnostics/test_replay.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampkit.errors import UsageError
from ampkit.train import TrainConfig
from ampkit.train.checkpoint import checkpoint_path, manifest_path
from ampkit.train.replay import RecordedRun, Window, checkpoint_steps, choose_window, parse_from, sharded_run


def _run(tmp_path: Path, *, checkpoints: list[int], failures: list[int], last: int) -> RecordedRun:
    """A run directory whose checkpoint files exist by name (the window is chosen from names alone)."""
    for step in checkpoints:
        path = checkpoint_path(tmp_path, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        manifest_path(path).write_text("{}")
    return RecordedRun(
        run_dir=tmp_path, config=TrainConfig(), last_step=last, failures=failures, finding=None, fired=[], device=None
    )


def test_parse_from_splits_the_step():
    assert parse_from("runs/x") == (Path("runs/x"), None)
    assert parse_from("runs/a@b@40") == (Path("runs/a@b"), 40)
    with pytest.raises(UsageError, match="must be a number"):
        parse_from("runs/x@forty")


def test_the_window_ends_at_the_first_failure_after_the_checkpoint(tmp_path):
    run = _run(tmp_path, checkpoints=[10, 20, 30, 40], failures=[40, 55], last=60)
    assert choose_window(run, None) == Window(checkpoint=30, first=31, last=40, failure=40)
    assert choose_window(run, 45) == Window(checkpoint=40, first=41, last=55, failure=55)  # a guarded run's second
    assert choose_window(run, 25) == Window(checkpoint=20, first=21, last=40, failure=40)


def test_a_run_without_a_failure_after_the_step_replays_a_horizon(tmp_path):
    run = _run(tmp_path, checkpoints=[10, 20], failures=[], last=100)
    assert choose_window(run, 10) == Window(checkpoint=10, first=11, last=30, failure=None)


@pytest.mark.parametrize(
    ("checkpoints", "failures", "at", "words"),
    [
        ([50], [40], None, "no checkpoint before its failure at step 40 (checkpoints at steps: 50)"),
        ([10], [40], 70, "the run ended at step 60"),
        ([10], [], None, "recorded no non-finite step"),
        ([10, 60], [], 60, "is the run's end"),
    ],
)
def test_bad_windows_are_one_line(tmp_path, checkpoints, failures, at, words):
    run = _run(tmp_path, checkpoints=checkpoints, failures=failures, last=60)
    with pytest.raises(UsageError, match="--from") as err:
        choose_window(run, at)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_sharded_runs_checkpoints_are_its_dcp_directories(tmp_path):
    for step in (10, 20):
        folder = tmp_path / "checkpoints" / f"step-{step:08d}.dcp"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-00000030.dcp").mkdir()  # no manifest: incomplete, never read
    assert sharded_run(tmp_path) and checkpoint_steps(tmp_path) == [10, 20]
    run = _run(tmp_path, checkpoints=[], failures=[25], last=25)
    assert choose_window(run, None) == Window(checkpoint=20, first=21, last=25, failure=25)
