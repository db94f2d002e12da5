"""RNG state in checkpoints: the CPU generators always, each accelerator's under its device type's key,
and checkpoints written on a CUDA machine (the "cuda" key) still resume where there is no CUDA."""

from __future__ import annotations

import random

import torch

from ampkit.train.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint


def _draws() -> tuple[float, list[float]]:
    return random.random(), torch.rand(3).tolist()


def test_capture_and_restore_replay_the_same_draws():
    state = capture_rng_state()
    assert set(state) == {"python", "torch"}  # no accelerator on this machine: nothing else to keep
    expected = _draws()
    restore_rng_state(state)
    assert _draws() == expected


def test_a_checkpoint_from_an_accelerator_machine_resumes_here(tmp_path):
    """A CUDA run's checkpoint (the key checkpoints have always had) and an MPS/XPU run's load with
    weights_only and restore this machine's CPU generators; the other devices' states are kept aside."""
    state = capture_rng_state()
    expected = _draws()
    foreign = {
        **state,
        "cuda": [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)],  # two GPUs
        "mps": [torch.full((16,), 7, dtype=torch.uint8)],
    }
    path = save_checkpoint(tmp_path, 3, {"rng": foreign}, keep=1)
    loaded = load_checkpoint(path)["rng"]
    assert len(loaded["cuda"]) == 2 and torch.equal(loaded["mps"][0], foreign["mps"][0])
    restore_rng_state(loaded)
    assert _draws() == expected
