"""Checkpoint integrity: atomic writes, checksums, identity, failed writes (real ones: a file-size limit;
the CLI-level write faults are in tests/reliability/test_disk_faults.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from unittest import mock

import pytest
import torch

from ampkit.errors import UsageError, WriteFailed
from ampkit.train.checkpoint import (
    CheckpointWriteFailed,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    manifest_path,
    save_checkpoint,
)
from helpers import limit_file_size

PAYLOAD = {"model": {"w": torch.arange(1000, dtype=torch.float32)}}


def _save(tmp_path, step, keep=3):
    return save_checkpoint(tmp_path, step, PAYLOAD, keep=keep, identity={"model": "tiny"})


def test_round_trip_and_manifest(tmp_path):
    path = _save(tmp_path, 5)
    manifest = json.loads(manifest_path(path).read_text())
    assert manifest["step"] == 5 and manifest["identity"] == {"model": "tiny"} and len(manifest["sha256"]) == 64
    state = load_checkpoint(path, identity={"model": "tiny"})
    assert torch.equal(state["model"]["w"], PAYLOAD["model"]["w"]) and state["step"] == 5


@pytest.mark.parametrize("damage", ["bitflip", "truncate"])
def test_damaged_checkpoint_is_detected_never_loaded(tmp_path, damage):
    path = _save(tmp_path, 1)
    data = bytearray(path.read_bytes())
    if damage == "bitflip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[:-100]
    path.write_bytes(bytes(data))
    with mock.patch("torch.load") as loader, pytest.raises(UsageError, match="checksum mismatch"):
        load_checkpoint(path)
    loader.assert_not_called()


def test_identity_mismatch_is_refused(tmp_path):
    path = _save(tmp_path, 1)
    with pytest.raises(UsageError, match="model='tiny'.*model='small'"):
        load_checkpoint(path, identity={"model": "small"})


def test_incomplete_writes_are_ignored(tmp_path):
    _save(tmp_path, 1)
    folder = tmp_path / "checkpoints"
    (folder / "step-00000002.pt.tmp").write_bytes(b"partial")  # killed while writing the payload
    (folder / "step-00000003.pt").write_bytes(b"no manifest yet")  # killed before the manifest
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001.pt"]
    assert load_latest(tmp_path)["step"] == 1


# Real faults, in a child process under a file-size limit (RLIMIT_FSIZE: torch's zip writer then
# fails as it does on a full disk: a RuntimeError chained from the OSError).
_FAILED_WRITE = """
import sys, torch
from pathlib import Path
from ampkit.train.checkpoint import CheckpointWriteFailed, save_checkpoint
run_dir = Path(sys.argv[1])
save_checkpoint(run_dir, 1, {"w": torch.zeros(1000)}, keep=3)  # 4 KB: fits the limit
try:
    save_checkpoint(run_dir, 2, {"w": torch.zeros(100_000)}, keep=3)  # 400 KB: does not
except CheckpointWriteFailed as err:
    print(err)
"""


def test_failed_write_keeps_previous_latest(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _FAILED_WRITE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_file_size(64 * 1024),
    )
    assert proc.returncode == 0, proc.stderr
    assert "checkpoint write at step 2 failed" in proc.stdout and "File too large (EFBIG)" in proc.stdout
    assert "previous checkpoint (step 1)" in proc.stdout
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001.pt"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001.json", "step-00000001.pt"]
    assert load_latest(tmp_path)["step"] == 1


def test_keep_last_k(tmp_path):
    for step in range(1, 6):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000004.pt", "step-00000005.pt"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000004.json",
        "step-00000004.pt",
        "step-00000005.json",
        "step-00000005.pt",
    ]


def test_checkpoint_write_failed_is_a_write_failed_and_takes_a_bare_message():
    err = CheckpointWriteFailed("checkpoint write at step 3 failed (disk full)")  # the call sites of before
    assert isinstance(err, WriteFailed) and str(err) == "checkpoint write at step 3 failed (disk full)"
    err = CheckpointWriteFailed("/run/checkpoints/step-00000003.pt", "No space left on device (ENOSPC)")
    assert str(err) == "cannot write /run/checkpoints/step-00000003.pt: No space left on device (ENOSPC)"
