"""Sharded (DCP) checkpoints of a 2-rank FSDP2 run, in one story of three launches:
1. the run stops gracefully after 2 steps (`--stop-after 2`), writing a step-2 checkpoint;
2. it resumes, and rank 1 dies while the step-4 checkpoint is being written (tests/distributed/
   inject/sitecustomize.py: exit code 7 right after rank 1 wrote its shards): the job must fail,
   name the rank, and leave step 2 as the latest checkpoint;
3. it resumes again from step 2 and finishes: the losses equal the uninterrupted run's, bitwise.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from ampkit.distributed.checkpoint import MANIFEST, list_sharded

DIE = {"AMPKIT_TEST_DIE_RANK": "1", "AMPKIT_TEST_DIE_STEP": "4"}


def _with_inject(here) -> str:
    """The injection folder first, and the PYTHONPATH the tests run with after it (a checkout's src/)."""
    return os.pathsep.join(p for p in (str(here / "inject"), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="module")
def story(tmp_path_factory, launch):
    out = tmp_path_factory.mktemp("story") / "run"
    stopped = launch.ampkit(
        "train", *launch.FSDP_FP32, "--nproc", "2", "--stop-after", "2", "--out", str(out), "--json"
    )
    after_stop = SimpleNamespace(checkpoints=[p.name for p in list_sharded(out)], losses=launch.train_losses(out))
    crashed = launch.ampkit(
        "train", "--resume", str(out), "--nproc", "2", env={"PYTHONPATH": _with_inject(launch.HERE), **DIE}
    )
    partial = out / "checkpoints" / "step-00000004.dcp.tmp"
    after_crash = SimpleNamespace(
        checkpoints=[p.name for p in list_sharded(out)],
        partial_is_dir=partial.is_dir(),
        partial_has_rank1_shards=any(partial.glob("__1_*.distcp")),
        partial_has_manifest=(partial / MANIFEST).exists(),
    )
    resumed = launch.ampkit("train", "--resume", str(out), "--nproc", "2", "--json")
    return SimpleNamespace(
        out=out,
        stopped=stopped,
        after_stop=after_stop,
        crashed=crashed,
        after_crash=after_crash,
        resumed=resumed,
        partial=partial,
    )


@pytest.mark.slow
def test_graceful_stop_writes_a_complete_sharded_checkpoint(story):
    assert story.stopped.returncode == 0, story.stopped.stderr[-3000:]
    assert story.after_stop.checkpoints == ["step-00000002.dcp"]
    assert sorted(story.after_stop.losses) == [1, 2]


@pytest.mark.slow
def test_a_dying_rank_fails_the_job_naming_it(story):
    assert story.crashed.returncode == 1
    assert "rank 1 exited with code 7" in story.crashed.stderr
    assert "Traceback" not in story.crashed.stderr


@pytest.mark.slow
def test_a_half_written_checkpoint_is_never_the_latest(story):
    assert story.after_crash.checkpoints == ["step-00000002.dcp"]
    assert story.after_crash.partial_is_dir and story.after_crash.partial_has_rank1_shards
    assert not story.after_crash.partial_has_manifest


@pytest.mark.slow
def test_resume_continues_with_the_uninterrupted_losses(story, launch, fsdp_fp32_run):
    assert story.resumed.returncode == 0, story.resumed.stderr[-3000:]
    assert launch.train_losses(story.out) == launch.train_losses(fsdp_fp32_run)  # same ranks, same order: bitwise
    assert not story.partial.exists()  # the next save cleared the debris
