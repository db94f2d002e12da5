"""ampkit.bench.figures: the bench report's plots, each labelled in the task's unit and against fp32."""

from __future__ import annotations

import json

from ampkit.bench.figures import fidelity_figure, loss_figure, profile_figure, step_time_figure, throughput_figure
from ampkit.report import plt


def test_each_figure_draws_every_precision_that_ran(real_runs):
    summary = json.loads((real_runs["bench"].run_dir / "summary.json").read_text())
    ran = [e["name"] for e in summary["precisions"] if e["status"] == "ok"]
    assert ran == ["fp32", "bf16-mixed"]
    throughput, memory = throughput_figure(summary).axes
    assert throughput.get_title() == f"{summary['unit']}/s (higher is better)"
    assert [t.get_text() for t in throughput.get_xticklabels()] == ran and memory.get_ylabel()
    loss = loss_figure(summary).axes[0]
    assert [line.get_label() for line in loss.get_lines() if not line.get_label().startswith("_")] == ran
    assert step_time_figure(summary).axes and fidelity_figure(summary).axes
    if any(e.get("profile") for e in summary["precisions"]):
        assert profile_figure(summary).axes
    plt.close("all")


def test_processed_items_are_drawn_behind_the_trained_ones_where_they_differ(real_runs):
    summary = json.loads((real_runs["bench"].run_dir / "summary.json").read_text())
    ok = [e for e in summary["precisions"] if e["status"] == "ok"]
    assert not throughput_figure(summary).axes[0].get_legend()  # text data: one rate, one bar each
    for entry in ok:
        entry["timing"]["processed_per_s"] = 3 * entry["timing"]["items_per_s"]  # masked prompts read
    throughput = throughput_figure(summary).axes[0]
    assert [t.get_text() for t in throughput.get_legend().get_texts()] == ["processed", "trained"]
    heights = sorted(round(p.get_height(), 6) for p in throughput.patches)
    trained = [e["timing"]["items_per_s"] for e in ok]
    assert heights == sorted(round(h, 6) for h in trained + [3 * t for t in trained])
    plt.close("all")
