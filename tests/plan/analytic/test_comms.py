"""ampkit.plan.analytic.comms through `build_plan`: a data-parallel step's bytes equal docs/plan.md's formula
counted by hand here, and its time is those bytes with the ring factor over the link's each-way bandwidth."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ampkit.distributed.wrap import mixed_precision_policy
from ampkit.formats import dtype_of
from ampkit.hardware.links import LINKS
from ampkit.plan.analytic.comms import collectives_of, gather_dtype
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.planner import build_plan
from ampkit.plan.setting import StepSetting
from ampkit.precision import SPECS, get_spec
from ampkit.summaries.plan import PLAN

# Llama-2-7B's shape (the "7b" preset): vocabulary, width, layers, MLP width; q, k, v, o all d x d.
V, D, LAYERS, FF = 32000, 4096, 32, 11008
P_BLOCK = 4 * D * D + 3 * D * FF + 2 * D  # attention, SwiGLU, two RMSNorm gains
P_BLOCKS = LAYERS * P_BLOCK
P_ROOT = V * D + D + V * D  # embedding, final norm, untied head
P = P_BLOCKS + P_ROOT
REDUCE_BYTES = {"fp32": 4, "bf16": 2}


def _plan(**settings):
    base = {"model": "7b", "gpu": "H100-80GB", "activation_checkpointing": "none", "optimizer": "adamw"}
    return build_plan(PlanConfig(**{**base, **settings}))


def _fsdp_gather_bytes(precision: str) -> int:
    """Bytes per element FSDP2 gathers in: the policy ampkit's FSDP2 wrap really builds."""
    spec = get_spec(precision)
    policy = mixed_precision_policy(spec, reduce_dtype=torch.float32)
    return (policy.param_dtype or spec.param_dtype).itemsize


def _options(row) -> dict[str, dict]:
    return {o["reduce_dtype"]: o for o in row["communication"]["options"]}


def test_the_hand_count_is_llama_2_7b():
    assert P == 6_738_415_616  # Llama-2-7B's published parameter count


@pytest.fixture(scope="module")
def fsdp_7b():
    """Llama-2-7B, FSDP2 over 8 GPUs of one node, 2 micro-batches per optimizer step, over NVLink 4 by name."""
    return _plan(
        precisions="fp32,bf16-mixed,bf16-true,fp8",
        parallel="fsdp",
        nproc_per_node=8,
        grad_accum=2,
        link="nvlink4",
    )


def test_fsdp_bytes_are_the_formula(fsdp_7b):
    """gathers per step x parameters x bytes of the gather dtype + reduce-scatters per step x gradients x
    bytes of the reduce dtype: with reshard-after-forward a block is gathered in forward and again in
    backward (2 per micro-batch), the root once; a reduce-scatter per micro-batch."""
    k = 2
    assert PLAN.validate(fsdp_7b) == []
    for row in fsdp_7b["rows"]:
        gather = _fsdp_gather_bytes(row["setting"]["precision"])
        for reduce, option in _options(row).items():
            gathered = k * (2 * P_BLOCKS + P_ROOT) * gather
            reduced = k * P * REDUCE_BYTES[reduce]
            assert option["bytes_per_step"] == gathered + reduced
            by_kind = {c["kind"]: c["bytes"] for c in option["collectives"]}
            assert by_kind == {"all-gather": gathered, "reduce-scatter": reduced}
    bf16 = next(r for r in fsdp_7b["rows"] if r["setting"]["precision"] == "bf16-mixed")
    fp32 = next(r for r in fsdp_7b["rows"] if r["setting"]["precision"] == "fp32")
    assert _options(bf16)["fp32"]["bytes_per_step"] < _options(fp32)["fp32"]["bytes_per_step"]  # half the gathers


def test_fsdp_time_is_the_ring_bytes_over_the_named_link(fsdp_7b):
    bandwidth = LINKS["nvlink4"].each_way_gbs * 1e9  # 900 GB/s both ways -> 450e9 B/s each way
    assert bandwidth == 450e9
    for row in fsdp_7b["rows"]:
        comm = row["communication"]
        assert comm["link"]["name"] == "nvlink4" and comm["link"]["chosen"] == "--link"
        for option in comm["options"]:
            assert option["comm_s"] == pytest.approx(option["bytes_per_step"] * (8 - 1) / 8 / bandwidth)
            compute = row["compute"]["step_s_at_mfu"]
            assert option["compute_s"] == compute
            assert option["step_s_no_overlap"] == pytest.approx(compute + option["comm_s"])
            assert option["step_s_overlap"] == pytest.approx(max(compute, option["comm_s"]))
            assert option["bound"] == ("communication" if option["comm_s"] > compute else "compute")


def test_ddp_all_reduces_every_gradient_once_per_step_over_infiniband_across_nodes():
    summary = _plan(precisions="fp32,bf16-mixed", parallel="ddp", nnodes=2, nproc_per_node=8, grad_accum=4)
    bandwidth = 400e9 / 8  # InfiniBand NDR: 400 Gb/s per port, each way, one port per GPU
    for row in summary["rows"]:
        comm = row["communication"]
        assert comm["world_size"] == 16 and comm["link"]["name"] == "ib-ndr" and comm["link"]["chosen"] == "default"
        assert comm["gather_dtype"] is None
        for reduce, option in _options(row).items():
            assert option["bytes_per_step"] == P * REDUCE_BYTES[reduce]  # once per step: no_sync before the last
            assert [c["kind"] for c in option["collectives"]] == ["all-reduce"]
            assert option["comm_s"] == pytest.approx(P * REDUCE_BYTES[reduce] * 2 * (16 - 1) / 16 / bandwidth)


def test_a_single_process_plan_has_no_communication():
    summary = _plan(precisions="bf16-mixed")
    assert [row["communication"] for row in summary["rows"]] == [None]


def test_without_a_gpu_or_link_the_bytes_come_without_a_time():
    summary = _plan(gpu=None, precisions="bf16-mixed", parallel="fsdp", world_size=4, reduce_dtype="bf16")
    comm = summary["rows"][0]["communication"]
    assert comm["link"] is None and [o["reduce_dtype"] for o in comm["options"]] == ["bf16"]
    option = comm["options"][0]
    assert option["bytes_per_step"] == (2 * P_BLOCKS + P_ROOT) * 2 + P * 2
    assert option["comm_s"] is None and option["bound"] is None


@pytest.mark.parametrize("precision", list(SPECS))
def test_the_gather_dtype_is_the_one_fsdp2s_policy_gathers_in(precision):
    spec = get_spec(precision)
    policy = mixed_precision_policy(spec, reduce_dtype=torch.float32)  # what distributed/wrap.py shards with
    assert dtype_of(gather_dtype(precision)) == (policy.param_dtype or spec.param_dtype)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_formula_is_what_ampkits_fsdp2_and_ddp_steps_really_move(tmp_path):
    """2 CPU ranks (gloo) train the tiny preset 2 micro-batches per step (`probe_comms.py` records torch's
    collectives): every byte the plan counts is moved, and no other, for each precision and reduce dtype."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for inherited in ("RANK", "WORLD_SIZE"):  # never a torchrun identity of the suite's own
        env.pop(inherited, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    cmd += ["--rdzv-endpoint", f"localhost:{_free_port()}", "--max-restarts", "0"]
    proc = subprocess.run(
        [*cmd, str(Path(__file__).with_name("probe_comms.py")), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    desc = describe_model("tiny")
    for rank in (0, 1):
        measured = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for key, moved in measured.items():
            parallel, precision, reduce = key.split("/")
            setting = StepSetting(precision=precision, grad_accum=2, world_size=2, parallel=parallel, seq_len=32)
            gather = gather_dtype(precision) if parallel == "fsdp" else None
            planned = {c.kind: c.bytes for c in collectives_of(desc, setting, reduce_dtype=reduce, gather=gather)}
            assert {kind: n for kind, n in moved.items() if not kind.endswith("_calls")} == planned, key
            if parallel == "fsdp":  # 4 blocks gathered twice and the root once, per micro-batch
                assert moved["all-gather_calls"] == 2 * (2 * desc.n_layers + 1)
