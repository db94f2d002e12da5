"""`ampkit plan` and `ampkit kv` end to end through `ampkit.cli.main`."""

from __future__ import annotations

import json

import pytest

from ampkit.cli import main


def run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def test_plan_traced_tiny_writes_summary_and_report(tmp_path, capsys):
    out = tmp_path / "run"
    summary = run_json(
        capsys,
        [
            "plan",
            "--model",
            "tiny",
            "--gpu",
            "A100-80GB",
            "--precisions",
            "fp32,bf16-mixed,fp8",
            "--micro-batch",
            "2",
            "--seq-len",
            "64",
            "--trace",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert summary["schema"] == "ampkit.plan/1"
    assert json.loads((out / "summary.json").read_text()) == summary
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "GiB" in html
    rows = {(r["setting"]["precision"], r["setting"]["checkpointing"]): r for r in summary["rows"]}
    assert len(rows) == 6
    for (precision, _), row in rows.items():
        if precision == "fp8":
            assert row["traced"] is None and row["trace_note"].startswith("analytic only")
        else:
            assert row["agreement"]["within"]
        assert row["fit"]["fits"] and row["fit"]["max_micro_batch"] > 2
    assert summary["recommendation"]["precision"] == "bf16-mixed"


def test_plan_console_tables_and_hf_config(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
        )
    )
    code = main(
        [
            "plan",
            "--model",
            str(config),
            "--gpu",
            "T4",
            "--precisions",
            "fp16-mixed,bf16-mixed",
            "--seq-len",
            "1024",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "124,439,808" in out and "GiB" in out and "fp16-mixed" in out
    assert "no bf16 tensor cores" in out  # T4: fp16 with loss scaling


def test_plan_and_kv_default_to_a_gpt2_models_positions(tmp_path, capsys):
    """No --seq-len: 2048 would exceed GPT-2's 1024 learned positions, so the default becomes 1024
    (likewise kv's --context-len); a preset without a positions limit keeps 2048."""
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
        )
    )
    for command, key in (("plan", "seq_len"), ("kv", "context_len")):
        code = main(
            [command, "--model", f"hf:{folder}", "--gpu", "A100-80GB", "--json", "--out", str(tmp_path / command)]
        )
        summary = json.loads(capsys.readouterr().out)
        assert code == 0 and summary["config"][key] == 1024
    if_plan = json.loads((tmp_path / "plan" / "summary.json").read_text())
    assert {row["setting"]["seq_len"] for row in if_plan["rows"]} == {1024}
    assert main(["plan", "--model", "tiny", "--json", "--out", str(tmp_path / "tiny")]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["seq_len"] == 2048


def test_kv_json(tmp_path, capsys):
    summary = run_json(capsys, ["kv", "--model", "7b", "--gpu", "H100-80GB", "--json", "--out", str(tmp_path / "kv")])
    by_dtype = {k["kv_dtype"]: k for k in summary["kv"]}
    assert by_dtype["fp16"]["token_capacity"] == 2 * by_dtype["fp32"]["token_capacity"]
    assert (tmp_path / "kv" / "report.html").is_file()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["plan", "--gpu", "Z100"], "known GPUs: V100-16GB"),
        (["plan", "--micro-batch", "0"], "--batch-size must be a positive integer"),
        (["plan", "--seq-len", "-1"], "--seq-len must be a positive integer"),
        (["plan", "--optimizers", "adam"], "unknown optimizer 'adam'"),
        (["plan", "--precisions", "fp64"], "unknown precision 'fp64'"),
        (["kv", "--gpu", "Z100"], "known GPUs"),
        (["kv", "--context-len", "-1"], "--context-len must be a positive integer"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, needle):
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_config_json_missing_fields_is_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mistral", "hidden_size": 64, "vocab_size": 10}))
    assert main(["plan", "--model", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "num_hidden_layers, num_attention_heads, intermediate_size" in err and len(err.splitlines()) == 1
