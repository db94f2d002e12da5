"""`ampkit plan` and `ampkit kv` for VLMs (`ampkit.plan.vlm`): the rows with their parts, compute over
text and image tokens, the largest micro-batch and sequence, mllama's cross-attention cache, the
console tables at 80 columns, and the bad inputs refused in one line."""

from __future__ import annotations

import json

import pytest

from ampkit.plan.config import KvConfig, PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.planner import build_kv, build_plan
from ampkit.plan.setting import GIB, StepSetting
from ampkit.plan.vlm.compute import forward_flops, step_flops, training_factor
from ampkit.plan.vlm.engine import VLMEngine, largest_fitting
from ampkit.plan.vlm.planner import build_vlm_plan
from ampkit.plan.vlm.render import parts_table, vlm_model_table
from ampkit.plan.vlm.workload import build_workload
from ampkit.summaries import BY_NAME
from vlm_fixtures import write_real_size

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-vlm")
    return lambda name: f"hf:{write_real_size(root / name, name)}"


def test_plan_rows_carry_parts_images_and_compute(real):
    spec = real("LLaVA-1.5-7B")
    summary = build_plan(
        PlanConfig(model=spec, gpu="H100-SXM", precisions="bf16-mixed", activation_checkpointing="none")
    )
    assert not [e for e in BY_NAME["plan"].validate(summary) if "provenance" not in e]
    work = summary["workload"]
    assert work["image_tokens_per_sample"] == 576 and work["image"]["encoder_tokens"] == 577
    row = summary["rows"][0]
    parts = {p["part"]: p for p in row["parts"]}
    assert set(parts) == {"vision", "projector", "language"} and all(p["trained"] for p in parts.values())
    assert row["compute"]["image_tokens_per_step"] == 576 and row["compute"]["text_tokens_per_step"] == 2048 - 576
    assert sum(row["compute"]["flops_by_part"].values()) == pytest.approx(row["compute"]["flops_per_step"])
    fit = row["fit"]
    engine = VLMEngine(
        describe_model(spec), build_workload(describe_model(spec), images=1, image_size="", freeze="", seq_len=2048)
    )
    setting = StepSetting(**{k: v for k, v in row["setting"].items() if k in StepSetting.__dataclass_fields__})
    capacity = summary["target"]["capacity_bytes"]
    if fit["max_micro_batch"]:
        assert (
            engine.ledger(setting.__class__(**{**setting.to_dict(), "micro_batch": fit["max_micro_batch"]})).total
            <= capacity
        )
    assert (
        engine.ledger(setting.__class__(**{**setting.to_dict(), "micro_batch": fit["max_micro_batch"] + 1})).total
        > capacity
    )


def test_frozen_parts_cost_less_compute_and_memory(real):
    desc = describe_model(real("Llama-3.2-11B-Vision"))
    every = build_workload(desc, images=1, image_size="", freeze="", seq_len=2048)
    decoder = build_workload(desc, images=1, image_size="", freeze="language", seq_len=2048)
    tower = build_workload(desc, images=1, image_size="", freeze="vision", seq_len=2048)
    assert training_factor(decoder, "language") == 2.0  # its input gradient still runs
    assert training_factor(tower, "vision") == 1.0  # nothing before it trains: forward only
    fwd = forward_flops(desc, every, seq_len=2048)
    assert step_flops(desc, tower, seq_len=2048, samples=1)["vision"] == pytest.approx(fwd["vision"])
    setting = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=2048)
    totals = [VLMEngine(desc, w).ledger(setting).total for w in (every, decoder, tower)]
    assert totals[1] < totals[0] and totals[2] < totals[0]


def test_qwen_images_take_tokens_by_pixels(real):
    spec = real("Qwen2-VL-7B")
    summary = build_plan(PlanConfig(model=spec, images_per_sample=2, image_size="1120x840", precisions="bf16-true"))
    work = summary["workload"]
    assert work["image"]["tokens"] == (1120 // 28) * (840 // 28) == 1200
    assert work["image_tokens_per_sample"] == 2400 and summary["config"]["seq_len"] == 2400 + 256


def test_kv_counts_mllamas_cross_attention_cache(real):
    spec = real("Llama-3.2-11B-Vision")
    text = build_kv(KvConfig(model=spec, images_per_sample=0, kv_dtypes="bf16", context_len=4096))
    image = build_kv(KvConfig(model=spec, images_per_sample=1, kv_dtypes="bf16", context_len=4096))
    assert text["kv"][0]["bytes_per_token"] == 2 * 32 * 8 * 128 * 2  # the 32 self-attention layers only
    cross = image["kv"][0]["cross_attention_bytes_per_request"]
    assert cross == 2 * 8 * 8 * 128 * 2 * 4 * 1601  # 8 fusion layers over 4 tiles of 1601 states
    assert image["kv"][0]["max_requests"] < text["kv"][0]["max_requests"]


def test_the_11b_plan_prints_at_80_columns(real, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(
        "plan",
        "--model",
        real("Llama-3.2-11B-Vision"),
        "--gpu",
        "H100-SXM",
        "--precisions",
        "bf16-mixed,bf16-true",
        "--freeze",
        "language",
        "--out",
        str(tmp_path / "p"),
    )
    assert code == 0, err
    assert [line for line in out.splitlines() if len(line) > 80 and not line.startswith("run directory:")] == []
    assert "10,670,220,835" in out and "fusion (cross-attention) layers" in out and "frozen: language" in out
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["workload"]["frozen"] == ["language"]
    assert (tmp_path / "p" / "report.html").is_file()
    vlm_model_table(summary), parts_table(summary)  # the tables render from the stored summary


def test_largest_fitting_is_the_boundary():
    assert largest_fitting(lambda x: x <= 37, low=1, limit=1000) == 37
    assert largest_fitting(lambda x: x <= 5000, low=1, limit=1000) == 1000
    assert largest_fitting(lambda x: False, low=3, limit=10) == 2


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--image-size", "448"], "takes 336x336 images only"),
        (["--images-per-sample", "8"], "exceed the language model's 4096 positions"),
        (["--freeze", "decoder"], "not a part name"),
        (["--freeze", "vision,projector,language"], "leaves nothing to train"),
        (["--seq-len", "500"], "take 576 of the sequence's tokens"),
    ],
)
def test_bad_vlm_plans_are_one_line(real, run_cli, tmp_path, flags, said):
    code, _, err = run_cli("plan", "--model", real("LLaVA-1.5-7B"), *flags, "--out", str(tmp_path / "p"))
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1


def test_image_flags_on_a_causal_lm_plan_are_one_line(run_cli, tmp_path):
    code, _, err = run_cli("plan", "--model", "tiny", "--freeze", "vision", "--out", str(tmp_path / "p"))
    assert code == 2 and "plans an hf: image-text model" in err


def test_build_vlm_plan_is_what_build_plan_gives(real):
    spec = real("PaliGemma-3B-224")
    config = PlanConfig(model=spec, precisions="bf16-true", activation_checkpointing="full", gpu_mem="24GiB")
    summary = build_vlm_plan(config, describe_model(spec))
    assert summary["rows"][0]["ledger"]["total_bytes"] == build_plan(config)["rows"][0]["ledger"]["total_bytes"]
    assert summary["rows"][0]["ledger"]["total_bytes"] < 24 * GIB
