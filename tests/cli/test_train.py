"""ampkit.cli.train: `--print-config`, `--stop-after` and `--resume` checks of `ampkit train`."""

from __future__ import annotations

import pytest
import tomllib

import ampkit.cli.train as train_cli
from ampkit.errors import UsageError


def test_print_config_prints_toml_that_holds_the_flags_and_exits(parse, tmp_path, capsys):
    out = tmp_path / "run"
    args = parse(train_cli, "train", "--precision", "bf16-mixed", "--print-config", "--out", str(out))
    assert train_cli.run(args) == 0
    config = tomllib.loads(capsys.readouterr().out)
    assert config["precision"] == "bf16-mixed"
    assert not out.exists()  # nothing trained, nothing written


def test_negative_stop_after_is_refused(parse):
    with pytest.raises(UsageError, match="--stop-after must be >= 0"):
        train_cli.run(parse(train_cli, "train", "--stop-after", "-1"))


def test_resume_needs_a_train_run_directory(parse, tmp_path):
    with pytest.raises(UsageError, match="is not an ampkit train run"):
        train_cli.run(parse(train_cli, "train", "--resume", str(tmp_path)))


def test_held_out_losses_print_as_a_pair():
    assert train_cli._fmt_pair(5.5, None) == "5.5000 -> -"


def test_resume_of_a_missing_directory_says_it_does_not_exist(tmp_path):
    from ampkit.train.config import resume_config

    with pytest.raises(UsageError, match=r"--resume .*nope does not exist; pass the directory of an earlier"):
        resume_config(tmp_path / "nope", {})


def test_train_help_lists_the_model_presets(capsys):
    from ampkit.cli import main
    from ampkit.models.presets import PRESETS

    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert f"model preset ({', '.join(PRESETS)})" in text


def test_the_progress_rate_and_the_summary_rate_say_which_is_which():
    from ampkit.train.loop import _status_text

    record = {"loss": 2.0, "tokens_per_s": 1234.0, "processed_tokens_per_s": 1234.0, "loss_scale": None}
    assert _status_text(record, "tokens") == "loss 2.000 · 1,234 tokens/s (last window)"
    masked = {**record, "processed_tokens_per_s": 3000.0}  # prompts read, not trained
    assert _status_text(masked, "tokens") == "loss 2.000 · 1,234 tokens/s (last window) · 3,000 processed/s"


def test_the_summary_table_names_its_rate():
    import io

    from rich.console import Console

    summary = {
        "config": {"precision": "fp32"},
        "model": {"preset": "tiny"},
        "steps": 5,
        "first_loss": 5.0,
        "final_loss": 4.0,
        "eval_loss_initial": None,
        "eval_loss": None,
        "unit": "tokens",
        "items_per_s": 1000.0,
        "step_ms_median": 10.0,
        "skipped_steps": 0,
        "final_loss_scale": None,
    }
    buf = io.StringIO()
    train_cli._print_summary(Console(file=buf, width=200), summary, "runs/x")
    assert "tokens/s (measured steps, stalls excluded)" in buf.getvalue()


def test_train_keep_fp32_runs_and_its_summary_records_the_override(tmp_path, capsys):
    import json

    from ampkit.cli import main

    out = tmp_path / "run"
    argv = ["train", "--precision", "bf16-mixed", "--keep-fp32", "blocks.*.mlp,norm", "--steps", "2"]
    assert main([*argv, "--seq-len", "16", "--batch-size", "2", "--eval-batches", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["config"]["keep_fp32"] == "blocks.*.mlp,norm"
    recorded = summary["throughput"]["module_precision"]
    assert recorded["overrides"] == "blocks.*.mlp=fp32,norm=fp32"
    modules = recorded["modules"]
    assert modules["norm"] == "fp32" and {k for k in modules if k != "norm"} == {
        f"blocks.{i}.mlp" for i in range(len(modules) - 1)
    }
    assert "module precision: fp32: blocks.0.mlp, blocks.1.mlp" in printed  # the console says what was kept


@pytest.mark.parametrize(
    ("flags", "word"),
    [
        (["--keep-fp32", "blocks.*.nope"], "module pattern 'blocks.*.nope' matches no module"),
        (["--keep-fp32", "vision"], "module pattern 'vision' matches no module"),
        (["--module-precision", "blocks.0=bf16"], "not a module regime"),
    ],
)
def test_a_bad_module_pattern_is_one_line_and_exit_2(tmp_path, capsys, flags, word):
    from ampkit.cli import main

    argv = ["train", *flags, "--steps", "1", "--seq-len", "16", "--batch-size", "2", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_module_overrides_with_lora_are_refused_in_one_line():
    from ampkit.bench.config import BenchConfig
    from ampkit.lora import LoraSettings
    from ampkit.plan.config import PlanConfig
    from ampkit.train.config import TrainConfig

    with pytest.raises(UsageError, match="do not combine with --lora yet"):
        TrainConfig.of(keep_fp32="blocks.0", lora=8)
    with pytest.raises(UsageError, match="do not combine with --lora yet"):
        BenchConfig.of(precisions="bf16-mixed@blocks.0", lora=8)
    with pytest.raises(UsageError, match="not with --lora yet"):
        PlanConfig(model="tiny", keep_fp32="blocks.0", lora=LoraSettings(lora=8))
