"""What FSDP2 and DDP really do with dtypes, recorded inside a 2-rank job (probe_fsdp.py) launched
with plain torchrun (c10d rendezvous on a free loopback port)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def probes(tmp_path_factory, launch):
    out = tmp_path_factory.mktemp("probe")
    proc = launch.torchrun(launch.HERE / "probe_fsdp.py", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_fsdp_bf16_mixed_computes_in_bf16_and_keeps_fp32_masters(probes):
    for rank in probes:
        p = rank["fsdp_bf16_reduce_fp32"]
        assert p["forward_weights"] == ["Parameter:torch.bfloat16"]  # gathered, unsharded, bf16 inside forward
        assert p["params"] == ["DTensor:torch.float32:S(0)"]  # sharded fp32 master weights
        assert p["grads"] == ["DTensor:torch.float32"]  # sharded fp32 gradients reach the optimizer
        assert p["optimizer_states"] == ["DTensor:torch.float32"]  # sharded fp32 Adam moments


@pytest.mark.slow
def test_fsdp_reduce_dtype_is_fp32_by_default_and_follows_the_setting(probes):
    for rank in probes:
        assert rank["fsdp_bf16_reduce_fp32"]["reduce_scatter"] == ["torch.float32"]
        assert rank["fsdp_bf16_reduce_bf16"]["reduce_scatter"] == ["torch.bfloat16"]
        assert rank["fsdp_bf16_reduce_bf16"]["grads"] == ["DTensor:torch.float32"]  # back in fp32 after the reduce


@pytest.mark.slow
def test_fp16_loss_scaling_skips_on_every_rank_when_one_shard_overflows(probes):
    # torch.amp.GradScaler on FSDP2's DTensor gradients all-reduces found_inf: rank 0's shards are
    # finite, yet it skips too, and both back off the scale (1024 -> 512) in step.
    for rank in probes:
        assert rank["fp16_scaler"] == {"stepped": False, "scale": 512.0, "params_unchanged": True}


@pytest.mark.slow
def test_ddp_all_reduces_once_per_step_under_gradient_accumulation(probes):
    for rank in probes:
        counts = rank["ddp_no_sync"]
        assert counts["accum1"] >= 1
        assert counts["accum2"] == counts["accum1"]  # no_sync on the first micro-batch: no extra all-reduce


@pytest.mark.slow
def test_ddp_reduce_dtype_bf16_all_reduces_in_bf16(probes):
    for rank in probes:
        assert rank["ddp_bf16_reduce"]["all_reduce"] == ["torch.bfloat16"]


@pytest.mark.slow
def test_fsdp_meta_build_gives_each_rank_its_slice_of_the_one_process_init(probes):
    for rank in probes:
        for case, dtype in (("fp32", "torch.float32"), ("bf16-true", "torch.bfloat16"), ("uneven", "torch.float32")):
            p = rank["fsdp_init"][case]
            assert p["names_match"] and p["all_equal"] and p["tied"], (case, p)
            assert p["dtypes"] == [dtype], case  # bf16-true shards are born bf16
            assert p["local_fraction"] <= 0.51, case  # a rank holds its half, never the full model
