"""Two gloo ranks train from token shards: 10 steps straight equal 5, stop, resume, 5, bitwise (DDP; each
rank reads its own windows, `RankShardedSampler` skipping the other's: tests/data/test_shards.py)."""

from __future__ import annotations

import pytest

from ampkit.data import ByteTokenizer
from ampkit.data.prepare import prepare


@pytest.mark.slow
def test_two_ranks_resume_mid_shard_bitwise(tmp_path, launch):
    shards = tmp_path / "shards"
    prepare("default", shards, tokenizer=ByteTokenizer(), shard_tokens=50_000, workers=1)
    common = [*launch.TINY, "--data", str(shards), "--steps", "10", "--checkpoint-every", "5"]
    common += ["--parallel", "ddp", "--nproc", "2"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    ran = launch.ampkit("train", *common, "--out", str(straight))
    assert ran.returncode == 0, ran.stderr[-3000:]
    stopped = launch.ampkit("train", *common, "--stop-after", "5", "--out", str(split))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = launch.ampkit("train", "--resume", str(split), "--nproc", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = launch.train_losses(straight), launch.train_losses(split)
    assert sorted(got) == list(range(1, 11))
    assert got == want and want[10] < want[1]
