"""ampkit.train.report: train's report.html from summary.json and metrics.jsonl alone."""

from __future__ import annotations

import json

from ampkit.train.report import config_rows, read_train_records, write_train_report


def _summary(**overrides) -> dict:
    summary = {
        "command": "train",
        "status": "ok",
        "error": None,
        "config": {"precision": "fp16-mixed", "steps": 3, "lora": {"lora": 0}},
        "unit": "tokens",
        "model": {"preset": "tiny"},
        "warnings": [],
        "steps": 3,
        "first_loss": 5.5,
        "final_loss": 4.0,
        "eval_loss_initial": 5.6,
        "eval_loss": 4.2,
        "eval_history": [{"step": 0, "eval_loss": 5.6}, {"step": 3, "eval_loss": 4.2}],
        "items_per_s": 1000.0,
        "step_ms_median": 12.5,
        "skipped_steps": 1,
        "final_loss_scale": 32768.0,
        "peak_memory": {"max_rss_bytes": 2**30},
        "wall_s": 1.0,
    }
    return summary | overrides


def _records(run_dir) -> None:
    lines = [{"event": "eval", "step": 0, "eval_loss": 5.6}]
    for step, scale in ((1, 65536.0), (2, 32768.0), (3, 32768.0)):
        lines.append(
            {
                "event": "train",
                "step": step,
                "loss": 6.0 - step * 0.5,
                "tokens_per_s": float("inf") if step == 1 else 1000.0,  # a zero-length first window
                "step_ms": 12.0,
                "grad_norm": float("nan") if step == 1 else 2.0,  # the skipped step
                "loss_scale": scale,
            }
        )
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"event": "tra'  # a torn last line
    (run_dir / "metrics.jsonl").write_text(text)


def test_the_report_draws_curves_from_the_metrics_and_lists_the_config(tmp_path):
    _records(tmp_path)
    assert len(read_train_records(tmp_path)) == 4  # the torn line is skipped
    html_path, md_path = write_train_report(_summary(), tmp_path)
    md = md_path.read_text()
    assert md.startswith("# ampkit train: fp16-mixed on tiny")
    assert "- command line: not recorded" in md  # a summary without provenance
    assert "| held-out loss (start -> end) | 5.6000 -> 4.2000 |" in md
    assert "| peak memory: max_rss (MiB, 1024^2 B) | 1,024 |" in md
    assert "| lora.lora | 0 |" in md and "## Loss scale and gradient norm" in md
    assert sorted(p.name for p in tmp_path.glob("report-fig*.png")) == [f"report-fig{i}.png" for i in (1, 2, 3)]
    assert "data:image/png;base64," in html_path.read_text()


def test_without_metrics_the_report_says_so(tmp_path):
    _, md_path = write_train_report(_summary(status="diverged", error="loss is nan at step 2"), tmp_path)
    md = md_path.read_text()
    assert "> The run ended diverged: loss is nan at step 2" in md
    assert "> metrics.jsonl is missing or empty: no curves to draw." in md
    assert not list(tmp_path.glob("*.png"))


def test_config_rows_flatten_sections_and_show_values_as_json():
    assert config_rows({"a": None, "b": "x", "s": {"c": 1.5}}) == [["a", "null"], ["b", '"x"'], ["s.c", "1.5"]]


def test_trained_and_processed_rates_stand_side_by_side(tmp_path):
    from ampkit.train.report import throughput_figure

    _records(tmp_path)
    records = read_train_records(tmp_path)
    _, md_path = write_train_report(_summary(processed_per_s=2500.0), tmp_path)
    md = md_path.read_text()
    assert "| trained tokens/s (after warmup) | 1,000 |" in md
    assert "| processed tokens/s (masked ones too; MFU's count) | 2,500 |" in md
    assert (
        "| processed tokens/s (masked ones too; MFU's count) | 1,000 |"
        in write_train_report(
            _summary(),
            tmp_path,  # a summary before the token account: nothing was masked
        )[1].read_text()
    )
    left = throughput_figure(records, "tokens").axes[0]
    assert [line.get_label() for line in left.get_lines()] == ["trained tokens/s"]  # text: one curve
    for r in records:
        if r.get("event") == "train":
            r["processed_tokens_per_s"] = 2.5 * r["tokens_per_s"]  # masked prompts read
    left = throughput_figure(records, "tokens").axes[0]
    assert [line.get_label() for line in left.get_lines()] == ["processed tokens/s (masked too)", "trained tokens/s"]


def test_a_data_parallel_run_lists_each_ranks_step_time_and_straggler_score(tmp_path):
    ranks = [
        {"rank": 0, "windows": 14, "step_ms_median": 12.5, "step_ms_p90": 14.0, "straggler": 1.0},
        {"rank": 1, "windows": 14, "step_ms_median": 15.0, "step_ms_p90": 19.25, "straggler": 1.2},
    ]
    md = write_train_report(_summary(ranks=ranks), tmp_path)[1].read_text()
    assert "## Ranks" in md and "gathered once at the end of the run" in md
    assert "| 1 | 15.0 | 19.2 | 1.20 | 14 |" in md
    assert "## Ranks" not in write_train_report(_summary(), tmp_path)[1].read_text()  # one process: no table
