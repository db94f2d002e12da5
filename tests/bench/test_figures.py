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
