"""The block-scaled formats through the commands: exact resume (a checkpoint round trip of a converted
model), the conversion in the run summary, and `ampkit plan` on models some formats refuse."""

from __future__ import annotations

import json

import pytest

from ampkit.runs import read_metrics
from helpers import TINY_ARGS

pytest.importorskip("torchao")


def _train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["mxfp8-emulated", "nvfp4-emulated"])
def test_resume_of_a_converted_model_is_bitwise_exact(tmp_path, run_cli, precision):
    # 6 steps straight == 3, stop, resume, 3 more: the converted Linears hold the checkpoint's weights under
    # their own names and their scales are recomputed from each tensor, so nothing else must survive
    common = [*TINY_ARGS, "--precision", precision, "--checkpoint-every", "3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    code, out, err = run_cli("train", *common, "--steps", "6", "--out", str(straight), "--json")
    assert code == 0, err
    assert run_cli("train", *common, "--steps", "6", "--stop-after", "3", "--out", str(split))[0] == 0
    code, _, err = run_cli("train", "--resume", str(split))
    assert code == 0, err
    a, b = _train_records(straight), _train_records(split)
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [(r["loss"], r["grad_norm"], r["lr"]) for r in a] == [(r["loss"], r["grad_norm"], r["lr"]) for r in b]
    conversion = json.loads(out)["throughput"]["conversion"]
    assert conversion["precision"] == precision and conversion["emulated"] is True
    assert conversion["kept"] == {"lm_head": "the output head"} and len(conversion["converted"]) == 4 * 7


def test_plan_reports_the_precisions_a_model_allows_and_names_the_refused(tmp_path, run_cli):
    from hf_archs import save_tiny

    folder = save_tiny(tmp_path / "gpt2", "gpt2")  # Conv1D blocks: the head is its only nn.Linear
    args = ["plan", "--model", f"hf:{folder}", "--checkpointing", "none", "--out", str(tmp_path / "runs")]
    code, out, err = run_cli(*args, "--precisions", "fp32,bf16-mixed,fp8,mxfp8,nvfp4", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert [r["setting"]["precision"] for r in plan["rows"]] == ["fp32", "bf16-mixed"]
    assert set(plan["refused"]) == {"fp8", "mxfp8", "nvfp4"}
    assert plan["refused"]["mxfp8"].startswith("mxfp8 has nothing to convert in this model: its only nn.Linear")
    code, out, err = run_cli(*args, "--precisions", "mxfp8")  # nothing left to plan: the refusal, one line
    assert code == 2 and "mxfp8 has nothing to convert" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_plan_of_falcon_traces_every_precision(tmp_path, run_cli):
    """`ampkit plan` on a tiny Falcon (new_decoder_architecture) ended in the fp8 trace's traceback."""
    from hf_archs import save_tiny

    folder = save_tiny(tmp_path / "falcon", "falcon")
    precisions = "fp32,bf16-mixed,fp8,mxfp8,mxfp4"
    code, out, err = run_cli(
        "plan", "--model", f"hf:{folder}", "--checkpointing", "none", "--precisions", precisions, "--json",
        "--out", str(tmp_path / "runs"),
    )  # fmt: skip
    assert code == 0, err
    plan = json.loads(out)
    assert [r["setting"]["precision"] for r in plan["rows"]] == precisions.split(",") and not plan["refused"]
    assert all(r["traced"]["total_bytes"] > 0 for r in plan["rows"])


@pytest.mark.slow
def test_bench_measures_the_emulated_formats_fidelity_on_the_cpu(tmp_path, run_cli):
    """The issue's bar at a smaller shape: fp32 beside the emulated MXFP8 and NVFP4, fidelity for each."""
    code, out, err = run_cli(
        "bench", "--model", "tiny", "--precisions", "fp32,mxfp8-emulated,nvfp4-emulated", "--seq-len", "32",
        "--batch-size", "2", "--steps", "2", "--warmup-steps", "1", "--out", str(tmp_path / "bench"), "--json",
    )  # fmt: skip
    assert code == 0, err
    entries = {p["name"]: p for p in json.loads(out)["precisions"]}
    for name in ("mxfp8-emulated", "nvfp4-emulated"):
        entry = entries[name]
        assert entry["status"] == "ok" and not entry["native"] and "its fidelity, not its speed" in entry["native_note"]
        assert 0.9 < entry["fidelity"]["logits_cosine"] < 1.0  # rounded, and measurably so
        assert entry["conversion"]["kept"] == {"lm_head": "the output head"}
    # 4-bit elements lose more than 8-bit ones (NVIDIA keeps ~15% of NVFP4's Linears in bf16 for this)
    assert (
        entries["nvfp4-emulated"]["fidelity"]["logits_cosine"] < entries["mxfp8-emulated"]["fidelity"]["logits_cosine"]
    )


@pytest.mark.slow
def test_doctor_diagnoses_an_emulated_format(tmp_path, run_cli):
    code, out, err = run_cli(
        "doctor", "--model", "tiny", "--precision", "nvfp4-emulated", "--steps", "2", "--seq-len", "32",
        "--batch-size", "2", "--no-smoke", "--out", str(tmp_path / "doctor"), "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    assert summary["run"]["error"] is None and len(summary["run"]["losses"]) == 2
    assert 0.9 < summary["fidelity"]["logits_cosine"] < 1.0
