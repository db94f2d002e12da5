"""`ampkit plan --lora` (`ampkit.plan.lora.plan`): the trainable-parameter count and its share, as peft's
`print_trainable_parameters` prints them, on the console (80 and 120 columns) and in summary.json, and the
same counts as a real peft-adapted model's."""

from __future__ import annotations

import json

import pytest

from ampkit.lora import LoraSettings
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.lora.plan import build_lora_plan


def _plan(run_cli, out, *argv: str) -> tuple[str, dict]:
    code, stdout, err = run_cli(
        "plan", *argv, "--precisions", "bf16-mixed", "--checkpointing", "none", "--out", str(out)
    )
    assert code == 0, err
    return stdout, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("columns", [80, 120])
def test_plan_lora_prints_peft_s_trainable_line(run_cli, tmp_path, monkeypatch, columns):
    """Llama-2-7B, rank 8 on q_proj and v_proj: peft's own figures, to the digit."""
    monkeypatch.setenv("COLUMNS", str(columns))
    out = tmp_path / "p"
    stdout, summary = _plan(run_cli, out, "--model", "7b", "--lora", "8", "--lora-targets", "q_proj,v_proj")
    line = "trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622"
    assert line in stdout.splitlines()  # one line, unwrapped, at 80 columns too
    shown = [row for row in stdout.splitlines() if not row.startswith("run directory:")]  # a path, never wrapped
    assert all(len(row) <= columns for row in shown), stdout
    counts = summary["trainable"]
    assert counts["trainable_parameters"] == 4_194_304 and counts["total_parameters"] == 6_742_609_920
    assert counts["trainable_percent"] == pytest.approx(0.0622, abs=5e-5)
    assert line in (out / "report.md").read_text()


def test_a_line_too_long_for_80_columns_breaks_before_the_share(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    stdout, _summary = _plan(run_cli, tmp_path / "p", "--model", "70b", "--lora", "16")
    lines = stdout.splitlines()
    head = "trainable params: 207,093,760 || all params: 69,183,741,952 ||"
    assert lines[lines.index(head) + 1] == "trainable%: 0.2993"
    from ampkit.plan.lora.plan import trainable_notes

    assert trainable_notes({}) == []  # a plan written before the count: nothing to print


@pytest.mark.parametrize("targets", ["", "q_proj,v_proj"])
def test_the_count_is_a_real_adapted_models(targets):
    """The planner's count against peft's adapters on the tiny model (its tied head counted once)."""
    pytest.importorskip("peft")
    from ampkit.lora.apply import apply_lora
    from ampkit.models import build_model, get_preset

    settings = LoraSettings(lora=4, lora_targets=targets)
    plan = build_lora_plan(PlanConfig(model="tiny", lora=settings, precisions="fp32"), desc=describe_model("tiny"))
    counts = plan["trainable"]
    info = apply_lora(build_model(get_preset("tiny"), seed=0), settings, precision="fp32", seed=0)
    assert (counts["trainable_parameters"], counts["total_parameters"]) == (info.trainable, info.total)
