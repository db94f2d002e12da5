"""Checkpoint integrity: atomic writes, checksums, identity, failed writes."""

from __future__ import annotations

import errno
import json
from unittest import mock

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.train.checkpoint import list_checkpoints, load_checkpoint, load_latest, manifest_path, save_checkpoint
from helpers import TINY_ARGS

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


def test_failed_write_keeps_previous_latest(tmp_path):
    _save(tmp_path, 1)
    with mock.patch("torch.save", side_effect=OSError(errno.ENOSPC, "No space left on device")):
        with pytest.raises(OSError):
            _save(tmp_path, 2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001.pt"]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
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


def test_train_stops_cleanly_when_a_checkpoint_cannot_be_written(tmp_path, run_cli):
    out = tmp_path / "run"
    real_save = torch.save
    calls = {"n": 0}

    def failing_second_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **kw)

    with mock.patch("torch.save", side_effect=failing_second_save):
        code, _, err = run_cli("train", *TINY_ARGS, "--steps", "6", "--checkpoint-every", "2", "--out", str(out))
    assert code == 1
    assert "checkpoint write at step 4 failed" in err and "No space left" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 4
    assert load_latest(out)["step"] == 2


def test_allow_no_checkpoint_keeps_training_and_logs_the_failure(tmp_path, run_cli):
    out = tmp_path / "run"
    real_save = torch.save
    calls = {"n": 0}

    def failing_second_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **kw)

    with mock.patch("torch.save", side_effect=failing_second_save):
        code, _, err = run_cli(
            "train", *TINY_ARGS, "--steps", "6", "--checkpoint-every", "2", "--allow-no-checkpoint", "--out", str(out)
        )
    assert code == 0 and "continuing" in err
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "checkpoint_failed"] == [4]
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert load_latest(out)["step"] == 6
