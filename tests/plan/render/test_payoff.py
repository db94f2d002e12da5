"""`ampkit plan --formats`: the console at 80 columns, the report section, the summary's kind, and bad input."""

from __future__ import annotations

import json

import pytest
import torch

from ampkit.cli import main
from ampkit.hardware import GPUS
from ampkit.plan.render.payoff import best_format, payoff_tables
from ampkit.summaries import find_kind

PLAN = ["plan", "--model", "7b", "--precisions", "bf16-mixed", "--checkpointing", "none", "--batch-size", "4"]


def _run(capsys, monkeypatch, tmp_path, *extra: str) -> tuple[str, dict]:
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*PLAN, *extra, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    return out, json.loads((tmp_path / "run" / "summary.json").read_text())


def test_one_gpu_prints_a_row_per_format_within_80_columns(capsys, monkeypatch, tmp_path):
    out, summary = _run(capsys, monkeypatch, tmp_path, "--formats", "all,fp8:rowwise", "--gpu", "B200")
    assert find_kind("plan").validate(summary) == []
    assert max(len(line) for line in out.splitlines() if not line.startswith("run directory")) <= 80
    table = out[out.index("Payoff over bf16") :]
    for label in ("fp32", "tf32", "fp16", "fp8", "mxfp8", "mxfp4", "nvfp4", "fp8:rowwise"):
        assert f"\n{label} " in table
    joined = " ".join(table.split())
    share = summary["formats"]["gpus"][0]["gemm_share"]
    assert f"B200: the Linears are {share:.0%} of the bf16 step; however fast they get" in joined
    gpu = summary["formats"]["gpus"][0]
    best = best_format(gpu)
    assert best is not None and best["label"] in ("fp8", "mxfp8", "nvfp4")  # torchao trains in it
    assert f"fastest with a torchao training recipe on B200: {best['label']}" in joined
    html = (tmp_path / "run" / "report.html").read_text()
    assert "Payoff predictor: numeric formats over bf16" in html and "<pre><code># fp8: convert only" in html


def test_every_gpu_of_the_table_in_a_grid_and_the_report_renders_again_byte_for_byte(capsys, monkeypatch, tmp_path):
    out, summary = _run(capsys, monkeypatch, tmp_path, "--formats", "fp8,nvfp4")
    block = summary["formats"]
    assert len(block["gpus"]) + len(block["skipped_gpus"]) == len(GPUS)  # every row of the table, once
    assert max(len(line) for line in out.splitlines() if not line.startswith("run directory")) <= 80
    grid = out[out.index("predicted step speedup") :]
    h100 = next(line for line in grid.splitlines() if line.startswith("H100-80GB"))
    assert h100.split()[1].replace(".", "").isdigit() and h100.split()[2] == "-"  # fp8 predicted, nvfp4 not
    assert "not compared (no bf16 matrix units): V100-16GB, V100-32GB, T4" in out
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in run.glob("report*")}
    assert main(["report", str(run)]) == 0
    assert {p.name: p.read_bytes() for p in run.glob("report*")} == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on a machine without CUDA")
def test_measure_on_a_cpu_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    out, summary = _run(capsys, monkeypatch, tmp_path, "--formats", "fp8", "--gpu", "H100-80GB", "--measure")
    (line,) = [line for line in out.splitlines() if line.startswith("--measure")]
    assert line.startswith("--measure: skipped: --measure times GEMMs on an NVIDIA GPU; this is ")
    assert summary["formats"]["measured"]["skipped"] and "planned on this host" in summary["provenance"]["device"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--formats", "nf4"], "nf4 has no matmul peak in the GPU table"),
        (["--formats", "fp7"], "unknown numeric format 'fp7' for --formats"),
        (["--measure"], "--measure times the GEMMs of --formats' formats; give --formats too"),
        (["--formats", "fp8", "--lora", "8"], "--formats prices a language model's Linears"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, extra, message):
    assert main([*PLAN, *extra, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_conv1d_model_says_there_is_nothing_to_predict():
    block = {"note": "gpt2 blocks hold no Linear a converter swaps (Conv1D): nothing to predict"}
    assert payoff_tables(block, "gpt2") == [f"formats: {block['note']}"]
