"""ampkit.plan.render.report: the plan and kv tables, sentences and report pages, from real summaries."""

from __future__ import annotations

import pytest

from ampkit.plan.config import KvConfig, PlanConfig
from ampkit.plan.planner import build_kv, build_plan
from ampkit.plan.render.report import (
    gib,
    kv_budget_lines,
    kv_headers,
    kv_rows,
    ledger_headers,
    ledger_rows,
    recommendation_lines,
    write_kv_report,
    write_plan_report,
)
from ampkit.plan.setting import GIB


@pytest.fixture(scope="module")
def kv_summary():
    return build_kv(KvConfig(model="7b", gpu="A100-80GB", weight_dtype="bf16", kv_dtypes="bf16,fp8"))


@pytest.fixture(scope="module")
def plan_summary():
    return build_plan(
        PlanConfig(model="tiny", gpu="T4", precisions="fp32,bf16-mixed", activation_checkpointing="none", seq_len=128)
    )


def test_gib_formats_bytes_as_gib():
    assert gib(3 * GIB) == "3.00" and gib(1536 * GIB, 1) == "1,536.0" and gib(None) == "-"


def test_kv_rows_follow_the_budget(kv_summary):
    rows = kv_rows(kv_summary)
    assert [r[0] for r in rows] == ["bf16", "fp8"] and all(len(r) == len(kv_headers()) for r in rows)
    bf16, fp8 = kv_summary["kv"]
    assert rows[0][1] == f"{bf16['bytes_per_token']:,}" and bf16["bytes_per_token"] == 2 * fp8["bytes_per_token"]
    lines = kv_budget_lines(kv_summary)
    assert lines[0].startswith("A100-80GB: ") and lines[1].startswith("- weights (bf16): 12.")  # 6.7B x 2 bytes
    assert lines[-1] == f"= KV pool: {gib(kv_summary['budget']['pool_bytes'])} GiB"


def test_ledger_rows_show_each_configuration_and_its_fit(plan_summary):
    rows = plan_summary["rows"]
    headers, cells = ledger_headers(rows, True), ledger_rows(rows, True)
    assert len(cells) == 2 and all(len(c) == len(headers) for c in cells)
    assert [c[0] for c in cells] == ["fp32 adamw", "bf16-mixed adamw"]
    lines = recommendation_lines(plan_summary["recommendation"], plan_summary["target"])
    assert lines[0].startswith("Precision: ") and "GiB and fits in" in lines[1]


def test_reports_are_written_with_their_tables(tmp_path, plan_summary, kv_summary):
    html, md = write_plan_report(plan_summary, tmp_path)
    assert html.is_file() and md.is_file() and "data:image/png;base64" in html.read_text()
    kv_html, _ = write_kv_report(kv_summary, tmp_path)
    assert "requests at context" in kv_html.read_text()


def test_the_mixed_precision_note_needs_weight_copies_at_the_peak(plan_summary):
    """A -mixed row a few bytes over fp32 with no weight copies at its peak (a checkpointed step, where the
    loss scaler's tensors are the difference) gets no "keeps fp32 weights and adds copies" note."""
    import copy

    from ampkit.plan.render.report import mixed_precision_notes, primary

    fp32, mixed = (copy.deepcopy(r) for r in plan_summary["rows"][:2])
    assert mixed["setting"]["precision"] == "bf16-mixed" and fp32["setting"]["precision"] == "fp32"
    primary(mixed)["total_bytes"] = primary(fp32)["total_bytes"] + 12
    primary(mixed)["lines_at_peak_bytes"]["weight_copies"] = 0
    assert mixed_precision_notes([fp32, mixed]) == []
    primary(mixed)["lines_at_peak_bytes"]["weight_copies"] = GIB
    (note,) = mixed_precision_notes([fp32, mixed])
    assert note.startswith("Why mixed precision (bf16-mixed) needs more than fp32") and "(1.00 GiB)" in note
