"""A real bench of a precision with and without an fp32 island (`bf16-mixed@blocks.1.mlp`, the fix doctor
advises): both measured side by side on the same batches, the island's step-time cost in summary.json's
rules and on the console."""

from __future__ import annotations

import json

from ampkit.bench.schema import validate_summary
from ampkit.cli import main


def test_bench_measures_an_islands_cost_beside_its_plain_candidate(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "bench"
    argv = ["bench", "--precisions", "bf16-mixed,bf16-mixed@blocks.1.mlp", "--seq-len", "16", "--batch-size", "2"]
    code = main([*argv, "--steps", "2", "--warmup-steps", "1", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert validate_summary(summary) == []
    by_name = {e["name"]: e for e in summary["precisions"]}
    assert set(by_name) == {"fp32", "bf16-mixed", "bf16-mixed@blocks.1.mlp=fp32"}
    assert all(e["status"] == "ok" for e in by_name.values())
    (rule,) = [r for r in summary["recommendation"]["rules"] if r["rule"] == "island-cost"]
    base_ms = by_name["bf16-mixed"]["timing"]["step_ms_median"]
    island_ms = by_name["bf16-mixed@blocks.1.mlp=fp32"]["timing"]["step_ms_median"]
    assert rule["evidence"]["base"] == "bf16-mixed"
    assert abs(rule["evidence"]["cost"] - (island_ms / base_ms - 1)) < 1e-9
    assert "the island blocks.1.mlp=fp32 costs" in stdout
